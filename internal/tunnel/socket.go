package tunnel

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"syscall"

	"golang.org/x/sys/unix"
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
