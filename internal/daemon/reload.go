package daemon

import (
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"

	"github.com/aggd/aggd/internal/config"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tunnel"
)

// Config reload (SIGHUP, `systemctl reload aggd-headend`). A headend serves many CPEs,
// and adding a customer must not restart everyone's sessions: a reload applies the
// config's peers[] to the running headend (tunnel.Headend.SetPeers, and the routes of
// their prefixes into agg0). Everything else takes effect at the next restart; the
// reload says which of those settings differ. A config that does not validate changes
// nothing: the running one stays, and the log lists the problems.

// headendPeers turns the config's peers into the tunnel's: each routed its tunnel
// addresses and its routes.
func headendPeers(ps []config.Peer) []tunnel.Peer {
	out := make([]tunnel.Peer, 0, len(ps))
	for _, p := range ps {
		prefixes := append(append([]netip.Prefix{}, p.TunnelAddress...), p.Routes...)
		out = append(out, tunnel.Peer{Name: p.Name, Key: handshake.PublicKey(p.PublicKey), Prefixes: prefixes})
	}
	return out
}

// reloadPeersOnRequest applies the config file's peers each time opts.Reload fires,
// until ctx ends.
func reloadPeersOnRequest(ctx context.Context, log *slog.Logger, opts Options, running *config.Headend, he *tunnel.Headend, mtus *peerMTUs) {
	onEachReload(ctx, log, opts, config.LoadHeadend, func(next *config.Headend) {
		if keys := restartOnlyChanges(running, next, "peers"); len(keys) > 0 {
			log.Warn("reload: these settings changed but take effect only at a restart", "keys", strings.Join(keys, ", "))
		}
		if err := mtus.reload(headendPeers(next.Peers)); err != nil {
			log.Error("reload: routes into the tunnel not all updated", "err", err)
		}
		ch := he.SetPeers(headendPeers(next.Peers))
		log.Info("reload: peers applied", "peers", len(next.Peers),
			"added", ch.Added, "removed", ch.Removed, "changed", ch.Changed)
		running.Peers = next.Peers
	})
}

// onEachReload reads the config file each time opts.Reload fires, until ctx ends, and
// hands it to apply; a file with problems is logged and changes nothing.
func onEachReload[C any](ctx context.Context, log *slog.Logger, opts Options, load func(string) (C, error), apply func(C)) {
	if opts.Reload == nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-opts.Reload:
		}
		next, err := load(opts.ConfigPath)
		if err != nil {
			log.Error("reload: the config has problems; nothing changed, the running config stays", "file", opts.ConfigPath, "err", err)
			continue
		}
		apply(next)
	}
}

// swapPeerRoutes adds the routes of prefixes the new peers have and removes those only
// the old ones had.
func swapPeerRoutes(tunName string, old, next []tunnel.Peer) error {
	add, del := routeDiff(old, next)
	if err := netcfg.AddRoutes(tunName, add, 0); err != nil {
		return err
	}
	return netcfg.DelRoutes(tunName, del, 0)
}

// routeDiff returns the prefixes next routes that old did not, and those old routed
// that next does not, each sorted.
func routeDiff(old, next []tunnel.Peer) (add, del []netip.Prefix) {
	had, want := prefixSet(old), prefixSet(next)
	for p := range want {
		if !had[p] {
			add = append(add, p)
		}
	}
	for p := range had {
		if !want[p] {
			del = append(del, p)
		}
	}
	slices.SortFunc(add, netip.Prefix.Compare)
	slices.SortFunc(del, netip.Prefix.Compare)
	return add, del
}

func prefixSet(peers []tunnel.Peer) map[netip.Prefix]bool {
	set := make(map[netip.Prefix]bool)
	for _, p := range peers {
		for _, pfx := range p.Prefixes {
			set[pfx.Masked()] = true
		}
	}
	return set
}

// restartOnlyChanges lists the top-level config keys, other than except, whose values
// differ between running and next (pointers to the same config struct type).
func restartOnlyChanges(running, next any, except string) []string {
	a, b := reflect.ValueOf(running).Elem(), reflect.ValueOf(next).Elem()
	var keys []string
	for i := range a.NumField() {
		key, _, _ := strings.Cut(a.Type().Field(i).Tag.Get("yaml"), ",")
		if key == except {
			continue
		}
		if !reflect.DeepEqual(a.Field(i).Interface(), b.Field(i).Interface()) {
			keys = append(keys, key)
		}
	}
	return keys
}
