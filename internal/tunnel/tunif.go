package tunnel

import (
	"context"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
)

// readTun reads inner packets from the tunnel interface into a buffer with room for the
// aggd header in front, and hands each to send, which stripes it. A packet that cannot
// be sent (no session yet, no usable link) is dropped and counted: the inner transport
// retransmits, exactly as if a router queue had dropped it.
func readTun(ctx context.Context, tun Packet, m *metrics.Set, send func(buf []byte) bool) {
	buf := make([]byte, wire.HeaderLen+65535)
	sent := m.TunnelTxPacket.WithLabelValues("sent")
	noRoute := m.TunnelTxPacket.WithLabelValues("no_session_or_link")
	for {
		n, err := tun.Read(buf[wire.HeaderLen:])
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// A closed device ends the loop; anything else is transient.
			if isClosed(err) {
				return
			}
			continue
		}
		if n == 0 {
			continue
		}
		if send(buf[:wire.HeaderLen+n]) {
			sent.Inc()
		} else {
			noRoute.Inc()
		}
	}
}
