package handshake

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestKeyFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	key := mustGenerate(t)
	if err := WritePrivateKeyFile(path, key); err != nil {
		t.Fatal(err)
	}
	info, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := info.Mode().Perm(); perm != 0o600 {
		t.Fatalf("key file mode %04o, want 0600", perm)
	}
	got, err := LoadPrivateKeyFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != key {
		t.Fatal("loaded key differs from the written one")
	}
}

func TestWritePrivateKeyFileRefusesOverwrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte("keep me\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := WritePrivateKeyFile(path, mustGenerate(t))
	if err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("error = %v; want a refusal to overwrite", err)
	}
	if content, _ := os.ReadFile(path); string(content) != "keep me\n" {
		t.Fatalf("existing file changed to %q", content)
	}
}

func TestLoadPrivateKeyFileAcceptsHandWrittenForms(t *testing.T) {
	key := mustGenerate(t)
	for name, content := range map[string]string{
		"no newline": key.Base64(),
		"crlf":       key.Base64() + "\r\n",
		"spaces":     "  " + key.Base64() + " \n",
	} {
		t.Run(name, func(t *testing.T) {
			path := writeFile(t, content, 0o600)
			got, err := LoadPrivateKeyFile(path)
			if err != nil || got != key {
				t.Fatalf("LoadPrivateKeyFile = %v, %v; want the key", got, err)
			}
		})
	}
}

func TestLoadPrivateKeyFileErrorsExplain(t *testing.T) {
	good := mustGenerate(t).Base64() + "\n"
	cases := []struct {
		name string
		path func(t *testing.T) string
		want []string
	}{
		{"missing", func(t *testing.T) string { return filepath.Join(t.TempDir(), "nope") }, []string{"does not exist", "nope"}},
		{"world readable", func(t *testing.T) string { return writeFile(t, good, 0o644) }, []string{"0644", "chmod 600"}},
		{"group readable", func(t *testing.T) string { return writeFile(t, good, 0o640) }, []string{"0640", "chmod 600"}},
		{"group writable", func(t *testing.T) string { return writeFile(t, good, 0o620) }, []string{"chmod 600"}},
		{"not base64", func(t *testing.T) string { return writeFile(t, "hello\n", 0o600) }, []string{"private key file", "44 characters"}},
		{"empty", func(t *testing.T) string { return writeFile(t, "", 0o600) }, []string{"got 0 characters"}},
		{"too big", func(t *testing.T) string { return writeFile(t, strings.Repeat("A", 5000), 0o600) }, []string{"larger than"}},
		{"directory", func(t *testing.T) string { return t.TempDir() }, []string{"not a regular file"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			path := c.path(t)
			_, err := LoadPrivateKeyFile(path)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range append(c.want, path) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

// writeFile creates a file with exactly mode perm (chmod after create, so the
// umask does not interfere).
func writeFile(t *testing.T, content string, perm os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(path, []byte(content), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}
