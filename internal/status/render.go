package status

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
)

// Render writes cur for people. With prev (an earlier reading of the same daemon) it
// also shows what each link sends and receives now, and each link's share of what
// the peer sends: the split the scheduler makes.
func Render(w io.Writer, prev, cur *Snapshot) error {
	var b strings.Builder
	fmt.Fprintf(&b, "aggd %s, %s\n", cur.Version, plural(cur.Sessions, "session"))
	if cur.Fallback {
		b.WriteString("FALLBACK: the headend does not answer; new LAN connections leave directly through the best uplink\n")
	}
	if line := fastPathLine(cur); line != "" {
		b.WriteString(line + "\n")
	}
	if line := handshakeLoadLine(prev, cur); line != "" {
		b.WriteString(line + "\n")
	}
	if line := hostLine(prev, cur); line != "" {
		b.WriteString(line + "\n")
	}
	renderCaps(&b, cur.Caps)
	if len(cur.Peers) == 0 {
		// Every peer a daemon knows has an aggd_peer_session series, connected or not.
		b.WriteString("no peers: a headend whose peers list is empty (an older aggd: no handshake has completed yet; see its log)\n")
	}
	var dt float64
	if prev != nil {
		dt = cur.At.Sub(prev.At).Seconds()
	}
	for _, p := range cur.Peers {
		b.WriteString("\n")
		renderPeer(&b, p, peerIn(prev, p.Name), cur.At, dt)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// handshakeLoadLine says, from two readings of a headend, how many INITs a second it
// answers with cookie replies and how many more its XDP shield drops ("" when neither).
func handshakeLoadLine(prev, cur *Snapshot) string {
	if prev == nil || !cur.At.After(prev.At) {
		return ""
	}
	dt := cur.At.Sub(prev.At).Seconds()
	cookies, shed := (cur.CookiesSent-prev.CookiesSent)/dt, (cur.InitsShed-prev.InitsShed)/dt
	if cookies <= 0 && shed <= 0 {
		return ""
	}
	line := fmt.Sprintf("HANDSHAKE LOAD: answering %.0f INITs a second with cookie replies (more INITs than the rate limit: "+
		"a flood, or many CPEs at once); CPEs that prove their address with the cookie still connect", max(0, cookies))
	if shed > 0 {
		line += fmt.Sprintf("; the XDP shield drops %.0f more a second before the daemon reads them (over its limit)", shed)
	}
	return line
}

// hostWaitLong is the mean wait on the host at which the host line warns: the AQM's
// default target, a queue of its own that no link shows apart.
const hostWaitLong = 10 * time.Millisecond

// hostLine says how aggd's own host keeps up, since the earlier reading (or since aggd
// started, with one): how long datagrams waited before aggd read them, and, when there
// were any, the datagrams the kernel dropped for a full socket buffer and the control
// loop's runs late enough to suspect a healthy link. It warns in capitals when any of
// these says the CPU is short; "" when there is nothing to tell.
func hostLine(prev, cur *Snapshot) string {
	h, span := cur.Host, "since aggd started"
	if prev != nil && cur.At.After(prev.At) && cur.Host.Waited >= prev.Host.Waited {
		h, span = cur.Host.since(prev.Host), "since the last reading"
	}
	if h.Waited <= 0 && h.SocketDrops <= 0 && h.LateRuns <= 0 {
		return ""
	}
	var parts []string
	mean := time.Duration(0)
	if h.Waited > 0 {
		mean = seconds(h.WaitSeconds / h.Waited)
		parts = append(parts, fmt.Sprintf("datagrams waited %s on average before aggd read them", measuredDelay(mean)))
	}
	if h.SocketDrops > 0 {
		parts = append(parts, fmt.Sprintf("the kernel dropped %.0f for a full socket buffer", h.SocketDrops))
	}
	if h.LateRuns > 0 {
		parts = append(parts, fmt.Sprintf("the control loop ran more than %.1f s late %s (healthy links may have been suspected)",
			lateRunSeconds, plural(h.LateRuns, "time")))
	}
	if mean >= hostWaitLong || h.SocketDrops > 0 || h.LateRuns > 0 {
		return "HOST BEHIND (" + span + "): the CPU is short for aggd's traffic: " + strings.Join(parts, "; ") +
			". Give aggd a core, or try the kernel fast path (docs/fastpath.md)"
	}
	return "host (" + span + "): " + strings.Join(parts, "; ")
}

// renderCaps shows each capped uplink's use of its allowance in this billing period.
func renderCaps(b *strings.Builder, caps []*Cap) {
	if len(caps) == 0 {
		return
	}
	b.WriteString("data caps (this billing period)\n")
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	for _, c := range caps {
		state := "within its cap"
		if c.Reached {
			state = "CAP REACHED: used only as a backup"
		}
		share := 0.0
		if c.Limit > 0 {
			share = c.Used / c.Limit
		}
		fmt.Fprintf(tw, "  %s\t%s of %s\t%s\tuntil %s\t%s\n", c.Link, bytesSI(c.Used), bytesSI(c.Limit), percent(share),
			c.PeriodEnd.Local().Format("2006-01-02 15:04"), state)
	}
	_ = tw.Flush() // into a strings.Builder: cannot fail
}

// bytesSI writes a volume in decimal units, as providers bill it.
func bytesSI(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.2f GB", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.1f MB", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0f kB", v/1e3)
	}
	return fmt.Sprintf("%.0f B", v)
}

func renderPeer(b *strings.Builder, p, prev *Peer, at time.Time, dt float64) {
	if p.NoSession {
		fmt.Fprintf(b, "peer %s: NO SESSION: no handshake with it has completed since aggd started "+
			"(or since a reload changed it); its links are unknown until one does (see both ends' logs)\n", p.Name)
		return
	}
	fmt.Fprintf(b, "peer %s\n", p.Name)
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	head := []string{"  link", "state", "for", "rtt", "delay", "queue", "jitter", "loss", "capacity", "scheduler"}
	if prev != nil {
		head = append(head, "sending", "share", "receiving")
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	sending := make([]float64, len(p.Links))
	receiving := make([]float64, len(p.Links))
	total, totalRx := 0.0, 0.0
	if prev != nil {
		for i, l := range p.Links {
			if old := prev.Link(l.Name); old != nil {
				sending[i] = rate(old.TxBytes, l.TxBytes, dt)
				receiving[i] = rate(old.RxBytes, l.RxBytes, dt)
				total += max(sending[i], 0)
				totalRx += max(receiving[i], 0)
			}
		}
	}
	for i, l := range p.Links {
		row := []string{"  " + l.Label(), l.State(), inState(l, at), millis(l.RTT), measuredDelay(l.BaseDelay), measuredDelay(l.QueueDelay), measuredDelay(l.Jitter),
			percent(l.Loss), estimate(l.Capacity), estimate(l.SchedRate)}
		if prev != nil {
			share := "-"
			if total > 0 && sending[i] >= 0 {
				share = percent(sending[i] / total)
			}
			row = append(row, mbit(sending[i]), share, mbit(receiving[i]))
		}
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	if prev != nil {
		fmt.Fprintln(tw, strings.Join([]string{"  all links", "", "", "", "", "", "", "", "", "", mbit(total), "", mbit(totalRx)}, "\t"))
	}
	_ = tw.Flush()
	if p.HoldTime > 0 || p.ReorderHeld > 0 || p.ReorderLost > 0 {
		fmt.Fprintf(b, "  reordering: a gap is waited for up to %s; %.0f packets waited for an earlier one (mean %s), %.0f given up as lost\n",
			millis(p.HoldTime), p.ReorderHeld, millis(seconds(p.ReorderHoldSeconds/max(p.ReorderHeld, 1))), p.ReorderLost)
	}
	if p.AQMDrops > 0 || p.AQMMarks > 0 {
		fmt.Fprintf(b, "  queue control: %.0f packets dropped and %.0f marked ECN at the bond's entry, where every link kept a queue above the aqm target (senders slow down on them)\n",
			p.AQMDrops, p.AQMMarks)
	}
}

// inState is how long the link has been in its state at the reading's time ("420 ms",
// "3h05m"; "-" if the daemon does not say): a link that keeps going down and up shows it.
func inState(l *Link, at time.Time) string {
	if l.Since.IsZero() || at.Before(l.Since) {
		return "-"
	}
	return age(at.Sub(l.Since))
}

// age writes a duration as briefly as its size allows.
func age(d time.Duration) string {
	switch d = d.Round(time.Millisecond); {
	case d < time.Second:
		return fmt.Sprintf("%d ms", d.Milliseconds())
	case d < time.Minute:
		return fmt.Sprintf("%.1f s", d.Seconds())
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
}

func peerIn(s *Snapshot, name string) *Peer {
	if s == nil {
		return nil
	}
	return s.Peer(name)
}

// fastPathLine says how much of the data the kernel fast path carried since the
// daemon started, or nothing when the fast path is off.
func fastPathLine(s *Snapshot) string {
	tx, rx := s.FastTx+s.SlowTx, s.FastRx+s.SlowRx
	if tx == 0 && rx == 0 {
		return ""
	}
	part := func(fast, all float64) string {
		if all == 0 {
			return "-"
		}
		return percent(fast / all)
	}
	return fmt.Sprintf("fast path: %s of the data sent and %s of the data received handled in the kernel",
		part(s.FastTx, tx), part(s.FastRx, rx))
}

// rate is the bit rate between two byte counter readings; -1 if the counter went
// back (the daemon restarted in between).
func rate(before, after, dt float64) float64 {
	if after < before || dt <= 0 {
		return -1
	}
	return (after - before) * 8 / dt
}

func mbit(bps float64) string {
	switch {
	case bps < 0:
		return "-"
	case bps == 0:
		return "0"
	case bps < 1e6:
		return fmt.Sprintf("%.0f kbit/s", bps/1e3)
	case bps < 100e6:
		return fmt.Sprintf("%.1f Mbit/s", bps/1e6)
	}
	return fmt.Sprintf("%.0f Mbit/s", bps/1e6)
}

// estimate is mbit for an estimate, where 0 means none yet.
func estimate(bps float64) string {
	if bps == 0 {
		return "-"
	}
	return mbit(bps)
}

// measuredDelay is a delay whose 0 is a measurement, not a missing one: no queue, no
// delay above the lowest link's, no jitter.
func measuredDelay(d time.Duration) string {
	if d <= 0 {
		return "0 ms"
	}
	return millis(d)
}

// millis is a delay in milliseconds, "-" for none.
func millis(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	ms := float64(d) / float64(time.Millisecond)
	if ms < 10 {
		return fmt.Sprintf("%.1f ms", ms)
	}
	return fmt.Sprintf("%.0f ms", ms)
}

func percent(f float64) string {
	if f > 0 && f < 0.001 {
		return "<0.1 %"
	}
	return fmt.Sprintf("%.1f %%", f*100)
}

func plural(n float64, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%.0f %ss", n, word)
}
