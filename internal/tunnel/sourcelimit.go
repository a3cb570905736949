package tunnel

import (
	"net/netip"
	"sync"
	"time"
)

// sourceLimits is the headend's handshake limit for INITs that proved their source
// address with a cookie (package cookie): each source gets its own token bucket, so a
// flood from some addresses leaves the others their share. A source is an IPv4 address
// or an IPv6 /64 (what one subscriber is usually given); several CPEs behind one
// carrier-grade NAT address share one.
type sourceLimits struct {
	mu      sync.Mutex
	sources map[netip.Addr]*tokenBucket
}

const (
	// A CPE sends an INIT a second on each uplink while it has no answer, and one
	// every rekey (120 s) after: 20 a second is room for many, a burst of 5 for a
	// restart's.
	sourceRate  = 20
	sourceBurst = 5
	// sourcesPrune is the size above which allow forgets the sources whose buckets
	// have been full for a while (they are as good as new).
	sourcesPrune = 4096
	sourceIdle   = 2 * time.Second
)

// allow takes a token from from's source, if it has one.
func (s *sourceLimits) allow(from netip.Addr, now time.Time) bool {
	key := sourceOf(from)
	s.mu.Lock()
	if s.sources == nil {
		s.sources = make(map[netip.Addr]*tokenBucket)
	}
	b := s.sources[key]
	if b == nil {
		if len(s.sources) >= sourcesPrune {
			s.prune(now)
		}
		b = &tokenBucket{rate: sourceRate, burst: sourceBurst}
		s.sources[key] = b
	}
	s.mu.Unlock()
	return b.allow(now)
}

// prune forgets the sources not heard from for sourceIdle: their buckets would be
// full again. Under s.mu.
func (s *sourceLimits) prune(now time.Time) {
	for k, b := range s.sources {
		b.mu.Lock()
		idle := now.Sub(b.last) >= sourceIdle
		b.mu.Unlock()
		if idle {
			delete(s.sources, k)
		}
	}
}

// sourceOf is the source an address counts as: itself for IPv4, its /64 for IPv6.
func sourceOf(a netip.Addr) netip.Addr {
	a = a.Unmap()
	if a.Is4() {
		return a
	}
	p, _ := a.Prefix(64)
	return p.Addr()
}
