package daemon

import (
	"log/slog"
	"net/netip"

	"github.com/aggd/aggd/internal/bpf"
	"github.com/aggd/aggd/internal/fallback"
	"github.com/aggd/aggd/internal/nat"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tun"
)

// hostChanges records what the daemon changed on the host so that undo can revert it,
// in reverse order, on every exit path.
type hostChanges struct {
	log     *slog.Logger
	tunName string
	pinRoot string // bpf.pin_dir
	keep    persistence
	dev     *tun.Device
	nftOn   bool
}

// prepare readies the host for this run: an earlier run's fast path is adopted when
// this run pins its own (persistence), and its leftovers are removed otherwise.
func (h *hostChanges) prepare(keep persistence) {
	h.keep = keep
	if keep.adopt {
		// agg0, its routes and the NAT table carry the traffic the pinned programs still
		// forward: keep them. They are set again below, each step idempotent.
		h.log.Info("adopting the fast path an earlier run left pinned: its tunnel interface, routes and NAT stay, and the kernel keeps forwarding meanwhile",
			"interface", h.tunName, "pins", keep.dir)
		if err := fallback.Remove(); err != nil {
			h.log.Warn("could not remove leftover direct-routing rules", "err", err)
		}
		return
	}
	h.removeLeftovers()
}

// removeLeftovers deletes what a previous run that crashed may have left behind: the
// tunnel interface, routes marked as aggd's, aggd's nftables table, and pinned BPF
// state (unpinning detaches the programs it attached).
func (h *hostChanges) removeLeftovers() {
	stale := instancePinDir(h.pinRoot, h.tunName)
	if bpf.HasPins(stale) {
		if err := bpf.RemovePins(stale); err != nil {
			h.log.Warn("could not remove the pinned fast path of an earlier run", "err", err)
		} else {
			h.log.Info("removed the pinned fast path of an earlier run", "pins", stale)
		}
	}
	if existed, err := netcfg.DeleteLink(h.tunName); err != nil {
		h.log.Warn("could not remove leftover tunnel interface", "interface", h.tunName, "err", err)
	} else if existed {
		h.log.Info("removed leftover tunnel interface from an earlier run", "interface", h.tunName)
	}
	if n, err := netcfg.RemoveOwnRoutes(); err != nil {
		h.log.Warn("could not remove leftover routes", "err", err)
	} else if n > 0 {
		h.log.Info("removed leftover routes from an earlier run", "routes", n)
	}
	if err := fallback.Remove(); err != nil {
		h.log.Warn("could not remove leftover direct-routing rules", "err", err)
	}
	if existed, err := nat.Remove(); err != nil {
		h.log.Warn("could not remove leftover nftables table", "table", nat.TableName, "err", err)
	} else if existed {
		h.log.Info("removed leftover nftables table from an earlier run", "table", "inet "+nat.TableName)
	}
}

// tunnel creates and configures the tunnel interface. Forwarding is switched on because
// both roles route between agg0 and their other interfaces.
func (h *hostChanges) tunnel(mtu int, addrs []netip.Prefix) (*tun.Device, error) {
	dev, err := tun.Open(h.tunName)
	if err != nil {
		return nil, err
	}
	h.dev = dev
	if h.keep.dir != "" {
		if err := dev.SetPersistent(true); err != nil {
			h.log.Warn("tunnel interface not persistent: forwarding will stop whenever aggd stops or restarts", "err", err)
		}
	}
	if err := netcfg.ConfigureTunnel(dev.Name(), mtu, addrs); err != nil {
		return nil, err
	}
	if err := netcfg.EnableForwarding(); err != nil {
		return nil, err
	}
	return dev, nil
}

// netfilter installs aggd's nftables table: the masquerade rules (none when NAT is
// off) and the TCP MSS clamp on the tunnel interface. The clamp only spares the far
// ends path MTU discovery, so a kernel that cannot do it (no nft_rt or nft_exthdr)
// gets the masquerade alone, and a warning.
func (h *hostChanges) netfilter(rules []nat.Masquerade) error {
	err := nat.Install(rules, h.tunName)
	if err != nil {
		h.log.Warn("TCP MSS clamp on the tunnel not installed; TCP through it relies on path MTU discovery", "err", err)
		if len(rules) == 0 {
			return nil
		}
		if err := nat.Install(rules, ""); err != nil {
			return err
		}
	}
	h.nftOn = true
	return nil
}

// undo reverts everything; deleting the TUN device takes its routes with it. The pins
// go last, after the programs were detached.
func (h *hostChanges) undo() {
	if h.nftOn {
		if _, err := nat.Remove(); err != nil {
			h.log.Warn("could not remove nftables table", "err", err)
		}
	}
	if _, err := netcfg.RemoveOwnRoutes(); err != nil {
		h.log.Warn("could not remove routes", "err", err)
	}
	if h.dev != nil {
		h.dev.Close()
		if _, err := netcfg.DeleteLink(h.tunName); err != nil {
			h.log.Warn("could not remove tunnel interface", "err", err)
		}
	}
	if err := bpf.RemovePins(h.keep.dir); err != nil {
		h.log.Warn("could not remove the fast path's pins", "err", err)
	}
	h.log.Info("host configuration removed")
}
