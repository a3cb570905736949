package reseq

// The buffer is a ring of slots indexed by sequence number modulo its length, which
// covers the sequence numbers [next, next+len). Held slots are also threaded on a
// list in arrival order, so the oldest held packet (whose age decides the hold
// timer) is found in O(1) without scanning.

// slotState is what the resequencer knows about one sequence number ahead of next.
type slotState uint8

const (
	empty      slotState = iota // nothing yet
	held                        // the packet is here, waiting for the gap before it
	lostMarked                  // a loss notice said it will never come
	passed                      // a sparse packet, delivered ahead of the gap before it
)

// none ends the arrival list.
const none = int32(-1)

// minRing is the ring's first size: enough for everyday reordering.
const minRing = 64

type slot struct {
	buf        []byte // the held packet's copy
	arrival    int64  // when it was held (or passed)
	prev, next int32  // neighbours in the arrival list
	state      slotState
	bucket     uint16 // a held packet's flow bucket + 1 (0: no flow; flows.go)
}

type ring struct {
	slots  []slot // length 0 or a power of two
	head   int32  // oldest held slot
	tail   int32  // newest held slot
	held   int    // held slots
	marked int    // lostMarked slots
	passed int    // passed slots
}

// stateAt returns the state of seq, which must not be before base (= next).
// Numbers the ring does not reach yet are empty.
func (g *ring) stateAt(base, seq uint32) slotState {
	if seq-base >= uint32(len(g.slots)) {
		return empty
	}
	return g.slots[g.index(seq)].state
}

// at returns seq's slot; the ring must cover seq.
func (g *ring) at(seq uint32) *slot { return &g.slots[g.index(seq)] }

func (g *ring) index(seq uint32) int32 { return int32(seq & uint32(len(g.slots)-1)) }

// ensure makes the ring cover base+d, growing it (by powers of two, up to maxSpan;
// the caller guarantees d < maxSpan). Growing allocates; a session reaches its
// working size quickly and stays there.
func (g *ring) ensure(base, d, maxSpan uint32) {
	if d < uint32(len(g.slots)) {
		return
	}
	g.grow(base, min(max(nextPow2(d+1), minRing), maxSpan))
}

// grow moves every occupied slot into a ring of size n and rebuilds the arrival list
// in the same order.
func (g *ring) grow(base, n uint32) {
	old := g.slots
	oldMask := uint32(len(old) - 1)
	ng := ring{slots: make([]slot, n), head: none, tail: none, held: g.held, marked: g.marked, passed: g.passed}
	seqOf := func(i int32) uint32 { return base + (uint32(i)-base)&oldMask }
	for i := g.head; i != none; i = old[i].next {
		j := ng.index(seqOf(i))
		ng.slots[j] = slot{buf: old[i].buf, arrival: old[i].arrival, state: old[i].state, bucket: old[i].bucket}
		ng.link(j)
	}
	for i := range old {
		if old[i].state == lostMarked {
			ng.slots[ng.index(seqOf(int32(i)))].state = lostMarked
		}
	}
	*g = ng
}

// put holds buf as seq, the newest arrival, of flow bucket b (flows.go).
func (g *ring) put(seq uint32, buf []byte, arrival int64, b uint16) {
	i := g.index(seq)
	g.slots[i] = slot{buf: buf, arrival: arrival, state: held, bucket: b}
	g.link(i)
	g.held++
}

// take removes the held packet seq and returns its buffer, arrival time and flow
// bucket.
func (g *ring) take(seq uint32) ([]byte, int64, uint16) {
	i := g.index(seq)
	s := &g.slots[i]
	buf, arrival, b := s.buf, s.arrival, s.bucket
	g.unlink(i)
	*s = slot{}
	g.held--
	return buf, arrival, b
}

// pass records seq as delivered ahead of the gap before it. It joins the arrival list
// like a held packet, so that the hold timer still gives that gap up in time: nothing
// else may be held behind it to start the timer.
func (g *ring) pass(seq uint32, arrival int64) {
	i := g.index(seq)
	g.slots[i] = slot{arrival: arrival, state: passed}
	g.link(i)
	g.passed++
}

// unpass clears the passed slot seq, which next has reached.
func (g *ring) unpass(seq uint32) {
	i := g.index(seq)
	g.unlink(i)
	g.slots[i] = slot{}
	g.passed--
}

// link appends slot i to the arrival list.
func (g *ring) link(i int32) {
	g.slots[i].prev, g.slots[i].next = g.tail, none
	if g.tail == none {
		g.head = i
	} else {
		g.slots[g.tail].next = i
	}
	g.tail = i
}

// unlink removes slot i from the arrival list.
func (g *ring) unlink(i int32) {
	s := &g.slots[i]
	if s.prev == none {
		g.head = s.next
	} else {
		g.slots[s.prev].next = s.next
	}
	if s.next == none {
		g.tail = s.prev
	} else {
		g.slots[s.next].prev = s.prev
	}
}

// pool recycles packet buffers, so holding a packet does not allocate once the
// session has held as many at once before. It keeps at most limit bytes idle.
type pool struct {
	free      [][]byte
	freeBytes int
	limit     int
}

// minBufCap fits any packet an Ethernet-MTU tunnel carries, so buffers are
// interchangeable.
const minBufCap = 2048

func (p *pool) get(n int) []byte {
	if k := len(p.free); k > 0 && cap(p.free[k-1]) >= n {
		b := p.free[k-1]
		p.free[k-1] = nil
		p.free = p.free[:k-1]
		p.freeBytes -= cap(b)
		return b[:n]
	}
	return make([]byte, n, max(n, minBufCap))
}

func (p *pool) put(b []byte) {
	if p.freeBytes+cap(b) > p.limit {
		return // enough idle memory already; let this one go
	}
	p.free = append(p.free, b)
	p.freeBytes += cap(b)
}
