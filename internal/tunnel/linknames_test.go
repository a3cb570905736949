package tunnel

import (
	"slices"

	"github.com/prometheus/client_golang/prometheus"
	"strings"
	"testing"
	"time"
)

// The headend learns what the CPE calls its uplinks: each of its links gets one info
// series naming it (link<id> at first, then the CPE's name), so a headend's operator can
// tell which link is which; the CPE's own series carry its names.
func TestHeadendLearnsTheCPEsLinkNames(t *testing.T) {
	p := newPeer(t, "cpe1", "100.64.0.2")
	b := newBed(t, p)
	n := b.startCPE(p, 3, time.Hour)
	b.waitReady(n)
	want := []string{"cpe1/link0=up0", "cpe1/link1=up1", "cpe1/link2=up2"}
	waitFor(t, "the headend's link_info to carry the CPE's names", func() bool {
		return slices.Equal(linkInfo(t, b.heM.Registry), want)
	})
	if got, want := linkInfo(t, n.m.Registry), []string{"headend/up0=up0", "headend/up1=up1", "headend/up2=up2"}; !slices.Equal(got, want) {
		t.Errorf("CPE link_info %v, want %v", got, want)
	}
}

// linkInfo lists a registry's aggd_link_info series as "peer/link=name", sorted.
func linkInfo(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	fams, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range fams {
		if f.GetName() != "aggd_link_info" {
			continue
		}
		for _, m := range f.GetMetric() {
			lbl := map[string]string{}
			for _, lp := range m.GetLabel() {
				lbl[lp.GetName()] = lp.GetValue()
			}
			if m.GetGauge().GetValue() != 1 {
				t.Errorf("link_info %v = %v, want 1", lbl, m.GetGauge().GetValue())
			}
			out = append(out, lbl["peer"]+"/"+lbl["link"]+"="+lbl["name"])
		}
	}
	slices.SortFunc(out, strings.Compare)
	return out
}
