package tunnel

import (
	"bytes"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/metrics"
	"github.com/aggd/aggd/internal/wire"
	"github.com/prometheus/client_golang/prometheus"
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

// Once the CPE has named a link, the headend's log lines about it carry the name
// beside the link's own (the metrics' label), so that "link down" says which uplink.
func TestHeadendLogsNameTheCPEsLinks(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	cfg := testSession()
	cfg.Peer = "cpe1"
	s := newSession(cfg, metrics.New(), log, 1, func([]byte) {})
	t.Cleanup(s.close)
	s.addLink(LinkSpec{ID: 1, Name: "link1"}, func(*link, []byte) error { return nil })

	s.setLinkOffline(1, offlineUplink, true, causePeerOffline)
	before := buf.String()
	s.onLinkNames(wire.LinkNamesBody{Links: []wire.LinkName{{LinkID: 1, Name: "cable"}}})
	s.setLinkOffline(1, offlineUplink, false, causePeerOnline)
	after := buf.String()[len(before):]

	if !strings.Contains(before, `msg="link offline"`) || strings.Contains(before, "name=") {
		t.Errorf("before the CPE named it, want a line without name=; log:\n%s", before)
	}
	for _, want := range []string{`msg="link named by the peer" peer=cpe1 session=1 link=link1 name=cable`,
		`msg="link back: probing it" peer=cpe1 session=1 link=link1 name=cable`} {
		if !strings.Contains(after, want) {
			t.Errorf("after the CPE named it, want %q; log:\n%s", want, after)
		}
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
