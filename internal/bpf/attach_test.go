package bpf

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// inFreshNetns runs fn on a locked OS thread inside a new, unnamed network
// namespace. The namespace (and every interface in it) disappears when its
// handle is closed. If the thread cannot return to its original namespace it
// stays locked, so the Go runtime retires it instead of reusing it.
func inFreshNetns(t *testing.T, fn func(ns netns.NsHandle)) {
	t.Helper()
	needRoot(t)
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("netns.Get: %v", err)
	}
	defer orig.Close()
	ns, err := netns.New()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("netns.New: %v", err)
	}
	defer func() {
		ns.Close()
		if err := netns.Set(orig); err != nil {
			t.Errorf("back to the original netns: %v", err)
			return
		}
		runtime.UnlockOSThread()
	}()
	fn(ns)
}

func xdpState(t *testing.T, ifindex int) *netlink.LinkXdp {
	t.Helper()
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		t.Fatalf("LinkByIndex(%d): %v", ifindex, err)
	}
	if l.Attrs().Xdp == nil {
		return &netlink.LinkXdp{}
	}
	return l.Attrs().Xdp
}

// TestAttachVethNative attaches the shield natively to one end of a veth pair,
// sends frames into the other end and checks that the attached program judged
// them, then detaches it.
func TestAttachVethNative(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	addTestSession(t, s)
	inFreshNetns(t, func(netns.NsHandle) {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "aggd-rx"}, PeerName: "aggd-tx"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Fatalf("add veth: %v", err)
		}
		rx, err := netlink.LinkByName("aggd-rx")
		if err != nil {
			t.Fatal(err)
		}
		tx, err := netlink.LinkByName("aggd-tx")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range []netlink.Link{rx, tx} {
			if err := netlink.LinkSetUp(l); err != nil {
				t.Fatalf("set %s up: %v", l.Attrs().Name, err)
			}
		}

		lnk, mode, err := s.Attach(rx.Attrs().Index)
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
		if mode != XDPNative {
			t.Errorf("veth attach mode %s, want %s", mode, XDPNative)
		}
		info, err := s.Program().Info()
		if err != nil {
			t.Fatal(err)
		}
		progID, _ := info.ID()
		x := xdpState(t, rx.Attrs().Index)
		if !x.Attached || x.AttachMode != nl.XDP_ATTACHED_DRV || x.ProgId != uint32(progID) {
			t.Errorf("after Attach: attached=%v mode=%d prog=%d; want true, %d (driver), %d",
				x.Attached, x.AttachMode, x.ProgId, nl.XDP_ATTACHED_DRV, progID)
		}

		// Real frames through the veth: the program sees them in the
		// driver path and the counters move.
		before := stats(t, s)
		dst := rx.Attrs().HardwareAddr
		sendFrames(t, tx.Attrs().Index,
			withDst(frameSpec{payload: validData()}.build(), dst),
			withDst(frameSpec{payload: aggdDatagram(0x21, 0, nil)}.build(), dst),
			withDst(frameSpec{dport: 53, payload: aggdDatagram(0x21, 0, nil)}.build(), dst),
		)
		want := map[string]uint64{"pass": 1, "bad_version": 1}
		var delta map[string]uint64
		for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			delta = statsDelta(before, stats(t, s))
			if sameCounts(delta, want) {
				break
			}
		}
		if !sameCounts(delta, want) {
			t.Errorf("counters after sending through the veth: %v, want %v", delta, want)
		}

		if err := lnk.Close(); err != nil {
			t.Fatalf("detach: %v", err)
		}
		if x := xdpState(t, rx.Attrs().Index); x.Attached {
			t.Errorf("still attached after closing the link: %+v", x)
		}
	})
}

// Loopback has no native XDP: Attach must fall back to generic mode and say
// so. (A fresh namespace's lo is used because it always exists; the dummy
// driver is not built into every kernel.)
func TestAttachFallsBackToGeneric(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	inFreshNetns(t, func(netns.NsHandle) {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			t.Fatal(err)
		}
		lnk, mode, err := s.Attach(lo.Attrs().Index)
		if err != nil {
			t.Fatalf("Attach: %v", err)
		}
		defer lnk.Close()
		if mode != XDPGeneric {
			t.Errorf("lo attach mode %s, want %s", mode, XDPGeneric)
		}
		if x := xdpState(t, lo.Attrs().Index); !x.Attached || x.AttachMode != nl.XDP_ATTACHED_SKB {
			t.Errorf("after Attach: %+v, want generic (skb) mode", x)
		}
	})
}

func TestAttachBadIfindex(t *testing.T) {
	s := loadShieldT(t, DefaultTunnelPort)
	inFreshNetns(t, func(netns.NsHandle) {
		if l, _, err := s.Attach(987654); err == nil {
			l.Close()
			t.Fatal("Attach to a missing interface succeeded")
		}
	})
}

func withDst(frame, mac []byte) []byte {
	copy(frame[0:6], mac)
	return frame
}

// sendFrames writes whole Ethernet frames out of an interface with a raw
// packet socket (in the calling thread's network namespace).
func sendFrames(t *testing.T, ifindex int, frames ...[]byte) {
	t.Helper()
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
	if err != nil {
		t.Fatalf("packet socket: %v", err)
	}
	defer unix.Close(fd)
	for _, f := range frames {
		addr := &unix.SockaddrLinklayer{Ifindex: ifindex, Protocol: htons(unix.ETH_P_IP)}
		if err := unix.Sendto(fd, f, 0, addr); err != nil {
			t.Fatalf("send frame: %v", err)
		}
	}
}

func htons(v uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], v)
	return binary.NativeEndian.Uint16(b[:])
}
