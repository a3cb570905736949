package daemon

import (
	"strings"
	"testing"

	"github.com/aggd/aggd/internal/datacap"
	"github.com/aggd/aggd/internal/testnet"
)

// A data cap counts IP bytes, as providers bill them: five pings of 128-byte IP
// packets each way across a veth count 640 bytes each way, not the 710 the
// interface's byte counters hold with their Ethernet headers. Nothing else crosses the
// link (no IPv6, static neighbours), so the figures are exact.
func TestInterfaceCountersCountIPBytes(t *testing.T) {
	n := testnet.New(t, "dc")
	n.AddNS("a", "b")
	for _, ns := range []string{"a", "b"} {
		n.Run(ns, "sysctl", "-qw", "net.ipv6.conf.default.disable_ipv6=1")
	}
	n.Veth("a", "dc0", "10.77.0.1/24", "b", "dc0", "10.77.0.2/24")
	mac := func(ns string) string {
		return strings.TrimSpace(n.Run(ns, "cat", "/sys/class/net/dc0/address"))
	}
	n.Run("a", "ip", "neigh", "replace", "10.77.0.2", "lladdr", mac("b"), "dev", "dc0", "nud", "permanent")
	n.Run("b", "ip", "neigh", "replace", "10.77.0.1", "lladdr", mac("a"), "dev", "dc0", "nud", "permanent")

	read := func() datacap.Counters {
		t.Helper()
		var c datacap.Counters
		var ok bool
		if err := n.Do("a", func() error { c, ok = interfaceCounters("dc0"); return nil }); err != nil || !ok {
			t.Fatalf("read dc0's counters: ok %v, %v", ok, err)
		}
		return c
	}
	rawTx := func() string { return strings.TrimSpace(n.Run("a", "cat", "/sys/class/net/dc0/statistics/tx_bytes")) }
	before, rawBefore := read(), rawTx()
	n.Run("a", "ping", "-q", "-c", "5", "-i", "0.05", "-s", "100", "10.77.0.2")
	after, rawAfter := read(), rawTx()
	if rx, tx := after.Rx-before.Rx, after.Tx-before.Tx; rx != 5*128 || tx != 5*128 {
		t.Errorf("counted %d bytes in and %d out, want 640 each (five 128-byte IP packets); the interface's own tx_bytes went from %s to %s",
			rx, tx, rawBefore, rawAfter)
	}
}
