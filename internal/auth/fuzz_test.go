package auth

import (
	"testing"

	"github.com/aggd/aggd/internal/wire"
)

// FuzzSealVerify: Verify never panics on any input; after Seal every datagram of at
// least header length verifies, and flipping a tag bit makes it fail.
func FuzzSealVerify(f *testing.F) {
	f.Add(make([]byte, wire.HeaderLen))
	f.Add([]byte{0x14, 0, 0, 0})
	f.Add(append((&wire.Header{Type: wire.TypeProbe}).Append(nil), 1, 2, 3))
	f.Fuzz(func(t *testing.T, b []byte) {
		Verify(paperKey, b)
		if len(b) < wire.HeaderLen {
			return
		}
		Seal(paperKey, b)
		if !Verify(paperKey, b) {
			t.Fatal("sealed datagram does not verify")
		}
		b[wire.TagOffset] ^= 0x80
		if Verify(paperKey, b) {
			t.Fatal("datagram with a flipped tag bit verifies")
		}
	})
}
