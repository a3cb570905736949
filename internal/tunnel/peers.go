package tunnel

import (
	"slices"

	"github.com/aggd/aggd/internal/handshake"
)

// peerSet is the headend's view of its configured CPEs: who may handshake, and which
// peer each inner destination belongs to. It is never changed in place: SetPeers
// builds a new one.
type peerSet struct {
	byName map[string]*Peer
	byKey  map[handshake.PublicKey]*Peer
	routes prefixTable // inner destination -> peer name
}

func newPeerSet(peers []Peer) *peerSet {
	ps := &peerSet{byName: make(map[string]*Peer, len(peers)), byKey: make(map[handshake.PublicKey]*Peer, len(peers))}
	for i := range peers {
		p := &peers[i]
		ps.byName[p.Name] = p
		ps.byKey[p.Key] = p
		for _, pfx := range p.Prefixes {
			ps.routes.add(pfx, p.Name)
		}
	}
	return ps
}

func (ps *peerSet) keys() []handshake.PublicKey {
	keys := make([]handshake.PublicKey, 0, len(ps.byKey))
	for k := range ps.byKey {
		keys = append(keys, k)
	}
	return keys
}

// PeerChanges says what SetPeers changed, by peer name.
type PeerChanges struct {
	Added, Removed, Changed []string
}

// SetPeers replaces the CPEs the headend accepts, as a config reload does, without
// touching the others' sessions. A new peer can handshake at once. A removed one's
// session is closed, its handshakes are refused from now on, and its metrics go. A
// peer whose key or prefixes changed has its session closed and its metrics reset:
// its CPE handshakes again (it notices within a few probe intervals) and gets a
// session with the new settings.
func (h *Headend) SetPeers(peers []Peer) PeerChanges {
	next := newPeerSet(peers)
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.peers.Load()
	var ch PeerChanges
	for name, p := range old.byName {
		switch q := next.byName[name]; {
		case q == nil:
			ch.Removed = append(ch.Removed, name)
		case q.Key != p.Key || !slices.Equal(q.Prefixes, p.Prefixes):
			ch.Changed = append(ch.Changed, name)
		}
	}
	for name := range next.byName {
		if old.byName[name] == nil {
			ch.Added = append(ch.Added, name)
		}
	}
	// Refuse the removed keys before their sessions go, so that no new one starts.
	h.resp.SetAllowed(next.keys())
	h.peers.Store(next)
	closeFor := func(names []string, why string) {
		for _, name := range names {
			if s := h.byPeer[name]; s != nil {
				delete(h.byIndex, s.localIndex)
				delete(h.byPeer, name)
				s.close()
				h.log.Info("session closed by a config reload", "peer", name, "why", why)
			}
		}
	}
	closeFor(ch.Removed, "peer removed")
	closeFor(ch.Changed, "its key or prefixes changed: the CPE handshakes again")
	h.m.Sessions.Set(float64(len(h.byPeer)))
	// A closed session's series would stay frozen at their last values (its links
	// shown up); a changed peer's come back with its new session.
	for _, name := range slices.Concat(ch.Removed, ch.Changed) {
		h.m.ForgetPeer(name)
	}
	for _, name := range slices.Concat(ch.Added, ch.Changed) {
		h.m.PeerSession.WithLabelValues(name).Set(0)
	}
	slices.Sort(ch.Added)
	slices.Sort(ch.Removed)
	slices.Sort(ch.Changed)
	return ch
}
