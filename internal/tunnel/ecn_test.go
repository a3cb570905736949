package tunnel

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/aqm"
	"github.com/aggd/aggd/internal/ecn"
	"github.com/aggd/aggd/internal/metrics"
)

// aqmSession is a session whose entry AQM signals congestion at every packet after the
// first: a standing queue of a second against a 1-ms target and interval, and a new
// measure before each packet (the AQM acts once per measure).
func aqmSession(t *testing.T, markECN bool) (*Session, func(inner []byte) bool) {
	t.Helper()
	cfg := testSession()
	cfg.Peer = "cpe1"
	cfg.AQMTarget, cfg.AQMECN = time.Millisecond, markECN
	s := newSession(cfg, metrics.New(), discard, 1, func([]byte) {})
	s.aqm = aqm.New(int64(time.Millisecond), int64(time.Millisecond))
	s.bondQueue.Store(int64(time.Second))
	now := int64(time.Hour)
	send := func(inner []byte) bool {
		now += int64(2 * time.Millisecond)
		s.bondQueueGen.Add(1)
		s.txMu.Lock()
		defer s.txMu.Unlock()
		return s.entryAQMDrops(now, inner)
	}
	if send(ipv4Packet(cpeAddr, internet, 0, 100)) {
		t.Fatal("the AQM dropped before the queue had stood for an interval")
	}
	return s, send
}

var cpeAddr = netip.MustParseAddr("100.64.0.2")

// withECN returns pkt with its ECN field set to cp (an IPv4 header's checksum
// computed afresh).
func withECN(pkt []byte, cp uint8) []byte {
	p := bytes.Clone(pkt)
	if p[0]>>4 == 6 {
		p[1] = p[1]&^0x30 | cp<<4
		return p
	}
	p[1] = p[1]&^0b11 | cp
	binary.BigEndian.PutUint16(p[10:], ipv4Checksum(p[:20]))
	return p
}

// Where the AQM signals congestion, an ECN-capable packet is marked Congestion
// Experienced and sent on, and a packet that is not ECN-capable is dropped; with
// aqm.ecn off, both are dropped. The ECN-capable among the drops are counted apart.
func TestAQMMarksWhatIsECNCapable(t *testing.T) {
	v4 := ipv4Packet(cpeAddr, internet, 1, 200)
	v6 := ipv6Packet(netip.MustParseAddr("2001:db8::2"), netip.MustParseAddr("2001:db8:1::7"), 1, 200)
	for _, markECN := range []bool{true, false} {
		t.Run(fmt.Sprintf("ecn=%v", markECN), func(t *testing.T) {
			s, send := aqmSession(t, markECN)
			marks, drops, ectDrops := 0, 0, 0
			for _, base := range [][]byte{v4, v6} {
				for _, cp := range []uint8{ecn.NotECT, ecn.ECT0, ecn.ECT1, ecn.CE} {
					p := withECN(base, cp)
					dropped := send(p)
					if want := !markECN || cp == ecn.NotECT; dropped != want {
						t.Fatalf("IPv%d, codepoint %02b: dropped %v, want %v", p[0]>>4, cp, dropped, want)
					}
					if dropped {
						drops++
						if cp != ecn.NotECT {
							ectDrops++
						}
						continue
					}
					marks++
					if !bytes.Equal(p, withECN(base, ecn.CE)) {
						t.Errorf("IPv%d, codepoint %02b: sent % x, want it marked CE", p[0]>>4, cp, p[:12])
					}
					if got, _ := ecn.Of(p); got != ecn.CE {
						t.Errorf("IPv%d, codepoint %02b: sent with codepoint %02b, want CE", p[0]>>4, cp, got)
					}
				}
			}
			if m, d := gauge(s.m.AQMMarks.WithLabelValues("cpe1")), gauge(s.m.AQMDrops.WithLabelValues("cpe1")); m != float64(marks) || d != float64(drops) {
				t.Errorf("counted %v marks and %v drops, want %d and %d", m, d, marks, drops)
			}
			if e := gauge(s.m.AQMECTDrops.WithLabelValues("cpe1")); e != float64(ectDrops) {
				t.Errorf("counted %v ECN-capable drops, want %d", e, ectDrops)
			}
		})
	}
}
