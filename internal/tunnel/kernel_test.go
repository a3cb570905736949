package tunnel

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/wire"
)

// A headend's session on the fast path: the kernel gets the session (its receive
// ordering offered, its transmit side programmed) only once the CPE's LINK_PARAMS have
// named every link and each has spoken; a link that moves to IPv6 keeps it there (the
// programs send and receive over both versions).
func TestKernelCarriesOnlyKnownSessions(t *testing.T) {
	s, _, sp := fastSessionWithLink() // link 3, no peer address yet
	s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	l5 := s.addLink(LinkSpec{ID: 5, Name: "dsl"}, func(*link, []byte) error { return nil })
	l3 := s.link(3)

	check := func(step string, want bool, reason string) {
		t.Helper()
		s.rxMu.Lock()
		s.armHoldTimer(clock.Nanos())
		s.rxMu.Unlock()
		s.refreshSchedule()
		if sp.offered != want {
			t.Errorf("%s: offered the kernel the ordering = %v, want %v", step, sp.offered, want)
		}
		if sp.programmed == nil {
			t.Fatalf("%s: transmit side never programmed", step)
		}
		if got := sp.programmed.Userspace; (got == "") != want || !strings.Contains(got, reason) {
			t.Errorf("%s: programmed with Userspace %q, want it to say %q", step, got, reason)
		}
	}
	check("nothing known", false, "not known yet")

	s.follow(l3, netip.MustParseAddrPort("192.0.2.3:4242"))
	s.follow(l5, netip.MustParseAddrPort("192.0.2.5:4242"))
	check("both links heard, no LINK_PARAMS yet", false, "not known yet")

	params := wire.LinkParamsBody{Counter: 1, Links: []wire.LinkParam{{LinkID: 3}, {LinkID: 5}, {LinkID: 7}}}
	s.handleControl(l3, &wire.Header{}, wire.Message{Body: params}, time.Now(), 0)
	check("LINK_PARAMS name a link not heard from", false, "link 7 not heard from yet")

	params.Counter, params.Links = 2, params.Links[:2]
	s.handleControl(l3, &wire.Header{}, wire.Message{Body: params}, time.Now(), 0)
	check("every link known, all IPv4", true, "")

	s.follow(l5, netip.MustParseAddrPort("[2001:db8::5]:4242"))
	check("a link moved to IPv6", true, "")
}

// A link whose packets arrive on an interface without the kernel's receive program (a
// headend whose bpf.interfaces leave out the one a CPE's line comes in on): the daemon
// keeps the receive ordering, whose packets the kernel would neither deliver nor count,
// while the transmit side stays in the kernel; it offers the ordering again once the
// link's packets arrive where the program is.
func TestReceiveOrderingStaysWhereTheKernelCannotSee(t *testing.T) {
	s, l3, sp := fastSessionWithLink()
	s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	s.follow(l3, netip.MustParseAddrPort("192.0.2.3:4242"))
	params := wire.LinkParamsBody{Counter: 1, Links: []wire.LinkParam{{LinkID: 3}}}
	s.handleControl(l3, &wire.Header{}, wire.Message{Body: params}, time.Now(), 0)
	sp.noReceive = 7

	for _, step := range []struct {
		name    string
		ifindex int
		offered bool
	}{
		{"nothing arrived yet", 0, true},
		{"arrived where the program is", 2, true},
		{"arrived on interface 7, without the program", 7, false},
		{"the kernel did not say where", 0, false}, // as before
		{"back where the program is", 2, true},
	} {
		s.noteArrival(l3, step.ifindex)
		s.rxMu.Lock()
		s.armHoldTimer(clock.Nanos())
		s.rxMu.Unlock()
		s.refreshSchedule()
		if sp.offered != step.offered {
			t.Errorf("%s: offered the kernel the ordering = %v, want %v", step.name, sp.offered, step.offered)
		}
		if sp.programmed == nil || sp.programmed.Userspace != "" {
			t.Errorf("%s: transmit side programmed %+v, want it in the kernel", step.name, sp.programmed)
		}
	}
}

// A link that goes down leaves the kernel's schedule at once, not at the tick's next
// refresh: the kernel stripes by itself, and until then went on sending into the dead
// link, packets lost with no notice.
func TestALinkGoingDownLeavesTheKernelsScheduleAtOnce(t *testing.T) {
	s, l, sp := fastSessionWithLink()
	s.installKeys(&keyGen{id: 1, created: time.Now()}, true)
	l.onReply(time.Now(), 10*time.Millisecond)
	s.refreshSchedule()
	if sp.programmed == nil || len(sp.programmed.Links) != 1 || !sp.programmed.Links[0].Usable {
		t.Fatalf("the kernel was given %+v, want link 3 usable", sp.programmed)
	}
	s.setLinkOffline(3, offlineUplink, true, "carrier lost")
	if sp.programmed.Links[0].Usable {
		t.Error("link 3 is still usable in the kernel's schedule after it went down")
	}
}
