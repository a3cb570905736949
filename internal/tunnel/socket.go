package tunnel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"

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
	lc := net.ListenConfig{Control: func(network, address string, c syscall.RawConn) error {
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
		})
		if err != nil {
			return err
		}
		return serr
	}}
	network := "udp4"
	if local.Addr().Is6() && !local.Addr().Is4In6() {
		network = "udp6"
	}
	pc, err := lc.ListenPacket(context.Background(), network, local.String())
	if err != nil {
		return nil, fmt.Errorf("listen on %s (device %q): %w", local, device, err)
	}
	return pc.(*net.UDPConn), nil
}

// readLoop hands every datagram arriving on conn to handle until the socket is closed.
func readLoop(ctx context.Context, conn *net.UDPConn, log *slog.Logger, handle func(pkt []byte, from netip.AddrPort)) {
	buf := make([]byte, 65536)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			log.Warn("socket read failed", "err", err)
			continue
		}
		handle(buf[:n], from)
	}
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
