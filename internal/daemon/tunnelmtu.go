package daemon

import (
	"fmt"
	"time"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/wire"
)

// The CPE's automatic tunnel MTU (tunnel.mtu 0) is the largest inner packet the
// smallest of its uplinks carries. It follows the uplinks as they change:
//
//   - down at once when an uplink carries less: a packet the tunnel takes must fit
//     every uplink it may be striped on. New connections then use the lower MTU, and
//     the kernel tells the senders of larger packets (path MTU discovery).
//   - up only once the uplinks have allowed more for tunnel.mtu_raise_after (the small
//     uplink's interface went away, or its MTU grew). A PPPoE line's interface goes
//     away at every reconnect and comes back with the same MTU; each change costs the
//     LAN's connections a round of path MTU discovery, so the tunnel keeps the lower
//     MTU through short absences.
//
// What the headend is told of each uplink (LINK_PARAMS) follows: no uplink takes more
// than the tunnel, and an uplink whose interface is gone when the MTU goes up is
// announced as unknown, so that the headend's route to this CPE goes up too.

// innerMTUs is what each uplink carries now (its MTU less the outer headers); 0 for an
// uplink whose interface is missing and whose config sets no mtu.
func (uw *uplinkWatch) innerMTUs() []int {
	inner := make([]int, len(uw.uplinks))
	for id, u := range uw.uplinks {
		if mtu, err := innerMTU(u, uw.cpe.UplinkSource(id)); err == nil {
			inner[id] = mtu
		}
	}
	return inner
}

// wantedMTU is the automatic tunnel MTU the uplinks allow: the smallest of their inner
// MTUs, with an Ethernet-sized line assumed for a missing one (as at the start). by
// is the uplink that sets it.
func (uw *uplinkWatch) wantedMTU(inner []int) (mtu, by int) {
	for id, in := range inner {
		if in == 0 {
			in = assumedUplinkMTU - wire.OverheadFor(uw.cpe.UplinkSource(id))
		}
		if mtu == 0 || in < mtu {
			mtu, by = in, id
		}
	}
	return mtu, by
}

// reviewMTU brings the tunnel's MTU, and what the headend is told, in line with the
// uplinks as they are now: it lowers an automatic MTU at once, and plans a raise.
func (uw *uplinkWatch) reviewMTU() {
	inner := uw.innerMTUs()
	cur, err := netcfg.InterfaceMTU(uw.tunName)
	if err != nil {
		uw.log.Warn("cannot read the tunnel's MTU; the uplinks' MTUs are announced as they are", "err", err)
		uw.announceMTUs(inner, 1<<16-1, false)
		return
	}
	if uw.autoMTU {
		want, by := uw.wantedMTU(inner)
		switch {
		case want < cur:
			cur = uw.lowerTunnelMTU(by, want, cur)
			uw.raiseDue = nil
		case want > cur:
			uw.planRaise(cur, want)
		default:
			uw.raiseDue = nil
		}
	}
	uw.announceMTUs(inner, cur, false)
}

// lowerTunnelMTU lowers the tunnel's MTU from cur to want, what uplink by carries, and
// returns the tunnel's MTU after.
func (uw *uplinkWatch) lowerTunnelMTU(by, want, cur int) int {
	u := uw.uplinks[by]
	uplinkMTU := want + wire.OverheadFor(uw.cpe.UplinkSource(by))
	if want < config.MinMTUIPv6 {
		uw.log.Error(fmt.Sprintf("uplink MTU %d leaves %d for the tunnel, below IPv6's 1280: the tunnel stays at %d and the link's full-size packets will not fit; "+
			"set tunnel.mtu, or leave this uplink out", uplinkMTU, want, cur), "link", u.Name)
		return cur
	}
	if !uw.setTunnelMTU(want) {
		return cur
	}
	uw.log.Warn("tunnel MTU lowered to fit the uplink (set uplinks[].mtu or tunnel.mtu to have it from the start)",
		"link", u.Name, "uplink_mtu", uplinkMTU, "from", cur, "to", want)
	return want
}

// planRaise has the tunnel's MTU go up raiseAfter from now, unless a raise is planned
// already: the uplinks must allow more for the whole wait (raiseTunnelMTU looks again).
func (uw *uplinkWatch) planRaise(cur, want int) {
	if uw.raiseDue != nil {
		return
	}
	uw.raiseDue = time.After(uw.raiseAfter)
	uw.log.Info("the uplinks allow a larger tunnel MTU; raising it if they still do after tunnel.mtu_raise_after",
		"from", cur, "to", want, "after", uw.raiseAfter)
}

// raiseTunnelMTU raises the tunnel's MTU to what the uplinks allow now, a planned
// wait after they first allowed more. An uplink whose interface came back smaller in
// the meantime has lowered it (or kept it) at its own event.
func (uw *uplinkWatch) raiseTunnelMTU() {
	inner := uw.innerMTUs()
	want, _ := uw.wantedMTU(inner)
	cur, err := netcfg.InterfaceMTU(uw.tunName)
	if err != nil || want <= cur || !uw.setTunnelMTU(want) {
		return
	}
	uw.log.Info("tunnel MTU raised: the uplinks have allowed it for tunnel.mtu_raise_after", "from", cur, "to", want, "after", uw.raiseAfter)
	uw.announceMTUs(inner, want, true)
}

// setTunnelMTU sets the tunnel interface's MTU and tells the fast path.
func (uw *uplinkWatch) setTunnelMTU(mtu int) bool {
	if err := netcfg.SetMTU(uw.tunName, mtu); err != nil {
		uw.log.Warn("cannot change the tunnel MTU to fit the uplinks", "to", mtu, "err", err)
		return false
	}
	if uw.mtuChanged != nil {
		uw.mtuChanged(mtu)
	}
	return true
}

// announceMTUs sets what the headend is told of each uplink: what it carries, but no
// more than the tunnel (tun). An uplink whose interface is missing keeps what it had,
// capped at the tunnel's, or, with forgetMissing, is announced as unknown.
func (uw *uplinkWatch) announceMTUs(inner []int, tun int, forgetMissing bool) {
	for id, in := range inner {
		switch {
		case in > 0:
			uw.cpe.SetUplinkMTU(id, min(in, tun))
		case forgetMissing:
			uw.cpe.SetUplinkMTU(id, 0)
		default:
			uw.cpe.SetUplinkMTU(id, min(uw.cpe.UplinkMTU(id), tun))
		}
	}
}
