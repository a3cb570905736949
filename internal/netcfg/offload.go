package netcfg

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
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

// SteerReceive sets the RPS CPU mask of every receive queue of an interface
// (/sys/class/net/NAME/queues/rx-*/rps_cpus), so that the kernel processes what the
// interface receives on those CPUs, in arrival order. It returns the previous masks, by
// file, for RestoreReceive.
func SteerReceive(name string, mask string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join("/sys/class/net", name, "queues", "rx-*", "rps_cpus"))
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("%s: no receive queues in sysfs (RPS needs CONFIG_RPS and sysfs of this network namespace)", name)
	}
	prev := make(map[string]string, len(files))
	for _, f := range files {
		old, err := os.ReadFile(f)
		if err != nil {
			return prev, err
		}
		if err := os.WriteFile(f, []byte(mask), 0); err != nil {
			return prev, fmt.Errorf("%s: %w", f, err)
		}
		prev[f] = strings.TrimSpace(string(old))
	}
	return prev, nil
}

// RestoreReceive puts back masks SteerReceive returned.
func RestoreReceive(prev map[string]string) {
	for f, m := range prev {
		_ = os.WriteFile(f, []byte(m), 0)
	}
}
