package netcfg

import (
	"net"
	"strings"
	"testing"
)

// InterfaceByName answers as the standard library's lookup does, for every interface of
// this machine, and names what it could not find.
func TestInterfaceByNameMatchesTheStandardLibrary(t *testing.T) {
	all, err := net.Interfaces()
	if err != nil || len(all) == 0 {
		t.Fatalf("net.Interfaces: %v (%d interfaces)", err, len(all))
	}
	for _, want := range all {
		got, err := InterfaceByName(want.Name)
		if err != nil {
			t.Errorf("%s: %v", want.Name, err)
			continue
		}
		if got.Index != want.Index || got.Name != want.Name || got.MTU != want.MTU ||
			got.Flags != want.Flags || got.HardwareAddr.String() != want.HardwareAddr.String() {
			t.Errorf("%s: %+v, the standard library says %+v", want.Name, *got, want)
		}
	}
	const missing = "aggd-no-such0"
	if _, err := InterfaceByName(missing); err == nil || !strings.Contains(err.Error(), `no network interface named "`+missing+`"`) {
		t.Errorf("a missing interface: error %v, want one naming it", err)
	}
}
