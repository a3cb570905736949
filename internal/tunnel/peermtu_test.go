package tunnel

import (
	"reflect"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// A headend's session passes on the smallest MTU the CPE's LINK_PARAMS announce, once
// per change: links whose MTU is unknown (0) do not count, and a CPE that announces
// none (built before the field) leaves the routes alone.
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

	for _, mtus := range [][]uint16{
		{0, 0},          // nothing known: nothing told
		{1444, 0},       // one link known
		{1444, 0},       // the same again: nothing new
		{1444, 1436},    // a PPPoE line joins: the smaller counts
		{1444, 1436, 0}, // a third, unknown: no change
		{1444, 1444},    // the line is back at full size
	} {
		body := wire.LinkParamsBody{}
		for id, mtu := range mtus {
			body.Links = append(body.Links, wire.LinkParam{LinkID: uint8(id), MTU: mtu})
		}
		s.handleControl(l, &wire.Header{}, wire.Message{Body: body}, time.Now(), 0)
	}
	if want := []int{1444, 1436, 1444}; !reflect.DeepEqual(told, want) {
		t.Fatalf("told %v, want %v", told, want)
	}
}
