// Package tun opens the Linux TUN device that carries the bond's inner packets (agg0).
//
// The device is opened in IFF_TUN|IFF_NO_PI mode: every read returns exactly one IPv4 or
// IPv6 packet without any prefix, and every write injects one, so the kernel's routing,
// firewall and conntrack see agg0 as an ordinary point-to-point interface.
package tun

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Device is an open TUN device.
type Device struct {
	file *os.File
	name string
}

// Open creates (or attaches to) the TUN device called name. The device disappears when
// the last file descriptor is closed, unless it was made persistent elsewhere.
func Open(name string) (*Device, error) {
	if len(name) >= unix.IFNAMSIZ {
		return nil, fmt.Errorf("tun: interface name %q is longer than %d characters", name, unix.IFNAMSIZ-1)
	}
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("tun: open /dev/net/tun: %w (is the tun module available and are you root or CAP_NET_ADMIN?)", err)
	}
	var req ifreq
	copy(req.name[:], name)
	req.flags = unix.IFF_TUN | unix.IFF_NO_PI
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.TUNSETIFF, uintptr(unsafe.Pointer(&req))); errno != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: create %s: %w", name, errno)
	}
	// Non-blocking so that the Go runtime poller serves reads and Close unblocks them.
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tun: set non-blocking: %w", err)
	}
	got := string(req.name[:clen(req.name[:])])
	return &Device{file: os.NewFile(uintptr(fd), "/dev/net/tun:"+got), name: got}, nil
}

// SetPersistent makes the device outlive the daemon's descriptor (TUNSETPERSIST): with
// the kernel fast path forwarding through it, traffic then keeps flowing while the
// daemon restarts, and the next daemon attaches to the same device. A persistent device
// must be deleted explicitly (netcfg.DeleteLink).
func (d *Device) SetPersistent(on bool) error {
	var v uintptr
	if on {
		v = 1
	}
	conn, err := d.file.SyscallConn()
	if err != nil {
		return fmt.Errorf("tun: %s: %w", d.name, err)
	}
	var errno syscall.Errno
	if err := conn.Control(func(fd uintptr) {
		_, _, errno = unix.Syscall(unix.SYS_IOCTL, fd, unix.TUNSETPERSIST, v)
	}); err != nil {
		return fmt.Errorf("tun: %s: %w", d.name, err)
	}
	if errno != 0 {
		return fmt.Errorf("tun: make %s persistent: %w", d.name, errno)
	}
	return nil
}

// Name is the kernel's name for the device.
func (d *Device) Name() string { return d.name }

// Read reads one packet into b and returns its length.
func (d *Device) Read(b []byte) (int, error) { return d.file.Read(b) }

// Write injects one packet into the kernel as if received on the device.
func (d *Device) Write(b []byte) (int, error) { return d.file.Write(b) }

// Close closes the device; pending reads return an error.
func (d *Device) Close() error { return d.file.Close() }

type ifreq struct {
	name  [unix.IFNAMSIZ]byte
	flags uint16
	_     [22]byte
}

func clen(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return len(b)
}
