package tunnel

import (
	"sync"

	"github.com/aggd/aggd/internal/wire"
)

// Link names across the tunnel. A CPE's uplinks have names ("dsl", "lte") that the
// headend cannot know from the link ids on the wire, so its metrics call them link0,
// link1, ... by id. The CPE sends LINK_NAMES; each side exports aggd_link_info{peer,
// link, name} = 1 per link, where name is the owner's name for it (the CPE's own; on
// the headend link<id> until the CPE has named it), so that `aggd status` and a
// dashboard can show the CPE's names next to the headend's figures. The link label of
// the other metrics stays as it was: renaming it would break every series mid-session.
// The headend's log lines about a named link carry both, link=link1 name=cable.

// peerLinkNames holds what the peer called its links, also for links not created yet
// (a LINK_NAMES can arrive before a link's first packet).
type peerLinkNames struct {
	mu   sync.Mutex
	byID map[uint8]string
	// shown is the name each link's info series carries now.
	shown map[uint8]string
	// closed is set when the session closes: a LINK_NAMES still being handled then
	// must not bring back the info series that a reload's ForgetPeer deletes next.
	closed bool
}

// close stops the names from being shown any more.
func (n *peerLinkNames) close() {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
}

// showLinkName sets link l's info series to the peer's name for it, if the peer gave
// one, else to the link's own name (a new link, or on the CPE).
func (s *Session) showLinkName(l *link) {
	n := &s.linkNames
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return
	}
	name, ok := n.byID[l.spec.ID]
	if !ok {
		name = l.spec.Name
	}
	old, had := n.shown[l.spec.ID]
	if had && old == name {
		return
	}
	if had {
		s.m.LinkInfo.DeleteLabelValues(s.cfg.Peer, l.spec.Name, old)
	}
	if n.shown == nil {
		n.shown = make(map[uint8]string)
	}
	n.shown[l.spec.ID] = name
	s.m.LinkInfo.WithLabelValues(s.cfg.Peer, l.spec.Name, name).Set(1)
	if name != l.spec.Name {
		// Every later line about the link carries the name too: an operator reading
		// "link down link=link1" should not have to look up which uplink that is.
		// link= stays the metrics' label.
		l.logged.Store(s.log.With("link", l.spec.Name, "name", name))
		l.logger().Info("link named by the peer")
	}
}

// onLinkNames records the peer's names for its links and shows them.
func (s *Session) onLinkNames(body wire.LinkNamesBody) {
	n := &s.linkNames
	n.mu.Lock()
	if n.byID == nil {
		n.byID = make(map[uint8]string)
	}
	for _, ln := range body.Links {
		n.byID[ln.LinkID] = ln.Name
	}
	n.mu.Unlock()
	for _, ln := range body.Links {
		if l := s.link(ln.LinkID); l != nil {
			s.showLinkName(l)
		}
	}
}

// sendLinkNames sends our links' names to the peer on link l.
func (s *Session) sendLinkNames(l *link, names []wire.LinkName) {
	body := wire.LinkNamesBody{Counter: s.txCtrl.Add(1), Links: names}
	s.sendControl(l, wire.TypeLinkNames, 0, 0, body.Append(nil))
}
