package estimate

import "math"

// kalman is a scalar Kalman filter for a link's capacity, in bits per second.
//
// Why a Kalman filter and not a fixed moving average: the right amount of smoothing
// differs by link and over time. A DSL line's delivery rate at saturation is nearly
// constant and should be believed at once; an LTE bearer's swings by half within a
// second and single samples are noisy. The filter weighs each sample by how noisy the
// link has recently been (the measurement variance is learned from the innovations)
// against how far the capacity may have wandered since the last sample (process noise
// proportional to the estimate). A step detector on top handles the case a plain
// filter is slow at: a real, lasting change of capacity (a rate step, a handover). A
// sample more than two standard deviations away is held back, not folded in: a period
// cut in the middle of a burst, or one in which the sender itself was descheduled (the
// lab's VM showed both, moving a 3 Mbit/s link's estimate by a fifth in one sample).
// If the next sample is far out on the same side too, the capacity has changed: the
// filter restarts at the two samples' mean, so it moves to the new level within two
// samples instead of creeping towards it. "Next" is the link's next sample, whatever
// it was: the estimator announces every one (next), and a held sample that a sample
// which measured nothing came after is forgotten. Kept across them, an outlier of an
// upload's ACK trickle would make any far sample of the next transfer, seconds later,
// a "step" (one of the two ways a lossy link's estimate could have gone from 1.48
// Mbit/s to 0.08 in one logged step in the lab, and stayed there; BENCHMARKS.md,
// "A collapsed estimate").
type kalman struct {
	x, p    float64 // estimate and its variance
	r       float64 // learned measurement variance (EWMA of squared innovations)
	outside int     // the last sample was beyond 2σ: >0 above, <0 below
	held    float64 // that sample
	fresh   bool    // held came in the current sample (next)
}

const (
	// processFrac is how much of its value the capacity may drift per sample (1σ).
	// (0.03 smoothed more but slowed the first convergence from 3 to 6 s in the
	// simulated SOHO bond.)
	processFrac = 0.05
	// minNoiseFrac keeps the measurement variance from collapsing to zero on a
	// perfectly clean link (which would make the filter deaf to later changes).
	minNoiseFrac = 0.02
	// noiseMemory is the EWMA weight of a new squared innovation in r.
	noiseMemory = 0.1
)

func (k *kalman) valid() bool { return k.x > 0 }

// next tells the filter that a new sample of the link has come, whether or not it is
// folded in: a held outlier counts as confirmed only by the very next one, so one held
// before the last sample is forgotten.
func (k *kalman) next() {
	if !k.fresh {
		k.outside = 0
	}
	k.fresh = false
}

// reset starts the filter at x with no confidence in it.
func (k *kalman) reset(x float64) {
	k.x, k.p, k.r, k.outside = x, x*x, (minNoiseFrac*x)*(minNoiseFrac*x), 0
}

// prior starts the filter at a configured value, trusted like a noisy sample.
func (k *kalman) prior(x float64) {
	k.reset(x)
	k.p = (0.5 * x) * (0.5 * x)
}

// trainTrust is the number of packets a sample needs to be as good as a probe train's
// measure. The spacing of a train's probes at the peer measured the lab's links of fixed
// rate (every scenario, both directions, 240 trains in seven CI runs) at 0.83 to 1.09
// times their rates, 3.3 % in one standard deviation: about as good as a sample over 30
// packets. 8 (σ an eighth of the measure) leaves room for what the lab does not have;
// a train that measured the host instead of the link (8 Mbit/s on a CPU-bound 100
// Mbit/s link, once) is replaced by the two first samples that agree, one sample later
// than before. Trusted like a configured prior instead (σ half of it), the first
// saturated sample replaced it, even one made over 4 packets of a 0.2 Mbit/s link and a
// quarter wrong (BENCHMARKS.md, "A train trusted as a measure").
const trainTrust = 8

// measured starts the filter at x, measured by a probe train: trusted like a sample
// over trainTrust packets. One far from it is held back as an outlier and taken only if
// the next sample confirms it, as for any estimate.
func (k *kalman) measured(x float64) {
	k.reset(x)
	k.p = (x / trainTrust) * (x / trainTrust)
}

// update folds in one capacity measurement z, made over n packets (0: unknown).
//
// A measurement over few packets is coarse: one packet more or less in its period moves
// it by a packet's share, x/n, and a token bucket's burst at the period's start does the
// same. That much is expected noise, whatever the filter has learned (noise is learned
// from ordinary samples only, so a filter that learned a tight level from a fast link's
// samples, or from one coarse sample that came first, never widens by itself). Without it
// a scaled 0.2 Mbit/s ADSL upstream, measured over 4–5 packets a sample, took a first
// sample of 0.26 Mbit/s as its capacity and then held back every honest one (0.16–0.20)
// as an outlier for 3.7 s; assumed 30 % above its rate, the link queued 60–80 ms again
// and again, and the bond's ordering waited for it (the lab's SOHO upstream, CI run of
// c8c4d2b; BENCHMARKS.md, "One coarse sample").
func (k *kalman) update(z float64, n uint32) {
	if !k.valid() {
		k.reset(z)
		return
	}
	q := processFrac * k.x
	k.p += q * q
	y := z - k.x
	r := math.Max(k.r, (minNoiseFrac*k.x)*(minNoiseFrac*k.x))
	if n > 0 {
		perPacket := k.x / float64(n)
		r = math.Max(r, perPacket*perPacket)
	}
	if s := k.p + r; y*y > 4*s {
		if y > 0 && k.outside > 0 || y < 0 && k.outside < 0 {
			// The second far sample on the same side: the capacity has changed.
			k.reset((z + k.held) / 2)
			k.r = r
			return
		}
		k.outside, k.held, k.fresh = 1, z, true
		if y < 0 {
			k.outside = -1
		}
		return
	} else {
		k.outside = 0
		// Only ordinary samples teach the noise level: an outlier (or the first
		// sample of a step) would otherwise make the next one look ordinary.
		k.r += noiseMemory * (y*y - k.r)
	}
	gain := k.p / (k.p + r)
	k.x += gain * y
	k.p *= 1 - gain
}

// raise lifts the estimate to at least z: the link was seen delivering z without a
// queue, so its capacity is at least that.
func (k *kalman) raise(z float64) {
	if z > k.x {
		if !k.valid() {
			k.reset(z)
			return
		}
		k.x = z
	}
}

// lowerBound folds in z (over n packets) as a measurement if it is above the estimate: the link
// delivered z without a queue, so its capacity is at least that, but a single period
// can deliver more than the link's rate (a burst that waited in a buffer upstream), so
// it is filtered like any sample rather than believed outright.
func (k *kalman) lowerBound(z float64, n uint32) {
	if !k.valid() {
		k.reset(z)
		return
	}
	if z > k.x {
		k.update(z, n)
	}
}
