package tunnel

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// A config reload's peer changes, on a running headend: a new peer connects without
// disturbing the others; a removed peer's session ends and its handshakes are refused;
// a peer whose prefixes changed handshakes again and gets traffic for its new prefix.
func TestSetPeersChangesWhoMayConnect(t *testing.T) {
	a := newPeer(t, "cpe-a", "100.64.0.2")
	b := newPeer(t, "cpe-b", "100.64.0.3")
	bed := newBed(t, a)
	na := bed.startCPE(a, 2, time.Hour)
	bed.waitReady(na)
	aIndex := bed.session("cpe-a").localIndex

	asPeers := func(ps ...testPeer) []Peer {
		out := make([]Peer, 0, len(ps))
		for _, p := range ps {
			out = append(out, Peer{Name: p.name, Key: p.key.Public(), Prefixes: p.prefixes})
		}
		return out
	}
	want := func(got, want PeerChanges) {
		t.Helper()
		if !slices.Equal(got.Added, want.Added) || !slices.Equal(got.Removed, want.Removed) || !slices.Equal(got.Changed, want.Changed) {
			t.Errorf("changes %+v, want %+v", got, want)
		}
	}

	// Added: cpe-b shows, without a session, until it connects; cpe-a keeps its session.
	want(bed.he.SetPeers(asPeers(a, b)), PeerChanges{Added: []string{"cpe-b"}})
	wantSession := func(peer string, want float64) {
		t.Helper()
		if got := gauge(bed.heM.PeerSession.WithLabelValues(peer)); got != want {
			t.Errorf("aggd_peer_session{peer=%q} %v, want %v", peer, got, want)
		}
	}
	wantSession("cpe-a", 1)
	wantSession("cpe-b", 0)
	nb := bed.startCPE(b, 2, time.Hour)
	bed.waitReady(nb)
	wantSession("cpe-b", 1)
	if s := bed.session("cpe-a"); s == nil || s.localIndex != aIndex {
		t.Fatal("adding a peer replaced another peer's session")
	}
	mustTransfer(t, bed.heTun, nb.tun, packets(internet, b.addr, 50))
	if got := gauge(bed.heM.Sessions); got != 2 {
		t.Errorf("aggd_sessions %v, want 2", got)
	}

	// Changed: cpe-b's prefixes grow by a LAN; it handshakes again and gets its traffic.
	lan := netip.MustParseAddr("10.2.0.9")
	b2 := b
	b2.prefixes = append(slices.Clone(b.prefixes), netip.MustParsePrefix("10.2.0.0/16"))
	bIndex := bed.session("cpe-b").localIndex
	want(bed.he.SetPeers(asPeers(a, b2)), PeerChanges{Changed: []string{"cpe-b"}})
	waitFor(t, "cpe-b's new session, on both sides", func() bool {
		s, c := bed.session("cpe-b"), nb.c.session.Load()
		return s != nil && s.localIndex != bIndex && c != nil && c.peerIndex.Load() == s.localIndex
	})
	bed.waitReady(nb)
	mustTransfer(t, bed.heTun, nb.tun, packets(internet, lan, 50))

	// Removed: cpe-a's session ends, its series go, and its CPE's next handshakes are
	// refused.
	if n := seriesOf(t, bed.heM, "cpe-a"); n == 0 {
		t.Fatal("no series of cpe-a before its removal: the check below would prove nothing")
	}
	rejected := gauge(bed.heM.Handshakes.WithLabelValues("unknown", "rejected"))
	oldA := bed.session("cpe-a")
	want(bed.he.SetPeers(asPeers(b2)), PeerChanges{Removed: []string{"cpe-a"}})
	if bed.session("cpe-a") != nil {
		t.Fatal("cpe-a's session still there after its removal")
	}
	if n := seriesOf(t, bed.heM, "cpe-a"); n != 0 {
		t.Errorf("%d series of cpe-a still exported after its removal", n)
	}
	// What the closed session may still be handling writes into no exported series:
	// the CPE naming its links, a link going suspect.
	oldA.onLinkNames(wire.LinkNamesBody{Links: []wire.LinkName{{LinkID: 0, Name: "late"}, {LinkID: 1, Name: "later"}}})
	oldA.announceSuspect(oldA.link(0), causeOwedAndSilence)
	if n := seriesOf(t, bed.heM, "cpe-a"); n != 0 {
		t.Errorf("%d series of cpe-a brought back by its closed session's late writes", n)
	}
	if got := gauge(bed.heM.Sessions); got != 1 {
		t.Errorf("aggd_sessions %v, want 1", got)
	}
	waitFor(t, "cpe-a's handshakes to be refused", func() bool {
		return gauge(bed.heM.Handshakes.WithLabelValues("unknown", "rejected")) > rejected
	})
	if bed.session("cpe-a") != nil {
		t.Error("a removed peer got a session again")
	}
	mustTransfer(t, bed.heTun, nb.tun, packets(internet, b.addr, 20)) // cpe-b unaffected
	time.Sleep(3 * bed.he.cfg.Session.Probe)                          // a tick of a closed session brings nothing back
	if n := seriesOf(t, bed.heM, "cpe-a"); n != 0 {
		t.Errorf("%d series of cpe-a came back after its removal", n)
	}
	wantSession("cpe-b", 1)
}

// seriesOf counts the series m exports with the given peer label.
func seriesOf(t *testing.T, m *metrics.Set, peer string) int {
	t.Helper()
	families, err := m.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "peer" && l.GetValue() == peer {
					n++
				}
			}
		}
	}
	return n
}
