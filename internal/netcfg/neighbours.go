package netcfg

import (
	"errors"
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// FlushUnresolvedNeighbours deletes the interface's neighbour entries that are still
// being resolved (INCOMPLETE) or gave up (FAILED), in both families, and returns how
// many it deleted. Resolved, static and NOARP entries stay.
//
// Called when an uplink's carrier comes back. A packet sent in the moment between the
// interface going down and the daemon taking its link out of use (the transmit program
// redirects with bpf_redirect_neigh, which needs no route) leaves an INCOMPLETE entry
// whose first solicitation went nowhere: the kernel asks again only after its retrans
// time (a second by default), and everything sent to that next hop meanwhile waits in
// the entry's small queue or is dropped. Deleted, the entry is created afresh by the
// next packet or probe, and its solicitation goes out at once.
//
// olderThan spares the entries that entered their state less than that long ago (0:
// none): a recheck after the return deletes only those whose question went unanswered,
// not one a packet created a moment ago.
func FlushUnresolvedNeighbours(name string, olderThan time.Duration) (int, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		return 0, fmt.Errorf("netcfg: find uplink %s: %w", name, err)
	}
	neighs, err := netlink.NeighList(l.Attrs().Index, netlink.FAMILY_ALL)
	if err != nil {
		return 0, fmt.Errorf("netcfg: list the neighbours of %s: %w", name, err)
	}
	deleted := 0
	var errs []error
	for i := range neighs {
		n := &neighs[i]
		if n.State&(netlink.NUD_INCOMPLETE|netlink.NUD_FAILED) == 0 || neighbourAge(n) < olderThan {
			continue
		}
		if err := netlink.NeighDel(n); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("netcfg: delete neighbour %s on %s: %w", n.IP, name, err))
			continue
		}
		deleted++
	}
	return deleted, errors.Join(errs...)
}

// userHZ is the unit of a neighbour entry's times in netlink (NDA_CACHEINFO): clock
// ticks of USER_HZ, which is 100 on Linux whatever the kernel's own HZ.
const userHZ = 100

// neighbourAge is how long ago the entry entered its state.
func neighbourAge(n *netlink.Neigh) time.Duration {
	return time.Duration(n.Updated) * time.Second / userHZ
}
