package handshake

import (
	"testing"
	"time"
)

// BenchmarkRespond is what one CPE's handshake costs the headend's responder, at most
// 100 times a second (the headend's handshake rate limit), on a goroutine of its own.
func BenchmarkRespond(b *testing.B) {
	p := newPair(b)
	inits := make([][]byte, b.N)
	for i := range inits {
		inits[i] = mustInit(b, p.initiator, t0.Add(time.Duration(i)*time.Millisecond))
	}
	b.ResetTimer()
	for i := range b.N {
		if _, _, _, err := p.responder.Respond(inits[i]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkInit is what starting a handshake costs a CPE.
func BenchmarkInit(b *testing.B) {
	p := newPair(b)
	for i := range b.N {
		mustInit(b, p.initiator, t0.Add(time.Duration(i)*time.Millisecond))
	}
}
