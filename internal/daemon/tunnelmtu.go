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
//   - up only once the uplinks have allowed more than the tunnel's MTU for
//     tunnel.mtu_raise_after (the small uplink's interface went away, or its MTU
//     grew). A PPPoE line's interface goes away at every reconnect and comes back with
//     the same MTU; each change costs the LAN's connections a round of path MTU
//     discovery, so the tunnel keeps the lower MTU through short absences.
//
// What the headend is told of each uplink (LINK_PARAMS) follows: no uplink takes more
// than the tunnel, and an uplink whose interface has been gone for the same wait is
// announced as unknown, so that the headend's route to this CPE goes up too (also
// with tunnel.mtu set). An uplink that comes back announces its MTU at once.

// innerMTUs is what each uplink carries now (its MTU less the outer headers); 0 for an
// uplink whose interface is missing and whose config sets no mtu. An uplink not bound
// yet whose interface is there counts, as at the start: it carries traffic as soon as
// it has an address.
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
// MTUs, with an Ethernet-sized line assumed for a missing one (as at the start), and
// never below IPv6's 1280 (warnTooSmall says why an uplink is left below it). by is
// the uplink that sets it.
func (uw *uplinkWatch) wantedMTU(inner []int) (mtu, by int) {
	for id, in := range inner {
		if in == 0 {
			in = assumedUplinkMTU - wire.OverheadFor(uw.cpe.UplinkSource(id))
		}
		in = max(in, config.MinMTUIPv6)
		if mtu == 0 || in < mtu {
			mtu, by = in, id
		}
	}
	return mtu, by
}

// reviewMTU brings the tunnel's MTU, and what the headend is told, in line with the
// uplinks as they are now: it lowers an automatic MTU at once, and plans the wait
// after which it goes up, or a missing uplink is announced as unknown.
func (uw *uplinkWatch) reviewMTU() {
	inner := uw.innerMTUs()
	uw.warnTooSmall(inner)
	cur, err := netcfg.InterfaceMTU(uw.tunName)
	if err != nil {
		uw.log.Warn("cannot read the tunnel's MTU; the uplinks' MTUs are announced as they are", "err", err)
		uw.announceMTUs(inner, 1<<16-1, false)
		return
	}
	want, by := cur, -1
	if uw.autoMTU {
		want, by = uw.wantedMTU(inner)
	}
	switch {
	case want < cur:
		cur = uw.lowerTunnelMTU(by, want, cur)
		uw.raiseDue = nil
		if uw.missingAnnounced(inner) {
			uw.planWait(cur, cur)
		}
	case want > cur || uw.missingAnnounced(inner):
		uw.planWait(cur, want)
	default:
		uw.raiseDue = nil
	}
	uw.announceMTUs(inner, cur, false)
}

// warnTooSmall logs, once each time it happens, an uplink that carries less than
// IPv6's 1280 inside the tunnel: the tunnel does not follow it there.
func (uw *uplinkWatch) warnTooSmall(inner []int) {
	for id, in := range inner {
		small := in > 0 && in < config.MinMTUIPv6
		if small && !uw.tooSmall[id] {
			uplinkMTU := in + wire.OverheadFor(uw.cpe.UplinkSource(id))
			uw.log.Error(fmt.Sprintf("uplink MTU %d leaves %d for the tunnel, below IPv6's 1280: the tunnel stays at 1280 or more and the link's full-size packets will not fit; "+
				"set tunnel.mtu, or leave this uplink out", uplinkMTU, in), "link", uw.uplinks[id].Name)
		}
		uw.tooSmall[id] = small
	}
}

// missingAnnounced says whether an uplink whose interface is missing is still
// announced with an MTU.
func (uw *uplinkWatch) missingAnnounced(inner []int) bool {
	for id, in := range inner {
		if in == 0 && uw.cpe.UplinkMTU(id) != 0 {
			return true
		}
	}
	return false
}

// lowerTunnelMTU lowers the tunnel's MTU from cur to want, what uplink by carries, and
// returns the tunnel's MTU after.
func (uw *uplinkWatch) lowerTunnelMTU(by, want, cur int) int {
	if !uw.setTunnelMTU(want) {
		return cur
	}
	u := uw.uplinks[by]
	uw.log.Warn("tunnel MTU lowered to fit the uplink (set uplinks[].mtu or tunnel.mtu to have it from the start)",
		"link", u.Name, "uplink_mtu", want+wire.OverheadFor(uw.cpe.UplinkSource(by)), "from", cur, "to", want)
	return want
}

// planWait has endWait run raiseAfter from now, unless a wait is under way already:
// endWait looks at the uplinks again then.
func (uw *uplinkWatch) planWait(cur, want int) {
	if uw.raiseDue != nil {
		return
	}
	uw.raiseDue = time.After(uw.raiseAfter)
	if want > cur {
		uw.log.Info("the uplinks allow a larger tunnel MTU; raising it if they still do after tunnel.mtu_raise_after",
			"from", cur, "to", want, "after", uw.raiseAfter)
	}
}

// endWait runs a planned wait after the uplinks first allowed a larger tunnel MTU, or
// an uplink's interface went: it raises the tunnel's MTU to what the uplinks allow
// now, and announces the uplinks still missing as unknown. An uplink whose interface
// came back smaller in the meantime has lowered the MTU (or kept it) at its own event.
func (uw *uplinkWatch) endWait() {
	inner := uw.innerMTUs()
	cur, err := netcfg.InterfaceMTU(uw.tunName)
	if err != nil {
		return
	}
	if want, _ := uw.wantedMTU(inner); uw.autoMTU && want > cur && uw.setTunnelMTU(want) {
		uw.log.Info("tunnel MTU raised: the uplinks have allowed it for tunnel.mtu_raise_after", "from", cur, "to", want, "after", uw.raiseAfter)
		cur = want
	}
	uw.announceMTUs(inner, cur, true)
}

// setTunnelMTU sets the tunnel interface's MTU and tells the fast path.
func (uw *uplinkWatch) setTunnelMTU(mtu int) bool {
	if err := netcfg.SetMTU(uw.tunName, mtu); err != nil {
		uw.log.Warn("cannot change the tunnel MTU to fit the uplinks; it is tried again at the next uplink event", "to", mtu, "err", err)
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
