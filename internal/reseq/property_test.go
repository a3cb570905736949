package reseq

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The property test drives a resequencer with a simulated sender: three FIFO links
// with their own base delay and random jitter, random loss of data and probes,
// redundant copies on a second link, periodic probes carrying watermarks, and
// truthful loss notices for some of the packets that were lost on every link. The
// hold timer fires exactly at the resequencer's deadlines.

type simEvent struct {
	at     int64
	order  int // emission order: keeps each link FIFO when arrival times tie
	kind   simKind
	link   uint8
	seq    uint32 // data: the sequence number; probe: the watermark; notice: the start
	flow   uint8  // data: the flow (0: bulk)
	sparse bool   // data: marked sparse
}

type simKind uint8

const (
	simData simKind = iota
	simProbe
	simNotice
)

type simParams struct {
	packets  int
	start    uint32
	loss     float64 // per transmission
	dupProb  float64 // chance a packet also goes on a second link
	hold     int64
	cfg      Config
	maxDelay int64 // base + jitter bound for every link
	// dieAt > 0: link 2 goes silent from that packet on (it stays in the session);
	// the sender notices and stops using it 2000 packets later.
	dieAt int
	// sparseEvery > 0: every sparseEvery-th packet is of a second flow, whose packets
	// the sender marks sparse (PushSparse) when the flow's previous one was sent
	// maxDelay or more before; the others are of the bulk flow.
	sparseEvery int
}

type simResult struct {
	delivered []uint32
	flows     []uint8         // each delivered packet's flow
	arrived   map[uint32]bool // sequence numbers with at least one copy arriving
	arrivals  int             // data packets pushed
	stats     Stats
}

func simulate(t *testing.T, seed uint64, p simParams) simResult {
	t.Helper()
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	const links = 3
	const interval = 100 * 1000 // one packet per 100 µs
	var base [links]int64
	for i := range base {
		base[i] = rng.Int64N(p.maxDelay * 3 / 4)
	}
	jitterMax := p.maxDelay / 4

	var events []simEvent
	var lastArrival [links]int64
	lostEverywhere := map[uint32]bool{}
	res := simResult{arrived: map[uint32]bool{}}
	dead := func(i int) bool { return p.dieAt > 0 && i >= p.dieAt }
	var i int // the packet being sent
	var flow uint8
	var sparse bool
	lastOfFlow := int64(-1 << 62) // when the second flow last sent
	emit := func(sent int64, kind simKind, link uint8, seq uint32) bool {
		if rng.Float64() < p.loss || (link == 2 && dead(i)) {
			return false
		}
		at := max(sent+base[link]+rng.Int64N(jitterMax+1), lastArrival[link]) // FIFO per link
		lastArrival[link] = at
		events = append(events, simEvent{at: at, order: len(events), kind: kind, link: link, seq: seq, flow: flow, sparse: sparse})
		return true
	}
	for i = 0; i < p.packets; i++ {
		seq := p.start + uint32(i)
		sent := int64(i) * interval
		inUse := links
		if dead(i - 2000) {
			inUse = links - 1 // link 2 is the last one
		}
		link := uint8(rng.IntN(inUse))
		flow, sparse = 0, false
		if p.sparseEvery > 0 && i%p.sparseEvery == 0 {
			flow, sparse = 1, sent-lastOfFlow >= p.maxDelay
			lastOfFlow = sent
		}
		arrived := emit(sent, simData, link, seq)
		if rng.Float64() < p.dupProb {
			other := (link + 1 + uint8(rng.IntN(inUse-1))) % uint8(inUse)
			arrived = emit(sent, simData, other, seq) || arrived
		}
		if arrived {
			res.arrived[seq] = true
		} else {
			lostEverywhere[seq] = true
			if rng.IntN(3) == 0 { // the sender finds out and says so
				events = append(events, simEvent{at: sent + rng.Int64N(p.maxDelay), order: len(events), kind: simNotice, seq: seq})
			}
		}
		flow, sparse = 0, false
		if i%50 == 49 {
			for l := range uint8(links) {
				emit(sent, simProbe, l, seq+1)
			}
		}
	}
	// Final probes that do arrive, so every number gets resolved (a dead link stays
	// silent: the timer resolves what it blocks).
	end := int64(p.packets) * interval
	for l := range uint8(links) {
		if l == 2 && dead(p.packets) {
			continue
		}
		at := max(end+base[l], lastArrival[l])
		events = append(events, simEvent{at: at, order: len(events), kind: simProbe, link: l, seq: p.start + uint32(p.packets)})
	}
	slices.SortStableFunc(events, func(a, b simEvent) int {
		return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.order, b.order))
	})

	r := New(p.cfg, p.start)
	r.SetLinks([]uint8{0, 1, 2})
	r.SetHold(p.hold)
	deliver := func(b []byte) {
		res.delivered = append(res.delivered, binary.BigEndian.Uint32(b[28:]))
		res.flows = append(res.flows, b[21]) // the UDP source port's low byte
	}
	payload := make([]byte, 200)
	payload[0], payload[9] = 0x45, 17 // IPv4, UDP: a flow the resequencer can name
	binary.BigEndian.PutUint16(payload[2:], uint16(len(payload)))
	for _, ev := range events {
		for { // the hold timer, fired at its exact deadline
			d, ok := r.NextDeadline()
			if !ok || d > ev.at {
				break
			}
			r.Expire(d, deliver)
		}
		switch ev.kind {
		case simData:
			binary.BigEndian.PutUint32(payload[28:], ev.seq)
			payload[21] = ev.flow
			if ev.sparse {
				r.PushSparse(ev.at, ev.seq, ev.link, payload, deliver)
			} else {
				r.Push(ev.at, ev.seq, ev.link, payload, deliver)
			}
			res.arrivals++
		case simProbe:
			r.Watermark(ev.at, ev.link, ev.seq, deliver)
		case simNotice:
			if !lostEverywhere[ev.seq] {
				t.Fatalf("simulator bug: notice for %d, which arrived", ev.seq)
			}
			r.Skip(ev.seq, 1, deliver)
		}
	}
	r.Expire(end+1e12, deliver)
	res.stats = r.Stats()
	return res
}

// checkSafety asserts what must hold whatever the timing: order within each flow
// (across flows too without sparse packets), no duplicates, and that every number and
// every arrival is accounted for.
func checkSafety(t *testing.T, p simParams, res simResult) {
	t.Helper()
	st := res.stats
	lastOf := map[uint8]uint32{}
	seen := map[uint32]bool{}
	for i, q := range res.delivered {
		if d := q - p.start; d >= uint32(p.packets) {
			t.Fatalf("delivered %d, never sent", q)
		}
		if seen[q] {
			t.Fatalf("delivered %d twice", q)
		}
		seen[q] = true
		if last, ok := lastOf[res.flows[i]]; ok && int32(q-last) <= 0 {
			t.Fatalf("flow %d: delivered %d after %d", res.flows[i], q, last)
		}
		lastOf[res.flows[i]] = q
		if p.sparseEvery == 0 && i > 0 && int32(q-res.delivered[i-1]) <= 0 {
			t.Fatalf("delivered %d after %d", q, res.delivered[i-1])
		}
		if !res.arrived[q] {
			t.Fatalf("delivered %d, which never arrived", q)
		}
	}
	if st.Delivered+st.LateCopies != uint64(len(res.delivered)) {
		t.Fatalf("Delivered = %d and LateCopies = %d, but %d were delivered", st.Delivered, st.LateCopies, len(res.delivered))
	}
	if st.Delivered+st.Lost != uint64(p.packets) {
		t.Fatalf("delivered %d + lost %d != %d sent", st.Delivered, st.Lost, p.packets)
	}
	if st.EvidenceSkips+st.TimeoutSkips+st.NoticeSkips+st.OverflowSkips != st.Lost {
		t.Fatalf("skips by reason do not add up to Lost: %+v", st)
	}
	if got := st.Delivered + st.LateCopies + st.Duplicates + st.Late + st.Stale + st.Bogus; got != uint64(res.arrivals) {
		t.Fatalf("%d arrivals but %d accounted for: %+v", res.arrivals, got, st)
	}
	if st.HeldPackets != 0 || st.HeldBytes != 0 {
		t.Fatalf("still holding at the end: %+v", st)
	}
}

func TestPropertyRandomLinks(t *testing.T) {
	p := simParams{
		packets: 20000, start: 0xffffffff - 7000, // wraps in the middle
		loss: 0.05, dupProb: 0.1,
		maxDelay: 40 * ms,
		hold:     60 * ms, // longer than any delay difference: the timer never gives up a packet in flight
		dieAt:    12000,
	}
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			res := simulate(t, seed, p)
			checkSafety(t, p, res)
			st := res.stats
			if len(res.delivered) != len(res.arrived) {
				t.Fatalf("delivered %d of the %d numbers that arrived (%+v)", len(res.delivered), len(res.arrived), st)
			}
			if st.Late != 0 || st.Stale != 0 || st.Bogus != 0 || st.OverflowSkips != 0 {
				t.Fatalf("a packet was given up while in flight: %+v", st)
			}
			if st.EvidenceSkips == 0 || st.NoticeSkips == 0 || st.TimeoutSkips == 0 || st.Duplicates == 0 || st.Held == 0 {
				t.Fatalf("the run did not exercise evidence, notices, timeouts, duplicates and holding: %+v", st)
			}
		})
	}
}

func TestPropertySparseFlowBesideABulkOne(t *testing.T) {
	// A sparse flow beside the bulk one: its marked packets pass the bulk's gaps, yet
	// each flow stays in order, nothing is delivered twice, and everything is counted.
	p := simParams{
		packets: 20000, start: 0xffffffff - 7000,
		loss: 0.05, dupProb: 0.1,
		maxDelay:    40 * ms,
		hold:        60 * ms,
		dieAt:       12000,
		sparseEvery: 97, // 9.7 ms apart: never marked; 401 and 1009: always
	}
	for _, every := range []int{97, 401, 1009} {
		p.sparseEvery = every
		for seed := range uint64(6) {
			t.Run(fmt.Sprint("every", every, "seed", seed), func(t *testing.T) {
				res := simulate(t, seed, p)
				checkSafety(t, p, res)
				if every > 400 && res.stats.Ahead == 0 {
					t.Fatalf("no sparse packet passed a gap: %+v", res.stats)
				}
			})
		}
	}
}

func TestPropertyUnderPressure(t *testing.T) {
	// A hold time far too short and a tiny buffer: packets get given up while in
	// flight and arrive late, yet order and accounting must survive.
	p := simParams{
		packets: 20000, start: 0x7ffff000,
		loss: 0.1, dupProb: 0.2,
		maxDelay: 40 * ms,
		hold:     2 * ms,
		cfg:      Config{MaxPackets: 20, MaxBytes: 3000},
	}
	for seed := range uint64(8) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			res := simulate(t, seed, p)
			checkSafety(t, p, res)
			st := res.stats
			if st.TimeoutSkips == 0 || st.OverflowSkips == 0 || st.Late == 0 {
				t.Fatalf("the run did not exercise timeouts, overflow and late arrivals: %+v", st)
			}
		})
	}
}
