package tunnel

import (
	"slices"
	"testing"
	"time"

	"github.com/aggd/aggd/internal/wire"
)

// The session that mostly sends puts each FEEDBACK on one of its two best links, the
// other one each time; an idle session, and the one that mostly receives, put it on
// both; and so does the sender again while a link is in doubt or not healthy.
func TestTheSendingSideTakesTurnsWithFeedback(t *testing.T) {
	p := newPipePair(t)
	for _, s := range []*Session{p.tx, p.rx} {
		for _, l := range s.allLinks() {
			l.onReply(p.clk, time.Millisecond)
		}
	}
	// via sends one FEEDBACK from s and returns the links its copies went on.
	via := func(s *Session, doubt bool) []uint8 {
		p.pump()
		p.mu.Lock()
		from := len(p.queue)
		p.mu.Unlock()
		s.sendFeedback(p.clk, s.allLinks(), doubt)
		p.mu.Lock()
		var ids []uint8
		for _, q := range p.queue[from:] {
			if wire.Type(q.pkt[0]&0x0f) == wire.TypeFeedback {
				ids = append(ids, q.pkt[2])
			}
		}
		p.mu.Unlock()
		p.pump()
		slices.Sort(ids)
		return ids
	}
	both := []uint8{0, 1}
	if got := via(p.tx, false); !slices.Equal(got, both) {
		t.Fatalf("an idle session's FEEDBACK went on links %v, want %v", got, both)
	}
	p.send(40)
	if got := via(p.rx, false); !slices.Equal(got, both) {
		t.Fatalf("the receiving session's FEEDBACK went on links %v, want %v", got, both)
	}
	var turns []uint8
	for range 4 {
		p.send(40)
		got := via(p.tx, false)
		if len(got) != 1 {
			t.Fatalf("the sending session's FEEDBACK went on links %v, want one", got)
		}
		turns = append(turns, got[0])
	}
	if turns[0] == turns[1] || turns[1] == turns[2] || turns[2] == turns[3] {
		t.Fatalf("the sending session's FEEDBACK went on links %v in turn, want each time the other", turns)
	}
	p.send(40)
	if got := via(p.tx, true); !slices.Equal(got, both) {
		t.Fatalf("with a link in doubt the sending session's FEEDBACK went on links %v, want %v", got, both)
	}
	l := p.tx.allLinks()[0]
	l.mu.Lock()
	l.setState(stateSuspect)
	l.mu.Unlock()
	p.send(40)
	if got := via(p.tx, false); !slices.Equal(got, both) {
		t.Fatalf("with link 0 suspect the sending session's FEEDBACK went on links %v, want %v", got, both)
	}
}
