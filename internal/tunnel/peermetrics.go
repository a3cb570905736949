package tunnel

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/aggd/aggd/internal/metrics"
)

// peerMetrics are a session's series labelled with its peer alone, resolved once when
// the session starts: they exist (at 0) from then on, so that a rate over them works
// from the start, and a session that goes on running briefly after a config reload
// removed its peer (metrics.Set.ForgetPeer) writes into series no longer exported
// instead of bringing them back.
type peerMetrics struct {
	aqmDrops, aqmMarks, aqmECTDrops prometheus.Counter
	aqmTakenBack                    prometheus.Counter

	reorderHeld, reorderLost, reorderHold prometheus.Counter
	duplicates, latePackets, lateCopies   prometheus.Counter
	sparseSent, sparseAhead               prometheus.Counter
	reorderStretches, reorderSkips        prometheus.Counter
	holdNow                               prometheus.Gauge

	lossNoticeSent, lossNoticeReceived prometheus.Counter
	rescued                            prometheus.Counter
	repairRequested, repairResent      prometheus.Counter
	repairUnavailable                  prometheus.Counter
}

func newPeerMetrics(m *metrics.Set, peer string) peerMetrics {
	return peerMetrics{
		aqmDrops: m.AQMDrops.WithLabelValues(peer), aqmMarks: m.AQMMarks.WithLabelValues(peer),
		aqmECTDrops: m.AQMECTDrops.WithLabelValues(peer), aqmTakenBack: m.AQMTakenBack.WithLabelValues(peer),

		reorderHeld: m.ReorderHeld.WithLabelValues(peer), reorderLost: m.ReorderLost.WithLabelValues(peer),
		reorderHold: m.ReorderHold.WithLabelValues(peer), duplicates: m.Duplicates.WithLabelValues(peer),
		latePackets: m.LatePackets.WithLabelValues(peer), lateCopies: m.LateCopies.WithLabelValues(peer),
		sparseSent: m.SparseSent.WithLabelValues(peer), sparseAhead: m.SparseAhead.WithLabelValues(peer),
		reorderStretches: m.ReorderStretches.WithLabelValues(peer), reorderSkips: m.ReorderSkips.WithLabelValues(peer),
		holdNow: m.ReorderHoldNow.WithLabelValues(peer),

		lossNoticeSent: m.LossNoticeSent.WithLabelValues(peer), lossNoticeReceived: m.LossNoticeReceived.WithLabelValues(peer),
		rescued:         m.Rescued.WithLabelValues(peer),
		repairRequested: m.RepairRequested.WithLabelValues(peer), repairResent: m.RepairResent.WithLabelValues(peer),
		repairUnavailable: m.RepairUnavailable.WithLabelValues(peer),
	}
}
