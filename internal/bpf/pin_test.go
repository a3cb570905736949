package bpf

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/wire"
)

// bpffsT mounts a BPF filesystem of the test's own, so the test needs none mounted
// and leaves nothing behind, and returns a pin directory in it.
func bpffsT(t *testing.T) string {
	t.Helper()
	needRoot(t)
	mnt := t.TempDir()
	if err := unix.Mount("bpf", mnt, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount a bpf filesystem on %s: %v", mnt, err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, unix.MNT_DETACH); err != nil {
			t.Errorf("unmount %s: %v", mnt, err)
		}
	})
	dir := filepath.Join(mnt, "aggd")
	if err := CheckPinDir(dir); err != nil {
		t.Fatalf("CheckPinDir: %v", err)
	}
	return dir
}

// A transmit path loaded onto pinned maps carries on where the one before it
// stopped: same sessions, routes and sequence numbers, in a new program.
func TestTxPinnedMapsAreAdopted(t *testing.T) {
	dir := bpffsT(t)
	first, err := loadTx(14, dir)
	if err != nil {
		t.Fatalf("load pinned: %v", err)
	}
	setTxSession(t, first, 3, TxSession{Enabled: true, PeerIndex: 3, Key: testKey, MTU: 1500, Links: []TxLink{l3Link(0, 1e6)}})
	setTxRoute(t, first, "10.30.0.0/16", 3)
	txSeq(t, first, 3).Set(500)
	// The first daemon dies: its descriptors close, the pins keep the maps.
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if !HasPins(dir) {
		t.Fatal("nothing pinned")
	}

	second, err := loadTx(14, dir)
	if err != nil {
		t.Fatalf("load onto the pins: %v", err)
	}
	defer func() { _ = second.Close() }()
	if slots, err := second.SessionSlots(); err != nil || len(slots) != 1 || slots[0] != 3 {
		t.Errorf("adopted sessions %v (%v), want [3]", slots, err)
	}
	if n, err := second.RoutesPerSlot(); err != nil || n[3] != 1 {
		t.Errorf("adopted routes per slot %v (%v), want slot 3: 1", n, err)
	}
	q := txSeq(t, second, 3)
	if q.Peek() != 500 {
		t.Errorf("adopted seq %d, want 500", q.Peek())
	}
	ret, out := runTx(t, second, frameOf(inner4(netip.MustParseAddr("10.30.0.1"), 10)), nil)
	if ret != tcActRedirect {
		t.Fatalf("new program on adopted maps: verdict %d", ret)
	}
	if h, err := wire.ParseHeader(out[42:]); err != nil || h.Seq != 500 {
		t.Errorf("new program sent seq %d (%v), want 500", h.Seq, err)
	}
	if q.Peek() != 501 {
		t.Errorf("after one packet the seq is %d, want 501", q.Peek())
	}
	if err := second.DeleteRoutesTo(3); err != nil {
		t.Fatal(err)
	}
	if n, _ := second.RoutesPerSlot(); n[3] != 0 {
		t.Errorf("routes to slot 3 after DeleteRoutesTo: %d", n[3])
	}

	if err := RemovePins(dir); err != nil {
		t.Fatal(err)
	}
	if HasPins(dir) {
		t.Error("pins left after RemovePins")
	}
}

// A pin left by a build with another map layout is replaced, not an error: the
// daemon starts afresh instead of refusing to start.
func TestIncompatiblePinIsReplaced(t *testing.T) {
	dir := bpffsT(t)
	odd, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := odd.Pin(filepath.Join(dir, "tx_sessions")); err != nil {
		t.Fatal(err)
	}
	_ = odd.Close()
	tx, err := loadTx(14, dir)
	if err != nil {
		t.Fatalf("load over an incompatible pin: %v", err)
	}
	defer func() { _ = tx.Close() }()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, "tx_sessions"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = m.Close() }()
	if m.Type() != ebpf.Hash {
		t.Errorf("tx_sessions pin is a %s map after loading, want the object's hash", m.Type())
	}
}

// A pinned TCX link outlives its descriptor (the daemon's death), and the next
// attach takes it over with the new program instead of adding a second one;
// closing the adopted link detaches it. Without TCX, the clsact filter does the
// same by itself.
func TestPinnedTCLinkIsAdopted(t *testing.T) {
	dir := bpffsT(t)
	first, err := loadTx(0, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = first.Close() }()
	second, err := loadTx(0, "")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Close() }()
	inFreshNetns(t, func(netns.NsHandle) {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "aggd-a"}, PeerName: "aggd-b"}
		if err := netlink.LinkAdd(veth); err != nil {
			t.Fatalf("add veth: %v", err)
		}
		l, err := netlink.LinkByName("aggd-a")
		if err != nil {
			t.Fatal(err)
		}
		pin := LinkPin(dir, "tc_egress", "aggd-a")
		a, mode, err := AttachTCPinned(first.Program(), l.Attrs().Index, true, pin)
		if err != nil {
			t.Fatalf("attach: %v", err)
		}
		ifindex := l.Attrs().Index
		attached := attachedTCX
		want := TCModeAdopted
		if mode == TCModeClsact {
			// A kernel without TCX (Debian 12's 6.1): the filter outlives the daemon by
			// itself, and attaching again replaces it.
			attached, want = aggdFilters, TCModeClsact
		} else if err := a.(pinnedLink).Link.Close(); err != nil {
			// The daemon dies: only the descriptor goes, the pin holds the link.
			t.Fatal(err)
		}
		if got := attached(t, ifindex); got != 1 {
			t.Fatalf("after the daemon's death %d programs on the hook, want 1", got)
		}
		b, mode, err := AttachTCPinned(second.Program(), ifindex, true, pin)
		if err != nil {
			t.Fatalf("attach again: %v", err)
		}
		if mode != want {
			t.Errorf("second attach mode %s, want %s", mode, want)
		}
		if got := attached(t, ifindex); got != 1 {
			t.Errorf("after adoption %d programs on the hook, want 1", got)
		}
		if err := b.Close(); err != nil {
			t.Fatalf("close: %v", err)
		}
		if got := attached(t, ifindex); got != 0 {
			t.Errorf("after Close %d programs on the hook, want 0", got)
		}
		if _, err := os.Stat(pin); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("pin %s still there after Close (%v)", pin, err)
		}
	})
}

// attachedTCX counts the programs on an interface's TCX egress hook.
func attachedTCX(t *testing.T, ifindex int) int {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXEgress})
	if err != nil {
		t.Fatalf("query tcx egress: %v", err)
	}
	return len(res.Programs)
}

// aggdFilters counts aggd's cls_bpf filters on an interface's clsact egress.
func aggdFilters(t *testing.T, ifindex int) int {
	t.Helper()
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		t.Fatal(err)
	}
	filters, err := netlink.FilterList(l, netlink.HANDLE_MIN_EGRESS)
	if err != nil {
		t.Fatalf("list filters: %v", err)
	}
	n := 0
	for _, f := range filters {
		if f.Attrs().Priority == clsactFilterPrio {
			n++
		}
	}
	return n
}

// RemoveLinkPinsExcept removes one hook's link pins whose interface is not kept,
// whatever the interface's name holds (underscores, another hook's name), and nothing
// of the other hooks or the maps.
func TestRemoveLinkPinsExcept(t *testing.T) {
	dir := t.TempDir()
	names := []string{
		LinkPin(dir, "xdp", "eth0"), LinkPin(dir, "xdp", "veth_ctr1"), LinkPin(dir, "xdp", "tc_ingress_x"),
		LinkPin(dir, "tc_ingress", "eth0"), LinkPin(dir, "tc_ingress", "veth_ctr1"), LinkPin(dir, "tc_egress", "agg0"),
		filepath.Join(dir, "tx_sessions"),
	}
	for _, p := range names {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	got := RemoveLinkPinsExcept(dir, "xdp", []string{"eth0"})
	if len(got) != 2 || !((got[0] == "veth_ctr1" && got[1] == "tc_ingress_x") || (got[1] == "veth_ctr1" && got[0] == "tc_ingress_x")) {
		t.Errorf("removed %q, want veth_ctr1 and tc_ingress_x", got)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"))
	want := []string{names[0], names[3], names[4], names[5], names[6]}
	if len(left) != len(want) {
		t.Fatalf("left %q, want %q", left, want)
	}
	for _, p := range want {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s removed: %v", filepath.Base(p), err)
		}
	}
	if got := RemoveLinkPinsExcept("", "xdp", nil); got != nil {
		t.Errorf("no pin directory: removed %q", got)
	}
}
