package tunnel

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"golang.org/x/sys/unix"
)

// A socket whose receive buffer overflows: readLoop counts what the kernel dropped
// (SO_RXQ_OVFL), and still hands over every datagram with its kernel stamp.
func TestReadLoopCountsSocketDrops(t *testing.T) {
	conn, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	// The smallest buffer the kernel allows, so that a burst overflows it.
	if err := raw.Control(func(fd uintptr) { err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, 1) }); err != nil {
		t.Fatal(err)
	}
	to := localAddrPort(conn)
	tx, err := listenUDP(netip.MustParseAddrPort("127.0.0.1:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	burst := func(n int) {
		for range n {
			if _, err := tx.WriteToUDPAddrPort(make([]byte, 1000), to); err != nil {
				t.Fatal(err)
			}
		}
	}
	burst(100) // loopback delivers at once: most of these are dropped, nobody reads yet

	drops := prometheus.NewCounter(prometheus.CounterOpts{Name: "drops"})
	waited := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "waited"})
	read := 0 // by readLoop's goroutine, until done
	got := make(chan int64, 200)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		readLoop(ctx, conn, discard, drops, waited, func(pkt []byte, _ netip.AddrPort, arr arrival) { read++; got <- arr.stamp })
	}()
	select { // the one datagram the buffer held
	case <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("nothing read")
	}
	// A datagram queued after the drops carries their count.
	for drained := false; !drained; {
		select {
		case <-got:
		case <-time.After(200 * time.Millisecond):
			drained = true
		}
	}
	burst(1)
	select {
	case stamp := <-got:
		if stamp == 0 {
			t.Error("no kernel receive stamp")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the datagram sent after the drain did not arrive")
	}
	cancel()
	conn.Close()
	<-done
	var m dto.Metric
	if err := drops.Write(&m); err != nil {
		t.Fatal(err)
	}
	if n := m.GetCounter().GetValue(); n < 50 {
		t.Errorf("counted %v drops of a 100-datagram burst into a minimal buffer, want most of them", n)
	}
	// Every datagram read has its wait on this host measured; the first waited for the
	// reader to start.
	if err := waited.Write(&m); err != nil {
		t.Fatal(err)
	}
	if h := m.GetHistogram(); h.GetSampleCount() != uint64(read) || h.GetSampleSum() <= 0 {
		t.Errorf("waits measured: %d summing to %v s, want one for each of the %d datagrams read, above 0", h.GetSampleCount(), h.GetSampleSum(), read)
	}
}

// socketControl walks every control message: the stamp, the drop count and the
// interface in any order, and it stops at a malformed one.
func TestSocketControl(t *testing.T) {
	stamp := unix.Timespec{Sec: 3, Nsec: 4}
	ts := cmsg(unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, unsafeBytes(&stamp))
	ovfl := cmsg(unix.SOL_SOCKET, unix.SO_RXQ_OVFL, []byte{7, 0, 0, 0})
	info4 := unix.Inet4Pktinfo{Ifindex: 5}
	pkt4 := cmsg(unix.IPPROTO_IP, unix.IP_PKTINFO, unsafe.Slice((*byte)(unsafe.Pointer(&info4)), unix.SizeofInet4Pktinfo))
	info6 := unix.Inet6Pktinfo{Ifindex: 9}
	pkt6 := cmsg(unix.IPPROTO_IPV6, unix.IPV6_PKTINFO, unsafe.Slice((*byte)(unsafe.Pointer(&info6)), unix.SizeofInet6Pktinfo))
	join := func(parts ...[]byte) []byte { return slices.Concat(parts...) }
	for _, c := range []struct {
		name      string
		oob       []byte
		wantStamp int64
		wantDrops uint32
		wantIf    int
	}{
		{"none", nil, 0, 0, 0},
		{"stamp", ts, 3e9 + 4, 0, 0},
		{"stamp, drops", join(ts, ovfl), 3e9 + 4, 7, 0},
		{"drops, stamp", join(ovfl, ts), 3e9 + 4, 7, 0},
		{"stamp, IPv4 packet info, drops", join(ts, pkt4, ovfl), 3e9 + 4, 7, 5},
		{"IPv6 packet info, stamp", join(pkt6, ts), 3e9 + 4, 0, 9},
		{"truncated", ts[:len(ts)-4], 0, 0, 0},
	} {
		a, d := socketControl(c.oob)
		if a.stamp != c.wantStamp || d != c.wantDrops || a.ifindex != c.wantIf {
			t.Errorf("%s: stamp %d drops %d interface %d, want %d %d %d", c.name, a.stamp, d, a.ifindex,
				c.wantStamp, c.wantDrops, c.wantIf)
		}
	}
}

// cmsg builds one control message of the given level and type, padded as the kernel
// pads it.
func cmsg(level, typ int32, data []byte) []byte {
	b := make([]byte, unix.CmsgSpace(len(data)))
	h := (*unix.Cmsghdr)(unsafe.Pointer(&b[0]))
	h.Level, h.Type = level, typ
	h.SetLen(unix.CmsgLen(len(data)))
	copy(b[unix.CmsgLen(0):], data)
	return b
}

func unsafeBytes(ts *unix.Timespec) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(ts)), unsafe.Sizeof(*ts))
}

// A headend listening on "[::]:port" serves both IP versions on one socket: an IPv4
// peer is seen with its plain IPv4 address (not IPv4-mapped, which would make it a
// different peer address than the one its links announce), and a reply to that address
// reaches it; an IPv6 peer likewise. Both come with the interface they arrived on
// (loopback here): the kernel fast path sees only some interfaces (kernel.go).
func TestDualStackListen(t *testing.T) {
	conn, err := listenUDP(netip.MustParseAddrPort("[::]:0"), "")
	if err != nil {
		t.Fatal(err)
	}
	port := localAddrPort(conn).Port()
	from := make(chan netip.AddrPort, 4)
	on := make(chan int, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		readLoop(ctx, conn, discard, prometheus.NewCounter(prometheus.CounterOpts{Name: "drops"}),
			prometheus.NewHistogram(prometheus.HistogramOpts{Name: "waited"}), func(pkt []byte, src netip.AddrPort, arr arrival) {
				from <- src
				on <- arr.ifindex
				_, _ = conn.WriteToUDPAddrPort([]byte("reply"), src)
			})
	}()
	defer func() { cancel(); conn.Close(); <-done }()

	for _, local := range []string{"127.0.0.1", "::1"} {
		peer, err := listenUDP(netip.AddrPortFrom(netip.MustParseAddr(local), 0), "")
		if err != nil {
			t.Fatal(err)
		}
		defer peer.Close()
		to := netip.AddrPortFrom(netip.MustParseAddr(local), port)
		if _, err := peer.WriteToUDPAddrPort([]byte("hello"), to); err != nil {
			t.Fatalf("send from %s: %v", local, err)
		}
		select {
		case src := <-from:
			if src.Addr().String() != local {
				t.Errorf("datagram from %s seen as from %s", local, src.Addr())
			}
			if lo, err := net.InterfaceByName("lo"); err != nil {
				t.Error(err)
			} else if got := <-on; got != lo.Index {
				t.Errorf("datagram from %s: arrived on interface %d, want lo's (%d)", local, got, lo.Index)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("datagram from %s not received", local)
		}
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 16)
		n, _, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || string(buf[:n]) != "reply" {
			t.Errorf("reply to %s: %q, %v", local, buf[:n], err)
		}
	}
}

// The daemon's IPv6 tunnel sockets send with flow label 0, as the kernel fast path
// does, so routers that hash the label put both paths' packets of a link on one route.
func TestIPv6SocketsSendWithoutAFlowLabel(t *testing.T) {
	for _, local := range []string{"[::1]:0", "[::]:0"} {
		c, err := listenUDP(netip.MustParseAddrPort(local), "")
		if err != nil {
			t.Fatalf("listen on %s: %v", local, err)
		}
		raw, err := c.SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var v int
		var gerr error
		if err := raw.Control(func(fd uintptr) {
			v, gerr = unix.GetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL)
		}); err != nil || gerr != nil {
			t.Fatalf("%s: read IPV6_AUTOFLOWLABEL: %v %v", local, err, gerr)
		}
		if v != 0 {
			t.Errorf("%s: IPV6_AUTOFLOWLABEL = %d, want 0", local, v)
		}
		_ = c.Close()
	}
}
