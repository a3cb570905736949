package netcfg

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DisableGSO turns generic segmentation offload off on an interface (`ethtool -K NAME
// gso off`), so the kernel hands its egress hooks packets, not multi-segment blocks.
func DisableGSO(name string) error {
	return setEthtoolValue(name, unix.ETHTOOL_SGSO, 0)
}

// DisableTxChecksum turns transmit checksum offload off on an interface (`ethtool -K
// NAME tx off`): the kernel then fills in a pending checksum (CHECKSUM_PARTIAL) in
// software (skb_checksum_help, from validate_xmit_skb) before a packet leaves through it.
func DisableTxChecksum(name string) error {
	return setEthtoolValue(name, unix.ETHTOOL_STXCSUM, 0)
}

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with the ifr_data member of its union.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data uintptr
	_    [16]byte
}

// EnableTxChecksum turns transmit checksum offload back on (`ethtool -K NAME tx on`).
func EnableTxChecksum(name string) error {
	return setEthtoolValue(name, unix.ETHTOOL_STXCSUM, 1)
}

// TxChecksum reports whether transmit checksum offload is on.
func TxChecksum(name string) (bool, error) {
	v, err := ethtoolValueCall(name, unix.ETHTOOL_GTXCSUM, 0)
	return v != 0, err
}

func setEthtoolValue(name string, cmd, value uint32) error {
	_, err := ethtoolValueCall(name, cmd, value)
	return err
}

// ethtoolValueCall runs one ethtool_value command and returns the value it left.
func ethtoolValueCall(name string, cmd, value uint32) (uint32, error) {
	if len(name) >= unix.IFNAMSIZ {
		return 0, fmt.Errorf("interface name %q too long", name)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	// Both on the heap (Go does not move heap objects) and kept alive across the call:
	// the kernel follows the pointer in the request.
	v := &ethtoolValue{cmd: cmd, data: value}
	req := &ifreqData{data: uintptr(unsafe.Pointer(v))}
	copy(req.name[:], name)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(req)))
	runtime.KeepAlive(v)
	runtime.KeepAlive(req)
	if errno != 0 {
		return 0, fmt.Errorf("ethtool command %#x on %s: %w", cmd, name, errno)
	}
	return v.data, nil
}
