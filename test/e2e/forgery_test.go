package e2e

import (
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/auth"
	"github.com/aggd/aggd/internal/handshake"
	"github.com/aggd/aggd/internal/testnet"
	"github.com/aggd/aggd/internal/wire"
)

// TestForgedPacketsNeverReachTheServer captures real tunnel packets on an uplink, then
// injects them replayed, with a broken tag, and a handshake from a key the headend does
// not know. None may reach the server, and each must be counted under its reason.
func TestForgedPacketsNeverReachTheServer(t *testing.T) {
	n := newTopology(t)
	b := startBond(t, n)

	pcap := filepath.Join(t.TempDir(), "up1.pcap")
	capture := n.Start("hub", pcap+".log", "tcpdump", "-i", "hl1", "-U", "-w", pcap, "-c", "50",
		"udp", "and", "dst", "port", "4242", "and", "greater", "200")
	time.Sleep(time.Second) // tcpdump needs a moment before it captures

	// The traffic to capture: sequenced datagrams, so the server can spot a replayed one.
	recv := listenUDPIn(t, n, "srv", udpPort)
	sendSequenced(t, n, 3000, 800)
	select {
	case <-capture.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("tcpdump captured fewer than 50 tunnel packets on up1")
	}
	captured := readPcapUDPPayloads(t, pcap)
	var data [][]byte
	for _, p := range captured {
		if h, err := wire.ParseHeader(p); err == nil && h.Type == wire.TypeData {
			data = append(data, p)
		}
	}
	if len(data) < 50 {
		t.Fatalf("captured only %d data packets", len(data))
	}
	time.Sleep(time.Second)
	base := recv.result(3000)
	before := dropCounters(t, b)
	// With the kernel fast path (AGGD_E2E_DAEMON_ARGS=--fast-path) a replay can meet the
	// receive program while it owns the ordering; it drops it as drop_old instead.
	oldBefore := b.metricOr0("hub", `aggd_fastpath_packets_total{direction="rx",verdict="drop_old"}`)
	xdpBefore := b.metric(t, "hub", `aggd_xdp_packets_total{reason="bad_tag"}`)

	// 1. Replays: every captured data packet again, verbatim.
	for _, p := range data {
		injectFromUplink(t, n, p)
	}
	// 2. Broken tags: the same packets with one bit of the tag flipped.
	for _, p := range data {
		q := append([]byte(nil), p...)
		q[wire.TagOffset] ^= 0x01
		injectFromUplink(t, n, q)
	}
	// 3. A handshake from a key the headend does not list, with a valid mac (anyone may
	// know the headend's public key).
	injectFromUplink(t, n, foreignHandshake(t, b))

	time.Sleep(time.Second)
	after := dropCounters(t, b)
	got := recv.result(3000)
	if got.received != base.received || got.duplicates != 0 {
		t.Errorf("forged packets reached the server: %d datagrams before injection, %d after, %d duplicates",
			base.received, got.received, got.duplicates)
	}
	// The broken tags must have been stopped by the XDP shield, before an skb existed.
	if d := b.metric(t, "hub", `aggd_xdp_packets_total{reason="bad_tag"}`) - xdpBefore; d != float64(len(data)) {
		t.Errorf("XDP shield dropped %v packets as bad_tag, want %d (is the shield attached? see hub.log)", d, len(data))
	}
	after["replay"] += b.metricOr0("hub", `aggd_fastpath_packets_total{direction="rx",verdict="drop_old"}`) - oldBefore
	for reason, want := range map[string]float64{"replay": float64(len(data)), "bad_tag": float64(len(data)), "handshake_failed": 1} {
		if d := after[reason] - before[reason]; d != want {
			t.Errorf("headend drops_total{reason=%q} rose by %v, want %v", reason, d, want)
		}
	}
}

// sendSequenced sends count numbered datagrams from the LAN host at a gentle pace.
func sendSequenced(t *testing.T, n *testnet.Net, count, size int) {
	var conn *net.UDPConn
	if err := n.Do("lan", func() (err error) {
		conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(server), Port: udpPort})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	payload := make([]byte, size)
	for i := 0; i < count; i++ {
		binary.BigEndian.PutUint32(payload, uint32(i))
		if _, err := conn.Write(payload); err != nil {
			t.Fatal(err)
		}
		if i%20 == 19 {
			time.Sleep(2 * time.Millisecond)
		}
	}
}

// injectFromUplink sends a raw aggd datagram to the headend from the CPE's first uplink.
func injectFromUplink(t testing.TB, n *testnet.Net, pkt []byte) {
	err := sendFromUplink(n, 1, pkt)
	// up1 is shaped to 10 Mbit/s with a short queue: pace injections so none is dropped
	// there, which would make the drop counters below undercount.
	time.Sleep(2 * time.Millisecond)
	if err != nil {
		t.Fatalf("inject: %v", err)
	}
}

// sendFromUplink sends raw aggd datagrams to the headend from the CPE's uplink k (from
// 1), back to back.
func sendFromUplink(n *testnet.Net, k int, pkts ...[]byte) error {
	return n.Do("cpe", func() error {
		c, err := net.DialUDP("udp4", &net.UDPAddr{IP: net.ParseIP(fmt.Sprintf("10.98.%d.2", k))}, &net.UDPAddr{IP: net.ParseIP(headendIP), Port: 4242})
		if err != nil {
			return err
		}
		defer c.Close()
		for _, p := range pkts {
			if _, err := c.Write(p); err != nil {
				return err
			}
		}
		return nil
	})
}

// foreignHandshake builds a well-formed HANDSHAKE_INIT from a fresh key.
func foreignHandshake(t testing.TB, b *bond) []byte {
	hubPub := readPublicKeyOf(t, filepath.Join(b.dir, "hub.key"))
	stranger, err := handshake.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	msg, err := handshake.NewInitiator(stranger, hubPub).Init(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	body := wire.HandshakeBody{SenderIndex: 0x5eed, Noise: msg}.Append(nil)
	pkt := make([]byte, wire.HeaderLen+len(body))
	h := wire.Header{Type: wire.TypeHandshakeInit, KeyID: 1}
	h.Put(pkt)
	copy(pkt[wire.HeaderLen:], body)
	auth.Seal(auth.MacKey(hubPub), pkt)
	return pkt
}

func readPublicKeyOf(t testing.TB, privateKeyFile string) handshake.PublicKey {
	k, err := handshake.LoadPrivateKeyFile(privateKeyFile)
	if err != nil {
		t.Fatal(err)
	}
	return k.Public()
}

func dropCounters(t *testing.T, b *bond) map[string]float64 {
	m, err := b.metrics("hub")
	if err != nil {
		t.Fatal(err)
	}
	// A packet is dropped either by the XDP shield (before the daemon sees it) or by
	// the daemon: count both.
	out := make(map[string]float64)
	for _, r := range wire.AllReasons() {
		out[r.String()] = m[fmt.Sprintf(`aggd_drops_total{reason=%q}`, r.String())] +
			m[fmt.Sprintf(`aggd_xdp_packets_total{reason=%q}`, r.String())]
	}
	return out
}

// readPcapUDPPayloads reads a classic pcap file of Ethernet frames and returns the UDP
// payloads of its IPv4 packets.
func readPcapUDPPayloads(t *testing.T, path string) [][]byte {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) < 24 {
		t.Fatalf("%s: not a pcap file", path)
	}
	order := binary.ByteOrder(binary.LittleEndian)
	if binary.BigEndian.Uint32(data) == 0xa1b2c3d4 || binary.BigEndian.Uint32(data) == 0xa1b23c4d {
		order = binary.BigEndian
	}
	var out [][]byte
	for off := 24; off+16 <= len(data); {
		incl := int(order.Uint32(data[off+8:]))
		frame := data[off+16 : min(off+16+incl, len(data))]
		off += 16 + incl
		if len(frame) < 14+20+8 || binary.BigEndian.Uint16(frame[12:]) != 0x0800 {
			continue
		}
		ihl := int(frame[14]&0x0f) * 4
		udp := frame[14+ihl:]
		if frame[14+9] != 17 || len(udp) < 8 {
			continue
		}
		ulen := int(binary.BigEndian.Uint16(udp[4:]))
		if ulen < 8 || ulen > len(udp) {
			continue
		}
		out = append(out, append([]byte(nil), udp[8:ulen]...))
	}
	return out
}
