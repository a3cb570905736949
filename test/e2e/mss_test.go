package e2e

import (
	"net"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// A TCP connection set up through the bond offers each end an MSS that fits the tunnel
// (agg0's MTU 1444 minus 40 bytes of IPv4 and TCP headers): the CPE clamps the LAN
// host's SYN on its way into agg0, the headend the server's SYN-ACK on its way into
// agg0. Without the clamp both ends would start at 1460 (their own 1500-byte
// Ethernet) and lean on ICMP "fragmentation needed" (path MTU discovery) to shrink.
func TestTCPMSSClampedToTheTunnel(t *testing.T) {
	n := newTopology(t)
	startBond(t, n)
	defer func() {
		if t.Failed() {
			for _, ns := range []string{"cpe", "hub"} {
				out, err := n.Try(ns, "nft", "list", "table", "inet", "aggd")
				t.Logf("%s: nft list table inet aggd: %v\n%s", ns, err, out)
			}
		}
	}()

	var ln net.Listener
	if err := n.Do("srv", func() (err error) { ln, err = net.Listen("tcp4", server+":7777"); return err }); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	var client net.Conn
	if err := n.Do("lan", func() (err error) { client, err = net.Dial("tcp4", server+":7777"); return err }); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()

	// TCP_MAXSEG of a connected socket is the segment size it sends, the peer's MSS
	// option less the timestamp option's 12 bytes: at most 1444 - 40 - 12.
	const want = 1444 - 40 - 12
	for _, c := range []struct {
		who  string
		conn net.Conn
	}{{"the server", srv}, {"the LAN host", client}} {
		mss := maxSeg(t, c.conn)
		t.Logf("%s sends segments of %d bytes", c.who, mss)
		if mss > want {
			t.Errorf("%s sends %d-byte segments through the bond, more than the tunnel's %d: the MSS was not clamped", c.who, mss, want)
		}
	}
}

func maxSeg(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mss int
	var serr error
	if err := raw.Control(func(fd uintptr) { mss, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
		t.Fatal(err)
	}
	if serr != nil {
		t.Fatal(serr)
	}
	return mss
}
