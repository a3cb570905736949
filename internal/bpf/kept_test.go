package bpf

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"

	"github.com/aggd/aggd/internal/wire"
)

// The transmit program keeps every packet it sends in its session's ring, under the
// packet's global sequence number, until the packet KeptPackets numbers later takes
// its place; a packet longer than KeptBytes is not kept, a session without a ring
// keeps nothing, and a new ring holds nothing of the one it replaced.
func TestTxKeepsWhatItSends(t *testing.T) {
	tx := loadTxT(t)
	setTxSession(t, tx, 3, TxSession{Enabled: true, PeerIndex: 3, KeyID: 1, Key: testKey, MTU: 9000,
		Links: []TxLink{l3Link(1, 10e6), l3Link(2, 10e6)}})
	setTxRoute(t, tx, "0.0.0.0/0", 3)
	setTxRoute(t, tx, "::/0", 3)
	if _, err := tx.Kept(3, []uint32{0}); err == nil {
		t.Fatal("a session without a ring returned kept packets")
	}
	if err := tx.EnableKept(3); err != nil {
		t.Fatal(err)
	}
	txSeq(t, tx, 3).Set(0xffffff00) // across the wrap of the global numbers

	sent := map[uint32][]byte{} // global sequence number -> inner packet
	var seqs []uint32
	send := func(inner []byte) uint32 {
		t.Helper()
		seq := sendSeq(t, tx, inner, 20)
		sent[seq] = inner
		seqs = append(seqs, seq)
		return seq
	}
	for i := range KeptPackets + 40 {
		inner := inner4(netip.MustParseAddr("8.8.8.8"), 100+i%1000)
		inner[len(inner)-1] = byte(i) // every packet its own bytes
		send(inner)
	}
	got, err := tx.Kept(3, seqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, seq := range seqs {
		want := sent[seq]
		if i < 40 {
			want = nil // its element holds the packet KeptPackets later
		}
		if !bytes.Equal(got[i], want) {
			t.Errorf("packet %d (seq %#x): kept %d bytes, want %d", i, seq, len(got[i]), len(want))
		}
	}

	// Too long to keep: nothing answers to its number, nor any more to the number of
	// the packet that had its element before.
	long := send(inner4(netip.MustParseAddr("8.8.8.8"), KeptBytes))
	if got, err := tx.Kept(3, []uint32{long, long - KeptPackets, long - 1}); err != nil || got[0] != nil || got[1] != nil || got[2] == nil {
		t.Errorf("after a %d-byte packet: kept %v, %v; want only the packet before it", KeptBytes+28, lens(got), err)
	}
	v6 := send(inner6(netip.MustParseAddr("2001:db8::8"), 300))
	if got, err := tx.Kept(3, []uint32{v6}); err != nil || !bytes.Equal(got[0], sent[v6]) {
		t.Errorf("IPv6 packet: kept %v, %v", lens(got), err)
	}

	// Behind an outer IPv6 header (20 bytes longer) as well.
	setTxSession(t, tx, 4, TxSession{Enabled: true, PeerIndex: 4, KeyID: 1, Key: testKey, MTU: 1500,
		Links: []TxLink{l3Link6(1, 10e6)}})
	setTxRoute(t, tx, "198.51.100.0/24", 4)
	if err := tx.EnableKept(4); err != nil {
		t.Fatal(err)
	}
	inner := inner4(netip.MustParseAddr("198.51.100.9"), 500)
	if got, err := tx.Kept(4, []uint32{sendSeq(t, tx, inner, 40)}); err != nil || !bytes.Equal(got[0], inner) {
		t.Errorf("packet sent over IPv6: kept %v, %v", lens(got), err)
	}

	// A new session in the slot starts with an empty ring, whatever numbers it sends.
	if err := tx.EnableKept(3); err != nil {
		t.Fatal(err)
	}
	if got, err := tx.Kept(3, seqs[KeptPackets:]); err != nil || slices.ContainsFunc(got, func(p []byte) bool { return p != nil }) {
		t.Errorf("a new ring holds the old session's packets: %v, %v", lens(got), err)
	}

	if err := tx.DeleteSession(3); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Kept(3, seqs); err == nil {
		t.Error("the kept packets outlived their session")
	}
}

// A ring element is taken only when both its numbers name the packet asked for: a
// writer sets seq_tail first and seq_head last, so an element read while a CPU wrote it
// has different ones.
func TestKeptPacketReadWhole(t *testing.T) {
	elem := func(head, tail uint64, n uint32) []byte {
		v := make([]byte, keptValueSize)
		binary.NativeEndian.PutUint64(v[0:], head)
		binary.NativeEndian.PutUint32(v[8:], n)
		binary.NativeEndian.PutUint64(v[12+KeptBytes:], tail)
		for i := range n {
			v[12+i] = byte(i)
		}
		return v
	}
	if p := keptPacket(elem(7, 7, 60), 7); len(p) != 60 || p[59] != 59 {
		t.Errorf("whole element: %d bytes", len(p))
	}
	for _, c := range []struct {
		name       string
		head, tail uint64
		n          uint32
	}{
		{"being written (tail already the next packet's)", 7, 7 + KeptPackets, 60},
		{"the next packet's", 7 + KeptPackets, 7 + KeptPackets, 60},
		{"never written", 0, 0, 0},
		{"length out of range", 7, 7, KeptBytes + 1},
	} {
		if p := keptPacket(elem(c.head, c.tail, c.n), 7); p != nil {
			t.Errorf("%s: took %d bytes", c.name, len(p))
		}
	}
}

// sendSeq runs the transmit program on inner, which must be sent over an outer IP
// header of outerIP bytes, and returns the global sequence number it carried.
func sendSeq(t *testing.T, tx *Tx, inner []byte, outerIP int) uint32 {
	t.Helper()
	ret, out := runTx(t, tx, frameOf(inner), nil)
	if ret != tcActRedirect {
		t.Fatalf("verdict %d; counters %v", ret, txVerdicts(t, tx))
	}
	h, err := wire.ParseHeader(out[14+outerIP+8:])
	if err != nil {
		t.Fatal(err)
	}
	return h.Seq
}

func lens(ps [][]byte) []int {
	out := make([]int, len(ps))
	for i, p := range ps {
		out[i] = len(p)
	}
	return out
}

// A packet whose TCP or UDP checksum is still pending on agg0's egress (CHECKSUM_PARTIAL:
// the field holds the pseudo-header's folded sum) is kept with it filled in, as the uplink
// fills it in for the packet sent: a rescue copy of the kept bytes must pass the
// receiver's check. Complete checksums, and a UDP datagram without one, are kept as they
// are.
func TestKeptPacketsHaveTheirPendingChecksumsFilledIn(t *testing.T) {
	tx := loadTxT(t)
	setTxSession(t, tx, 5, TxSession{Enabled: true, PeerIndex: 5, KeyID: 1, Key: testKey, MTU: 9000,
		Links: []TxLink{l3Link(1, 10e6)}})
	setTxRoute(t, tx, "0.0.0.0/0", 5)
	setTxRoute(t, tx, "::/0", 5)
	if err := tx.EnableKept(5); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		v6      bool
		proto   byte
		n       int
		pending bool
	}{
		{"IPv4 TCP, pending", false, protoTCP, 1000, true},
		{"IPv4 UDP, pending", false, protoUDP, 333, true},
		{"IPv6 TCP, pending", true, protoTCP, 1200, true},
		{"IPv6 UDP, pending", true, protoUDP, 1, true},
		{"IPv4 TCP, complete", false, protoTCP, 500, false},
		{"IPv6 UDP, complete", true, protoUDP, 77, false},
	} {
		pkt, leaves := innerL4(c.v6, c.proto, c.n, c.pending)
		got, err := tx.Kept(5, []uint32{sendSeq(t, tx, pkt, 20)})
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[0], leaves) {
			t.Errorf("%s: kept % x\nwant   % x", c.name, got[0], leaves)
		}
	}
	// A UDP datagram without a checksum (0 over IPv4) keeps none.
	pkt, _ := innerL4(false, protoUDP, 40, false)
	binary.BigEndian.PutUint16(pkt[20+6:], 0)
	if got, err := tx.Kept(5, []uint32{sendSeq(t, tx, pkt, 20)}); err != nil || !bytes.Equal(got[0], pkt) {
		t.Errorf("UDP without a checksum: kept % x (%v), want it as sent", got[0], err)
	}
}
