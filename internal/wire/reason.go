package wire

import (
	"errors"
	"fmt"
	"sync/atomic"
)

// Reason says why a datagram was dropped. The numeric values are part of the format:
// the BPF programs count drops in a per-reason array indexed by them, and the daemon
// reads that array, so they must match bpf/include/aggd_wire.h and the table in
// docs/wire-format.md. Zero means "not dropped".
type Reason uint8

const (
	ReasonNone Reason = iota
	// Checked by the parsers in this package.
	ReasonTruncated  // shorter than the header
	ReasonBadVersion // version nibble is not Version
	ReasonBadType    // message type not defined
	ReasonBadFlags   // undefined flag bits set
	ReasonBadLength  // body length inconsistent with the type
	ReasonOversize   // longer than MaxPacket
	// Checked by the receiver with session state (packages auth, tunnel, BPF).
	ReasonUnknownSession // no session with the header's index
	ReasonBadTag         // SipHash tag does not verify
	ReasonReplay         // sequence or control counter already seen, or too old
	ReasonStaleKey       // key id is neither the current nor the previous generation
	// Checked by the parsers: the length fits but the content does not (reserved bytes
	// not zero, DATA body not an IPv4 or IPv6 packet).
	ReasonBadBody
	// Counted by the headend's handshake handling (package tunnel), never by a parser.
	ReasonRateLimited     // handshake dropped by the headend's handshake rate limit
	ReasonHandshakeFailed // mac-authenticated handshake rejected by Noise, unknown peer or replayed INIT

	numReasons // one past the last reason; keep last
)

// NumReasons is the size of a table indexed by Reason (including ReasonNone).
const NumReasons = int(numReasons)

var reasonNames = [numReasons]string{
	ReasonNone:            "none",
	ReasonTruncated:       "truncated",
	ReasonBadVersion:      "bad_version",
	ReasonBadType:         "bad_type",
	ReasonBadFlags:        "bad_flags",
	ReasonBadLength:       "bad_length",
	ReasonOversize:        "oversize",
	ReasonUnknownSession:  "unknown_session",
	ReasonBadTag:          "bad_tag",
	ReasonReplay:          "replay",
	ReasonStaleKey:        "stale_key",
	ReasonBadBody:         "bad_body",
	ReasonRateLimited:     "rate_limited",
	ReasonHandshakeFailed: "handshake_failed",
}

// String gives the snake_case name from docs/wire-format.md, used as the Prometheus
// label value.
func (r Reason) String() string {
	if r < numReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// AllReasons lists every drop reason (not ReasonNone) in numeric order, e.g. to
// pre-create one metric child per reason.
func AllReasons() []Reason {
	rs := make([]Reason, 0, numReasons-1)
	for r := ReasonNone + 1; r < numReasons; r++ {
		rs = append(rs, r)
	}
	return rs
}

// ParseReason is the inverse of String for the drop reasons (not "none").
func ParseReason(name string) (Reason, bool) {
	for _, r := range AllReasons() {
		if reasonNames[r] == name {
			return r, true
		}
	}
	return ReasonNone, false
}

// Error is a rejected datagram: the counted Reason and a human-readable Detail.
type Error struct {
	Reason Reason
	Detail string
}

func (e *Error) Error() string {
	return "aggd packet rejected (" + e.Reason.String() + "): " + e.Detail
}

func errorf(r Reason, format string, args ...any) *Error {
	return &Error{Reason: r, Detail: fmt.Sprintf(format, args...)}
}

// ReasonOf returns the Reason carried by err (also when wrapped). It returns
// ReasonNone for nil and for errors that did not come from a parser, so callers
// should only hand it errors from this package or package auth.
func ReasonOf(err error) Reason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return ReasonNone
}

// Counters counts drops per reason, safe for concurrent use. The zero value is ready.
type Counters [numReasons]atomic.Uint64

// Add counts one drop for r. A reason outside the table is counted nowhere rather
// than panicking: counting must never take the datapath down.
func (c *Counters) Add(r Reason) {
	if r < numReasons {
		c[r].Add(1)
	}
}

// AddErr counts the drop err stands for (nothing for nil).
func (c *Counters) AddErr(err error) {
	if r := ReasonOf(err); r != ReasonNone {
		c.Add(r)
	}
}

// Get returns the count for r.
func (c *Counters) Get(r Reason) uint64 {
	if r < numReasons {
		return c[r].Load()
	}
	return 0
}
