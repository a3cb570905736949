package e2e

import (
	"encoding/binary"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/testnet"
)

const udpPort = 5301

// udpReceiver counts sequenced datagrams arriving at the server.
type udpReceiver struct {
	conn *net.UDPConn
	mu   sync.Mutex
	seen map[uint32]bool
	high uint32
	any  bool

	received, reordered, duplicates int
	done                            chan struct{}
}

func listenUDPIn(t *testing.T, n *testnet.Net, ns string, port int) *udpReceiver {
	r := &udpReceiver{seen: make(map[uint32]bool), done: make(chan struct{})}
	err := n.Do(ns, func() (err error) {
		r.conn, err = net.ListenUDP("udp4", &net.UDPAddr{Port: port})
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", ns, err)
	}
	t.Cleanup(func() { r.conn.Close() })
	go r.loop()
	return r
}

func (r *udpReceiver) loop() {
	defer close(r.done)
	buf := make([]byte, 65536)
	for {
		n, err := r.conn.Read(buf)
		if err != nil {
			return
		}
		if n < 4 {
			continue
		}
		seq := binary.BigEndian.Uint32(buf)
		r.mu.Lock()
		r.received++
		switch {
		case r.seen[seq]:
			r.duplicates++
		case r.any && seq < r.high:
			r.reordered++
		}
		r.seen[seq] = true
		if !r.any || seq > r.high {
			r.high, r.any = seq, true
		}
		r.mu.Unlock()
	}
}

type udpResult struct{ sent, received, reordered, duplicates int }

func (r *udpReceiver) result(sent int) udpResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return udpResult{sent: sent, received: r.received, reordered: r.reordered, duplicates: r.duplicates}
}

// sendSequencedUDP sends datagrams numbered 0, 1, 2, ... from the LAN host to the server
// at about rate bit/s and reports what arrived.
func sendSequencedUDP(t *testing.T, n *testnet.Net, rate float64, size int, d time.Duration) udpResult {
	recv := listenUDPIn(t, n, "srv", udpPort)
	var conn *net.UDPConn
	err := n.Do("lan", func() (err error) {
		conn, err = net.DialUDP("udp4", nil, &net.UDPAddr{IP: net.ParseIP(server), Port: udpPort})
		return err
	})
	if err != nil {
		t.Fatalf("dial from lan: %v", err)
	}
	defer conn.Close()

	payload := make([]byte, size)
	const tick = 2 * time.Millisecond
	perTick := int(rate * tick.Seconds() / float64(size*8))
	sent := 0
	start := time.Now()
	for next := start; time.Since(start) < d; next = next.Add(tick) {
		time.Sleep(time.Until(next))
		for i := 0; i < perTick; i++ {
			binary.BigEndian.PutUint32(payload, uint32(sent))
			if _, err := conn.Write(payload); err == nil {
				sent++
			}
		}
	}
	time.Sleep(time.Second) // let the last packets and any hold timers drain
	return recv.result(sent)
}

func readTail(path string) string {
	b, _ := os.ReadFile(path)
	return tail(b, 2000)
}
