package handshake

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// keyFileMode is the only access a private key file may grant: its owner
// reads and writes it.
const keyFileMode fs.FileMode = 0o600

// maxKeyFileSize bounds what LoadPrivateKeyFile reads; a key file is 45 bytes.
const maxKeyFileSize = 1024

// LoadPrivateKeyFile reads a private key written by WritePrivateKeyFile (or
// by hand): base64, optionally followed by a newline. It refuses a file that
// grants any access to group or others, since the key is the CPE's or
// headend's identity.
func LoadPrivateKeyFile(path string) (PrivateKey, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return PrivateKey{}, fmt.Errorf("private key file %s does not exist: generate a key first, or fix the path in the configuration", path)
	}
	if err != nil {
		return PrivateKey{}, fmt.Errorf("opening private key file: %w", err)
	}
	defer f.Close()

	// Stat the open file, not the path, so the checked file is the read one.
	info, err := f.Stat()
	if err != nil {
		return PrivateKey{}, fmt.Errorf("checking private key file: %w", err)
	}
	if !info.Mode().IsRegular() {
		return PrivateKey{}, fmt.Errorf("private key file %s is not a regular file (%s); point the configuration at the key file itself", path, info.Mode().Type())
	}
	if perm := info.Mode().Perm(); perm&^keyFileMode != 0 {
		return PrivateKey{}, fmt.Errorf("private key file %s has mode %04o, which lets group or others access it; run: chmod 600 %s (and consider the key exposed if others could read it)", path, perm, path)
	}

	content, err := io.ReadAll(io.LimitReader(f, maxKeyFileSize+1))
	if err != nil {
		return PrivateKey{}, fmt.Errorf("reading private key file: %w", err)
	}
	if len(content) > maxKeyFileSize {
		return PrivateKey{}, fmt.Errorf("private key file %s is larger than %d bytes; it should hold one base64 key and a newline", path, maxKeyFileSize)
	}
	key, err := ParsePrivateKey(strings.TrimSpace(string(content)))
	if err != nil {
		return PrivateKey{}, fmt.Errorf("private key file %s: %w", path, err)
	}
	return key, nil
}

// WritePrivateKeyFile stores key at path as base64 and a newline, creating
// the file with mode 0600. It never overwrites an existing file: replacing a
// key changes the peer's identity, which should be a deliberate act.
func WritePrivateKeyFile(path string, key PrivateKey) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, keyFileMode)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("private key file %s already exists; refusing to overwrite it (move it away first if you really want a new identity)", path)
	}
	if err != nil {
		return fmt.Errorf("creating private key file: %w", err)
	}
	_, err = f.WriteString(key.Base64() + "\n")
	if err == nil {
		err = f.Sync()
	}
	if closeErr := f.Close(); err == nil {
		err = closeErr
	}
	if err != nil {
		// Leave no half-written key behind to be loaded later.
		os.Remove(path)
		return fmt.Errorf("writing private key file %s: %w", path, err)
	}
	return nil
}
