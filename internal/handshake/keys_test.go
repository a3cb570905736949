package handshake

import (
	"encoding/hex"
	"fmt"
	"strings"
	"testing"

	"golang.org/x/crypto/curve25519"
)

func mustGenerate(t testing.TB) PrivateKey {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestGenerateKeyIsClampedAndFresh(t *testing.T) {
	a, b := mustGenerate(t), mustGenerate(t)
	if a == b {
		t.Fatal("two generated keys are equal")
	}
	if a[0]&7 != 0 || a[31]&128 != 0 || a[31]&64 == 0 {
		t.Fatalf("key not clamped: first byte %08b, last byte %08b", a[0], a[31])
	}
}

func TestPublicMatchesX25519(t *testing.T) {
	k := mustGenerate(t)
	want, err := curve25519.X25519(k[:], curve25519.Basepoint)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.Public(); hex.EncodeToString(got[:]) != hex.EncodeToString(want) {
		t.Fatalf("Public() = %x, X25519 base point = %x", got, want)
	}
}

func TestBase64RoundTrip(t *testing.T) {
	priv := mustGenerate(t)
	pub := priv.Public()

	gotPriv, err := ParsePrivateKey(priv.Base64())
	if err != nil || gotPriv != priv {
		t.Fatalf("ParsePrivateKey(Base64()) = %v, %v; want the key back", gotPriv, err)
	}
	gotPub, err := ParsePublicKey(pub.String())
	if err != nil || gotPub != pub {
		t.Fatalf("ParsePublicKey(String()) = %v, %v; want %v", gotPub, err, pub)
	}
	if len(pub.String()) != 44 {
		t.Fatalf("public key string %q is not 44 characters", pub.String())
	}
}

func TestParseErrorsExplain(t *testing.T) {
	cases := []struct {
		name, input string
		parse       func(string) error
		wantInError string
	}{
		{"public too short", "abc", parsePub, "public key must be 44 characters of base64 (32 bytes); got 3 characters"},
		{"private too long", strings.Repeat("A", 45), parsePriv, "private key must be 44 characters of base64 (32 bytes); got 45"},
		{"public not base64", strings.Repeat("*", 43) + "=", parsePub, "not valid standard base64"},
		{"url-safe alphabet", strings.Repeat("_", 43) + "=", parsePub, "A-Z a-z 0-9 + /"},
		{"low-order point", strings.Repeat("A", 43) + "=", parsePub, "low-order point"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.parse(c.input)
			if err == nil || !strings.Contains(err.Error(), c.wantInError) {
				t.Fatalf("error = %v; want it to contain %q", err, c.wantInError)
			}
		})
	}
}

func parsePub(s string) error  { _, err := ParsePublicKey(s); return err }
func parsePriv(s string) error { _, err := ParsePrivateKey(s); return err }

func TestParsePrivateKeyErrorDoesNotEchoSecret(t *testing.T) {
	secret := mustGenerate(t).Base64()
	_, err := ParsePrivateKey(secret[:40])
	if err == nil || strings.Contains(err.Error(), secret[:40]) {
		t.Fatalf("error %v repeats the (truncated) secret", err)
	}
}

func TestPrivateKeyFormattingHidesSecret(t *testing.T) {
	k := mustGenerate(t)
	for _, format := range []string{"%v", "%s", "%#v", "%+v"} {
		out := fmt.Sprintf(format, k)
		if strings.Contains(out, k.Base64()) || strings.Contains(out, fmt.Sprint([32]byte(k))) {
			t.Errorf("Sprintf(%q) = %q shows the secret", format, out)
		}
		if !strings.Contains(out, k.Public().String()) {
			t.Errorf("Sprintf(%q) = %q does not name the public key", format, out)
		}
	}
}

// The expected values were computed with Python's hashlib, independently of
// this code, from the definitions in docs/wire-format.md and noise.go.
func TestMacKeyVector(t *testing.T) {
	var pub PublicKey
	for i := range pub {
		pub[i] = byte(i)
	}
	got := pub.MacKey()
	if hex.EncodeToString(got[:]) != "dfdfe73a830105f60a8105e6f9c00ed8" {
		t.Fatalf("MacKey = %x", got)
	}
}

func TestTagKeyVector(t *testing.T) {
	var split [32]byte
	for i := range split {
		split[i] = byte(100 + i)
	}
	got := tagKey(split, labelInitiatorToResponder)
	if hex.EncodeToString(got[:]) != "76af40fbe3e55c14dc3b5fc7d16e8037" {
		t.Fatalf("tagKey = %x", got)
	}
}
