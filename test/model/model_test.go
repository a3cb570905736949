// Package model holds the SPIN model of the receive-ordering handover
// between the BPF fast path and the daemon (handover.pml) and the test that
// checks it exhaustively. The protocol, the properties and the results are
// in docs/fastpath-ordering.md.
package model

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestHandoverModel runs check.sh: every proof configuration must be searched
// completely without an error, and every known breakage and reachability
// witness must produce its counterexample. spin and gcc are build
// dependencies (make deps): their absence fails the test, it does not skip.
func TestHandoverModel(t *testing.T) {
	for _, tool := range []string{"spin", "gcc", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: the handover model needs it; apt-get install spin gcc (or make deps)", tool)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "check.sh")
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	for _, line := range strings.Split(strings.TrimRight(out.String(), "\n"), "\n") {
		t.Log(line)
	}
	if ctx.Err() != nil {
		t.Fatalf("check.sh did not finish within 5 minutes")
	}
	if err != nil {
		t.Fatalf("check.sh: %v: a property of the handover protocol is violated, a search was incomplete, "+
			"or a known breakage was no longer caught (output above; rerun test/model/check.sh -v)", err)
	}
}
