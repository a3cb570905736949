package bpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// What the transmit program costs per packet, over an IPv4 and an IPv6 link (whose
// UDP checksum means summing the inner packet, unless its TCP checksum is still
// pending: "ipv6-pending"), for three inner sizes of a TCP packet: the kernel's own
// time per run (BPF_PROG_TEST_RUN), reported as kernel-ns/pkt. One run per call, since
// a run encapsulates the packet it is given; the syscall around it is not counted.
// Each session keeps its packets for rescue copies (EnableKept), as the daemon's do;
// "ipv4-unkept" is the IPv4 case without, which tells what keeping costs.
// Needs root.
func BenchmarkTxProgram(b *testing.B) {
	needRoot(b)
	tx, err := loadTx(14, "")
	if err != nil {
		b.Fatalf("loadTx: %v", err)
	}
	defer func() {
		if err := tx.Close(); err != nil {
			b.Error(err)
		}
	}()
	for i, outer := range []struct {
		name          string
		link          TxLink
		pending, keep bool
	}{
		{"ipv4", l3Link(1, 100e9), false, true}, {"ipv6", l3Link6(1, 100e9), false, true},
		{"ipv6-pending", l3Link6(1, 100e9), true, true}, {"ipv4-unkept", l3Link(1, 100e9), false, false},
	} {
		slot := uint32(i)
		if err := tx.SetSession(slot, TxSession{Enabled: true, PeerIndex: 1, Key: testKey, MTU: 1500, Links: []TxLink{outer.link}}); err != nil {
			b.Fatal(err)
		}
		if outer.keep {
			if err := tx.EnableKept(slot); err != nil {
				b.Fatal(err)
			}
		}
		dst := netip.AddrFrom4([4]byte{10, 99, byte(i), 1})
		if err := tx.SetRoute(netip.PrefixFrom(dst, 32), slot); err != nil {
			b.Fatal(err)
		}
		for _, size := range []int{64, 512, 1400} {
			inner, _ := innerL4(false, protoTCP, size-40, false)
			copy(inner[16:], dst.AsSlice())
			binary.BigEndian.PutUint16(inner[10:], 0)
			binary.BigEndian.PutUint16(inner[10:], ipChecksum(inner[:20]))
			pending, complete := l4Checksums(inner)
			if inner = complete; outer.pending {
				inner = pending
			}
			frame := frameOf(inner)
			b.Run(fmt.Sprintf("%s/%d", outer.name, size), func(b *testing.B) {
				var total time.Duration
				for range b.N {
					ret, d, err := tx.Program().Benchmark(frame, 1, nil)
					if err != nil || ret != tcActRedirect {
						b.Fatalf("run: verdict %d, %v", ret, err)
					}
					total += d
				}
				b.ReportMetric(float64(total.Nanoseconds())/float64(b.N), "kernel-ns/pkt")
			})
		}
	}
}
