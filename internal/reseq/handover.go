package reseq

import "fmt"

// What the ordering handover with the kernel fast path needs
// (internal/handover): whether the resequencer holds anything, where it
// stands, and a restart at the point where the kernel handed the ordering
// over.
//
// While the kernel owns the ordering it delivers the in-order packets itself
// and the resequencer sees no data packets at all; when it hands over, the
// resequencer continues at the kernel's next expected number. Everything the
// resequencer learnt before is then about another era: the history of
// delivered and skipped numbers does not cover what the kernel delivered, and
// FIFO evidence bounds may lie anywhere relative to the new next (the
// kernel may have moved it by more than 2^31 meanwhile, so a bound cannot
// even be told to be behind or ahead). Restart forgets both.

// Empty reports whether the resequencer holds nothing: no packet waits in
// the buffer, no loss notice marks a number ahead and no sparse packet was
// delivered ahead. Only then may the ordering go back to the kernel: the
// kernel continues at Next and knows nothing of held packets, loss markers or
// numbers already delivered.
func (r *Resequencer) Empty() bool {
	return r.ring.held == 0 && r.ring.marked == 0 && r.ring.passed == 0
}

// Next returns the first sequence number not yet delivered or skipped.
func (r *Resequencer) Next() uint32 { return r.next }

// Restart continues at next, forgetting the history and the links' FIFO
// evidence (the links themselves, the hold time, the clock and the counters
// stay). Loss markers are dropped: they were relative to the old position
// and the sender's loss notices are only a shortcut past the hold timer.
//
// It must only be called when no packet is held (the handover protocol
// guarantees it: the daemon hands the ordering back only when empty, and
// resequences nothing until it learns the kernel handed over again); a held
// packet would otherwise be lost, so Restart panics instead.
func (r *Resequencer) Restart(next uint32) {
	if r.ring.held != 0 {
		panic(fmt.Sprintf("reseq: Restart(%d) with %d packets held: the ordering handover was broken", next, r.ring.held))
	}
	for i := range r.ring.slots {
		r.ring.slots[i] = slot{}
	}
	r.ring.head, r.ring.tail, r.ring.marked, r.ring.passed = none, none, 0, 0
	r.next = next
	r.hist = history{}
	r.ev.forget()
}
