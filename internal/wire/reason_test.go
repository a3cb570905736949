package wire

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
)

// The reason codes are shared with the BPF programs through the table in
// docs/wire-format.md; the Go constants must match it exactly.
func TestReasonsMatchDocTable(t *testing.T) {
	doc, err := os.ReadFile("../../docs/wire-format.md")
	if err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile("(?m)^\\|\\s*(\\d+)\\s*\\|\\s*`([a-z_]+)`\\s*\\|")
	rows := row.FindAllSubmatch(doc, -1)
	if len(rows) != len(AllReasons()) {
		t.Fatalf("doc table has %d reasons, Go has %d", len(rows), len(AllReasons()))
	}
	for _, m := range rows {
		code, _ := strconv.Atoi(string(m[1]))
		if got := Reason(code).String(); got != string(m[2]) {
			t.Errorf("code %d: doc says %s, Go says %s", code, m[2], got)
		}
	}
}

func TestReasonNamesRoundTrip(t *testing.T) {
	for _, r := range AllReasons() {
		back, ok := ParseReason(r.String())
		if !ok || back != r {
			t.Errorf("%s: ParseReason gives %v, %v", r, back, ok)
		}
	}
	if _, ok := ParseReason("none"); ok {
		t.Error(`"none" parsed as a drop reason`)
	}
	if Reason(200).String() != "reason(200)" {
		t.Errorf("out-of-range reason prints as %q", Reason(200))
	}
}

func TestReasonOf(t *testing.T) {
	_, err := ParseHeader(nil)
	wrapped := fmt.Errorf("link dsl: %w", err)
	if ReasonOf(wrapped) != ReasonTruncated {
		t.Errorf("wrapped: %v", ReasonOf(wrapped))
	}
	if ReasonOf(nil) != ReasonNone || ReasonOf(errors.New("other")) != ReasonNone {
		t.Error("nil or foreign error has a reason")
	}
	if err.Error() == "" || !regexp.MustCompile(`truncated`).MatchString(err.Error()) {
		t.Errorf("message %q does not name the reason", err)
	}
}

func TestCounters(t *testing.T) {
	var c Counters
	c.Add(ReasonBadTag)
	c.Add(ReasonBadTag)
	c.AddErr(&Error{Reason: ReasonReplay})
	c.AddErr(nil)
	c.Add(Reason(250)) // ignored, not a panic
	if c.Get(ReasonBadTag) != 2 || c.Get(ReasonReplay) != 1 || c.Get(ReasonNone) != 0 || c.Get(Reason(250)) != 0 {
		t.Errorf("counts: bad_tag %d replay %d none %d", c.Get(ReasonBadTag), c.Get(ReasonReplay), c.Get(ReasonNone))
	}
}
