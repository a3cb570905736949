package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"syscall"
	"time"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/clock"
	"github.com/aggd/aggd/internal/wire"
)

// socketBuffer is the send and receive buffer we ask for on every tunnel socket: enough
// for a burst of a few milliseconds at gigabit rates, so the kernel does not drop while
// the daemon is descheduled.
const socketBuffer = 4 << 20

// listenUDP opens a UDP socket bound to local and, when device is set, to that
// interface (SO_BINDTODEVICE), so its packets leave through that uplink whatever the
// main routing table prefers.
func listenUDP(local netip.AddrPort, device string) (*net.UDPConn, error) {
	network := "udp4"
	switch a := local.Addr(); {
	case a.Is6() && a.IsUnspecified():
		// "[::]:port" (a headend's listen) takes both versions: IPv4 peers arrive as
		// IPv4-mapped addresses, which readLoop unmaps.
		network = "udp"
	case a.Is6() && !a.Is4In6():
		network = "udp6"
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			if device != "" {
				if serr = unix.BindToDevice(int(fd), device); serr != nil {
					serr = fmt.Errorf("bind to device %s: %w", device, serr)
					return
				}
			}
			// FORCE variants ignore the sysctl caps; fall back when not privileged.
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, socketBuffer) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUF, socketBuffer)
			}
			if unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, socketBuffer) != nil {
				_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_SNDBUF, socketBuffer)
			}
			// Kernel receive timestamps (see readLoop); without them the daemon's own
			// time stands in.
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
			// The socket's drop count with each datagram (readLoop counts overflows).
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RXQ_OVFL, 1)
			// The interface each datagram arrived on (readLoop): the kernel fast path
			// sees only what arrives where its receive program is (kernel.go).
			if network != "udp6" {
				_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IP, unix.IP_PKTINFO, 1)
			}
			if network != "udp4" {
				_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_RECVPKTINFO, 1)
			}
			// IPv6 flow label 0, as the kernel fast path sends: by default the kernel
			// labels a socket's packets with a hash of its own, and routers that
			// spread IPv6 over equal-cost paths by the label (Linux's default
			// multipath hash does) would send one link's packets from the daemon and
			// from the kernel different ways, with different delays. (On an IPv4
			// socket, which "[::]" gives where IPv6 is off, it fails: no matter.)
			if network != "udp4" {
				_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_IPV6, unix.IPV6_AUTOFLOWLABEL, 0)
			}
		})
		if err != nil {
			return err
		}
		return serr
	}}
	pc, err := lc.ListenPacket(context.Background(), network, local.String())
	if err != nil {
		return nil, fmt.Errorf("listen on %s (device %q): %w", local, device, err)
	}
	return pc.(*net.UDPConn), nil
}

// arrival is what the kernel tells of a datagram's arrival.
type arrival struct {
	stamp   int64 // its receive timestamp (SO_TIMESTAMPNS, CLOCK_REALTIME ns; 0 if none)
	ifindex int   // the interface it arrived on (IP_PKTINFO, IPV6_PKTINFO; 0 if none)
}

// readLoop hands every datagram arriving on conn to handle until the socket is closed,
// with what the kernel tells of its arrival: the receive timestamp and the interface.
// Probe trains are timed by that stamp (train.go): the daemon's own reading time shows
// its scheduling, not the link (on a loaded machine a 60 Mbit/s link's train, read in
// bursts, looked like 300-600 Mbit/s). It stays raw here, on the per-packet path;
// rxMonotonic converts it for the few packets that use it. One-way delays still use the
// daemon's time: with the kernel's, the lab showed a steady 10 ms "queue" on one link
// that nothing else showed (d1fa18a), not understood.
//
// readLoop also adds what the kernel dropped for a full receive buffer to drops
// (SO_RXQ_OVFL: once it is not 0, the socket's drop count so far comes with each
// datagram; one without it says nothing new), and observes in waited how long each
// datagram waited on this host, from its kernel stamp to the read: the host's own
// queue, which an operator can tell from the links' (and which no link estimate shows
// apart: one-way delays are taken at the read, so it is in them).
func readLoop(ctx context.Context, conn *net.UDPConn, log *slog.Logger, drops prometheus.Counter, waited prometheus.Observer,
	handle func(pkt []byte, from netip.AddrPort, arr arrival)) {
	buf := make([]byte, 65536)
	// Room for every control message at once (an IPv4 datagram on a dual-stack socket
	// comes with both kinds of packet info).
	oob := make([]byte, unix.CmsgSpace(timespecLen)+unix.CmsgSpace(4)+
		unix.CmsgSpace(unix.SizeofInet4Pktinfo)+unix.CmsgSpace(unix.SizeofInet6Pktinfo))
	var dropped uint32
	for {
		n, oobn, _, from, err := conn.ReadMsgUDPAddrPort(buf, oob)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn("socket read failed", "err", err)
			continue
		}
		from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
		arr, total := socketControl(oob[:oobn])
		if arr.stamp != 0 {
			waited.Observe(max(0, float64(time.Now().UnixNano()-arr.stamp)) / 1e9)
		}
		if total != 0 && total != dropped {
			drops.Add(float64(total - dropped)) // wraps like the kernel's counter
			dropped = total
		}
		handle(buf[:n], from, arr)
	}
}

// timespecLen is the size of SO_TIMESTAMPNS's payload on this architecture.
const timespecLen = int(unsafe.Sizeof(unix.Timespec{}))

// socketControl reads a datagram's control messages: the SO_TIMESTAMPNS receive stamp,
// the interface from IP_PKTINFO or IPV6_PKTINFO, and the SO_RXQ_OVFL drop count (each 0
// without its message). No allocation: it walks the buffer in place.
func socketControl(oob []byte) (arr arrival, drops uint32) {
	for len(oob) >= unix.CmsgLen(0) {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		n := int(h.Len)
		if n < unix.CmsgLen(0) || n > len(oob) {
			return arr, drops
		}
		data := oob[unix.CmsgLen(0):n]
		switch {
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS && len(data) >= timespecLen:
			arr.stamp = (*unix.Timespec)(unsafe.Pointer(&data[0])).Nano()
		case h.Level == unix.SOL_SOCKET && h.Type == unix.SO_RXQ_OVFL && len(data) >= 4:
			drops = *(*uint32)(unsafe.Pointer(&data[0]))
		case h.Level == unix.IPPROTO_IP && h.Type == unix.IP_PKTINFO && len(data) >= unix.SizeofInet4Pktinfo:
			arr.ifindex = int((*unix.Inet4Pktinfo)(unsafe.Pointer(&data[0])).Ifindex)
		case h.Level == unix.IPPROTO_IPV6 && h.Type == unix.IPV6_PKTINFO && len(data) >= unix.SizeofInet6Pktinfo:
			arr.ifindex = int((*unix.Inet6Pktinfo)(unsafe.Pointer(&data[0])).Ifindex)
		}
		next := unix.CmsgSpace(n - unix.CmsgLen(0))
		if next > len(oob) {
			return arr, drops
		}
		oob = oob[next:]
	}
	return arr, drops
}

// rxMonotonic turns a kernel receive stamp into CLOCK_MONOTONIC ns, by how long ago it
// was on the realtime clock. Without a stamp (or with one in the future, or long past:
// the realtime clock was stepped) it returns now.
func rxMonotonic(stamp int64) int64 {
	now := clock.Nanos()
	var real unix.Timespec
	if stamp == 0 || unix.ClockGettime(unix.CLOCK_REALTIME, &real) != nil {
		return now
	}
	age := real.Nano() - stamp
	if age < 0 || age > int64(time.Second) {
		return now
	}
	return now - age
}

// parseDatagram checks what can be checked before any session state: the header, and
// a DATA body (the wire format's check order). A DATA tag covers only the header, so
// this is what keeps a malformed inner packet out of the tunnel interface.
func parseDatagram(pkt []byte) (wire.Header, error) {
	h, err := wire.ParseHeader(pkt)
	if err != nil {
		return h, err
	}
	if h.Type == wire.TypeData {
		if err := wire.CheckData(pkt[wire.HeaderLen:]); err != nil {
			return h, err
		}
	}
	return h, nil
}

// localAddrPort is the address and port a socket is bound to.
func localAddrPort(c *net.UDPConn) netip.AddrPort {
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok {
		return a.AddrPort()
	}
	return netip.AddrPort{}
}

// standInSocket is an uplink's socket until it can have its own: bound to the loopback
// address of the uplink's IP version (which tells RebindUplink the version to look
// for) on a port of its own, so that it holds neither the uplink's port nor its
// interface. The uplink is offline meanwhile; what is written to it goes nowhere.
func standInSocket(v6 bool) (*net.UDPConn, error) {
	lo := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	if v6 {
		lo = netip.IPv6Loopback()
	}
	return listenUDP(netip.AddrPortFrom(lo, 0), "")
}
