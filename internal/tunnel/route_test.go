package tunnel

import (
	"net/netip"
	"testing"
)

func TestPrefixTableLongestMatch(t *testing.T) {
	var tab prefixTable
	if _, ok := tab.lookup(netip.MustParseAddr("10.0.0.1")); ok {
		t.Fatal("an empty table matched")
	}
	for _, r := range []struct{ prefix, peer string }{
		{"10.0.0.0/8", "a"},
		{"10.1.0.0/16", "b"},
		{"10.1.2.3/32", "c"},
		{"10.2.3.4/16", "g"}, // not masked: stored as 10.2.0.0/16
		{"2001:db8::/32", "e"},
		{"2001:db8:1::/48", "f"},
		{"2001:db8:1::7/128", "h"},
	} {
		tab.add(netip.MustParsePrefix(r.prefix), r.peer)
	}
	for _, c := range []struct {
		addr, peer string // peer "" means no match
	}{
		{"10.1.2.3", "c"},
		{"10.1.2.4", "b"},
		{"10.1.255.255", "b"},
		{"10.9.9.9", "a"},
		{"10.0.0.0", "a"},
		{"10.2.200.1", "g"},
		{"11.0.0.1", ""},
		{"192.0.2.1", ""},
		{"2001:db8:1::7", "h"},
		{"2001:db8:1::8", "f"},
		{"2001:db8:2::1", "e"},
		{"2001:db9::1", ""},
		{"::ffff:10.1.2.3", ""}, // an IPv6 destination never matches an IPv4 prefix
		{"::", ""},
	} {
		peer, ok := tab.lookup(netip.MustParseAddr(c.addr))
		if ok != (c.peer != "") || peer != c.peer {
			t.Errorf("lookup(%s) = %q, %v; want %q", c.addr, peer, ok, c.peer)
		}
	}

	tab.add(netip.MustParsePrefix("0.0.0.0/0"), "default4")
	tab.add(netip.MustParsePrefix("::/0"), "default6")
	for addr, want := range map[string]string{
		"192.0.2.1": "default4", "10.1.2.3": "c", "2001:db9::1": "default6", "2001:db8::1": "e",
	} {
		if peer, ok := tab.lookup(netip.MustParseAddr(addr)); !ok || peer != want {
			t.Errorf("with defaults, lookup(%s) = %q, %v; want %q", addr, peer, ok, want)
		}
	}
	if got := tab.lengths4; len(got) != 4 || got[0] != 32 || got[3] != 0 {
		t.Errorf("IPv4 lengths %v, want [32 16 8 0]", got)
	}
}

func TestPrefixTableFamiliesAreSeparate(t *testing.T) {
	var tab prefixTable
	tab.add(netip.MustParsePrefix("2001:db8::/32"), "v6")
	if peer, ok := tab.lookup(netip.MustParseAddr("32.1.13.184")); ok { // 2001:0db8 as IPv4 bytes
		t.Errorf("an IPv4 address matched IPv6 prefix: %q", peer)
	}
	var tab4 prefixTable
	tab4.add(netip.MustParsePrefix("32.1.0.0/16"), "v4")
	if peer, ok := tab4.lookup(netip.MustParseAddr("2001:db8::1")); ok {
		t.Errorf("an IPv6 address matched IPv4 prefix: %q", peer)
	}
}

func TestInnerDestination(t *testing.T) {
	v4 := ipv4Packet(netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("100.64.0.2"), 1, 60)
	v6 := ipv6Packet(netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8:b::9"), 1, 80)
	v4opts := append([]byte(nil), v4...)
	v4opts[0] = 0x46 // an options word does not move the destination
	for _, c := range []struct {
		name string
		pkt  []byte
		want string // "" means not ok
	}{
		{"ipv4", v4, "100.64.0.2"},
		{"ipv4 with options", v4opts, "100.64.0.2"},
		{"ipv4 header only", v4[:20], "100.64.0.2"},
		{"ipv4 truncated", v4[:19], ""},
		{"ipv6", v6, "2001:db8:b::9"},
		{"ipv6 header only", v6[:40], "2001:db8:b::9"},
		{"ipv6 truncated", v6[:39], ""},
		{"empty", nil, ""},
		{"version 5", append([]byte{0x55}, v4[1:]...), ""},
		{"version 0", make([]byte, 60), ""},
	} {
		got, ok := innerDestination(c.pkt)
		if c.want == "" {
			if ok {
				t.Errorf("%s: got %v, want no destination", c.name, got)
			}
			continue
		}
		if !ok || got != netip.MustParseAddr(c.want) {
			t.Errorf("%s: got %v, %v; want %s", c.name, got, ok, c.want)
		}
	}
}
