package daemon

import (
	"fmt"
	"log/slog"
	"maps"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/bpf"
)

// Surviving a restart (ARCHITECTURE §8). With the fast path on, the daemon pins its
// BPF maps and program attachments under bpf.pin_dir and makes agg0 persistent: if the
// daemon dies, the kernel keeps forwarding with the last state it was given. The next
// daemon finds both, keeps agg0 with its routes and NAT instead of removing them as
// leftovers, loads its programs onto the pinned maps and swaps them into the pinned
// attachments, and retires the earlier run's sessions once its own have taken over
// (fastPath.retireAdopted).

// persistence is what this run keeps across restarts.
type persistence struct {
	dir   string // this instance's pin directory; "" when nothing is pinned
	adopt bool   // an earlier run's pins and tunnel interface are there to take over
}

// planPersistence decides it before the host is touched. Pins need the fast path (the
// XDP shield alone forwards nothing) and a BPF filesystem; without either, nothing is
// pinned and a restart starts afresh.
func planPersistence(log *slog.Logger, fastPath bool, pinRoot, tunName string) persistence {
	if !fastPath {
		return persistence{}
	}
	dir := instancePinDir(pinRoot, tunName)
	if err := bpf.CheckPinDir(dir); err != nil {
		log.Warn("fast path state not pinned: forwarding will stop whenever aggd stops or restarts", "err", err)
		return persistence{}
	}
	_, err := netlink.LinkByName(tunName)
	return persistence{dir: dir, adopt: err == nil && bpf.HasPins(dir)}
}

// instancePinDir is one daemon's directory under the pin root: per tunnel interface and
// network namespace, since daemons in several namespaces (containers, the tests) share
// one BPF filesystem.
func instancePinDir(pinRoot, tunName string) string {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		return filepath.Join(pinRoot, tunName)
	}
	return filepath.Join(pinRoot, fmt.Sprintf("%s-netns%d", tunName, st.Ino))
}

// dropUnwantedAttachments detaches what an adopted earlier run left attached where
// this run attaches nothing: its config, or the headend's choice of interfaces
// (headendInterfaces), changed in between. The earlier run's XDP shield and receive
// programs would otherwise go on running there, on a container's veth say, with nobody
// to take them off. Called once this run has attached to the interfaces it wants that
// are there; one that appears later gets a new attachment.
func dropUnwantedAttachments(log *slog.Logger, keep persistence, sh *shield, fp *fastPath) {
	if !keep.adopt {
		return
	}
	if sh == nil {
		// Nothing of this run is attached: the earlier run's programs, its transmit
		// program on agg0 too, would go on with sessions nobody programs any more.
		bpf.RemoveLinkPins(keep.dir, "")
		log.Warn("removed the earlier run's attachments: this run attaches no BPF program (see the shield's error above)")
		return
	}
	for hook, kept := range map[string][]string{"xdp": slices.Collect(maps.Keys(sh.attached())), "tc_ingress": fp.receiveInterfaces()} {
		for _, name := range bpf.RemoveLinkPinsExcept(keep.dir, hook, kept) {
			log.Info("removed an earlier run's attachment this run does not want", "hook", hook, "interface", name)
		}
	}
}
