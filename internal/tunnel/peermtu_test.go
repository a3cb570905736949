package tunnel

import (
	"reflect"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// A headend's session passes on the smallest MTU the CPE's LINK_PARAMS announce, once
// per change: links whose MTU is unknown (0, or below IPv4's 576) do not count, a CPE
// that announces none says 0 (so a new session does not keep an old one's MTU), and a
// copy overtaken by a newer one (a lower counter) changes nothing.
func TestSessionPassesOnThePeersSmallestMTU(t *testing.T) {
	var told []int
	cfg := testSession()
	cfg.Peer = "shop"
	cfg.PeerMTU = func(peer string, mtu int) {
		if peer != "shop" {
			t.Errorf("PeerMTU for peer %q, want shop", peer)
		}
		told = append(told, mtu)
	}
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	defer s.close()
	l := s.addLink(LinkSpec{ID: 0, Name: "dsl"}, func(*link, []byte) error { return nil })

	for i, mtus := range [][]uint16{
		{0, 0},          // nothing known: told 0
		{1444, 0},       // one link known
		{1444, 0},       // the same again: nothing new
		{1444, 1436},    // a PPPoE line joins: the smaller counts
		{1444, 1436, 0}, // a third, unknown: no change
		{1444, 1436, 9}, // an implausible one: no change
		{1444, 1444},    // the line is back at full size
	} {
		body := wire.LinkParamsBody{Counter: uint64(10 + i)}
		for id, mtu := range mtus {
			body.Links = append(body.Links, wire.LinkParam{LinkID: uint8(id), MTU: mtu})
		}
		s.handleControl(l, &wire.Header{}, wire.Message{Body: body}, time.Now(), 0)
	}
	// An older copy, overtaken: ignored.
	stale := wire.LinkParamsBody{Counter: 5, Links: []wire.LinkParam{{LinkID: 0, MTU: 1400}}}
	s.handleControl(l, &wire.Header{}, wire.Message{Body: stale}, time.Now(), 0)
	if want := []int{0, 1444, 1436, 1444}; !reflect.DeepEqual(told, want) {
		t.Fatalf("told %v, want %v", told, want)
	}
}
