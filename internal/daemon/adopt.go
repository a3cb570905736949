package daemon

import (
	"fmt"
	"time"
)

// adoptedState is what an earlier run left in the pinned maps: its sessions' transmit
// slots and receive indexes. The kernel keeps forwarding for them until this run's own
// sessions take their routes over, then they are retired.
type adoptedState struct {
	slots    []uint32 // transmit slots
	rx       []uint32 // receive indexes in the receive program's maps
	shield   []uint32 // receive indexes the XDP shield holds keys for
	deadline time.Time
}

// adoptGrace bounds how long an earlier run's session may keep its slot without being
// replaced: its peer re-handshakes within a few probe intervals of silence (a CPE after
// 3 × probe.down_after), so one still there after this is gone for good.
const adoptGrace = 30 * time.Second

// adopt takes stock of the earlier run's sessions in the pinned maps and keeps their
// transmit slots from being handed to new sessions.
func (f *fastPath) adopt() error {
	slots, err := f.tx.SessionSlots()
	if err != nil {
		return fmt.Errorf("adopting the pinned fast path: %w", err)
	}
	rx, err := f.rx.Sessions()
	if err != nil {
		return fmt.Errorf("adopting the pinned fast path: %w", err)
	}
	shield, err := f.shield.Sessions()
	if err != nil {
		return fmt.Errorf("adopting the pinned fast path: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, slot := range slots {
		if slot < maxFastSessions {
			f.slots[slot] = true
		}
	}
	f.adopted = &adoptedState{slots: slots, rx: rx, shield: shield, deadline: time.Now().Add(adoptGrace)}
	f.log.Info("fast path: adopted the earlier run's pinned state; its sessions keep forwarding until this run's replace them",
		"sessions", len(slots), "receive_sessions", len(rx))
	return nil
}

// retireAdopted removes the earlier run's sessions that no longer carry anything: a
// transmit slot once no route points at it any more (a new session of this run took
// its prefixes) or the grace time is over; the receive and shield entries once every
// slot is gone (until then a peer may still be sending with the old session).
func (f *fastPath) retireAdopted() {
	f.mu.Lock()
	defer f.mu.Unlock()
	a := f.adopted
	if a == nil {
		return
	}
	routes, err := f.tx.RoutesPerSlot()
	expired := time.Now().After(a.deadline)
	kept := a.slots[:0]
	for _, slot := range a.slots {
		if err == nil && routes[slot] > 0 && !expired {
			kept = append(kept, slot)
			continue
		}
		if err := f.tx.DeleteRoutesTo(slot); err != nil {
			f.log.Warn("fast path: retiring an adopted session", "slot", slot, "err", err)
		}
		if err := f.tx.DeleteSession(slot); err != nil {
			f.log.Warn("fast path: retiring an adopted session", "slot", slot, "err", err)
		}
		if slot < maxFastSessions {
			f.slots[slot] = false
		}
	}
	a.slots = kept
	if len(kept) > 0 {
		return
	}
	for _, idx := range a.rx {
		if !f.open[idx] {
			if err := f.rx.DisableSession(idx); err != nil {
				f.log.Warn("fast path: retiring an adopted session", "session", idx, "err", err)
			}
		}
	}
	for _, idx := range a.shield {
		if !f.open[idx] {
			if err := f.shield.DeleteSession(idx); err != nil {
				f.log.Warn("fast path: retiring an adopted session", "session", idx, "err", err)
			}
		}
	}
	f.log.Info("fast path: the earlier run's sessions are retired; this run's carry the traffic", "expired", expired)
	f.adopted = nil
}
