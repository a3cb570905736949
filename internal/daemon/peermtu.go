package daemon

import (
	"log/slog"
	"sync"

	"github.com/aggd/aggd/internal/netcfg"
	"github.com/aggd/aggd/internal/tunnel"
)

// peerMTUs keeps the headend's routes into the tunnel at the MTU of the CPE they lead
// to. agg0 has one MTU, sized for Ethernet uplinks, but a CPE with a PPPoE line (1492)
// or a mobile one takes less: its CPE announces the largest inner packet each uplink
// takes (LINK_PARAMS), and the routes to that CPE's prefixes get the smallest. The
// kernel then fragments larger packets, or tells their senders "fragmentation needed"
// / "packet too big", before they reach agg0; without it the datagram carrying such a
// packet would not fit the CPE's line (the fast path dropped it, userspace fragmented
// the datagram itself, and neither told the sender).
type peerMTUs struct {
	log     *slog.Logger
	tunName string
	tunMTU  int // agg0's MTU: a CPE taking this much or more needs no route MTU

	mu    sync.Mutex
	peers map[string]tunnel.Peer // the configured peers, by name
	mtu   map[string]int         // what each peer announced last, by name
}

func newPeerMTUs(log *slog.Logger, tunName string, tunMTU int, peers []tunnel.Peer) *peerMTUs {
	p := &peerMTUs{log: log, tunName: tunName, tunMTU: tunMTU, mtu: make(map[string]int)}
	p.setPeers(peers)
	return p
}

// announced is the session's PeerMTU: peer's links take at most mtu bytes now.
func (p *peerMTUs) announced(peer string, mtu int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mtu[peer] = mtu
	pr, ok := p.peers[peer]
	if !ok {
		return
	}
	switch {
	case mtu == 0:
		p.log.Info("peer announces no MTU for its links: its routes into the tunnel take the tunnel's", "peer", peer, "tunnel_mtu", p.tunMTU)
	case mtu < p.tunMTU:
		p.log.Info("peer's links take smaller packets than the tunnel: its routes into the tunnel get their MTU",
			"peer", peer, "mtu", mtu, "tunnel_mtu", p.tunMTU)
	default:
		p.log.Info("peer's links take full-size tunnel packets", "peer", peer, "mtu", mtu, "tunnel_mtu", p.tunMTU)
	}
	p.apply(pr, mtu)
}

// reload swaps the routes into the tunnel for the reloaded peers' (swapPeerRoutes) and
// gives every peer whose MTU is known its MTU again (new prefixes come without one).
// Both under mu: an announcement in between would re-create a removed peer's routes.
func (p *peerMTUs) reload(next []tunnel.Peer) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := make([]tunnel.Peer, 0, len(p.peers))
	for _, pr := range p.peers {
		old = append(old, pr)
	}
	err := swapPeerRoutes(p.tunName, old, next)
	p.setPeersLocked(next)
	return err
}

func (p *peerMTUs) setPeers(peers []tunnel.Peer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setPeersLocked(peers)
}

// setPeersLocked makes peers the configured ones and gives the routes of each whose MTU
// is known that MTU. Caller holds mu.
func (p *peerMTUs) setPeersLocked(peers []tunnel.Peer) {
	p.peers = make(map[string]tunnel.Peer, len(peers))
	for _, pr := range peers {
		p.peers[pr.Name] = pr
		if mtu, ok := p.mtu[pr.Name]; ok {
			p.apply(pr, mtu)
		}
	}
	for name := range p.mtu {
		if _, ok := p.peers[name]; !ok {
			delete(p.mtu, name)
		}
	}
}

// apply sets the MTU of the peer's routes: mtu if it is below the tunnel's, else none
// (a route MTU above the interface's would let larger packets at it; 0 is unknown).
// Caller holds mu.
func (p *peerMTUs) apply(pr tunnel.Peer, mtu int) {
	routeMTU := mtu
	if mtu >= p.tunMTU {
		routeMTU = 0
	}
	if err := netcfg.AddRoutesMTU(p.tunName, pr.Prefixes, 0, routeMTU); err != nil {
		p.log.Warn("cannot set the MTU of a peer's routes into the tunnel; packets larger than its links take are lost on the way",
			"peer", pr.Name, "mtu", mtu, "err", err)
	}
}
