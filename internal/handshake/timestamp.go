package handshake

import (
	"encoding/binary"
	"fmt"
	"time"
)

// timestampLen is the size of the initiator's payload: seconds since the
// Unix epoch (u64, big-endian) and nanoseconds (u32, big-endian).
const timestampLen = 12

// timestamp is the initiator's handshake time. The headend accepts an INIT
// only if its timestamp is after the last one accepted from the same key.
type timestamp struct {
	sec  uint64
	nsec uint32
}

// timestampOf converts a wall-clock time. Times before 1970 are refused: their
// seconds would wrap to huge values and lock the CPE out once its clock is
// right again.
func timestampOf(t time.Time) (timestamp, error) {
	if t.Unix() < 0 {
		return timestamp{}, fmt.Errorf("handshake: the clock reads %s, before 1970; set the system clock (NTP) before connecting", t.UTC().Format(time.RFC3339))
	}
	return timestamp{sec: uint64(t.Unix()), nsec: uint32(t.Nanosecond())}, nil
}

// after reports whether ts is strictly later than other.
func (ts timestamp) after(other timestamp) bool {
	if ts.sec != other.sec {
		return ts.sec > other.sec
	}
	return ts.nsec > other.nsec
}

// next returns the smallest timestamp after ts.
func (ts timestamp) next() timestamp {
	if ts.nsec+1 < uint32(time.Second) {
		return timestamp{sec: ts.sec, nsec: ts.nsec + 1}
	}
	return timestamp{sec: ts.sec + 1}
}

func (ts timestamp) encode() []byte {
	b := make([]byte, timestampLen)
	binary.BigEndian.PutUint64(b[0:8], ts.sec)
	binary.BigEndian.PutUint32(b[8:12], ts.nsec)
	return b
}

func decodeTimestamp(b []byte) (timestamp, error) {
	if len(b) != timestampLen {
		return timestamp{}, fmt.Errorf("%w: INIT payload is %d bytes, want a %d-byte timestamp", ErrMalformed, len(b), timestampLen)
	}
	ts := timestamp{sec: binary.BigEndian.Uint64(b[0:8]), nsec: binary.BigEndian.Uint32(b[8:12])}
	if ts.nsec >= uint32(time.Second) {
		return timestamp{}, fmt.Errorf("%w: INIT timestamp has %d nanoseconds, not below one second", ErrMalformed, ts.nsec)
	}
	return ts, nil
}

func (ts timestamp) String() string {
	return time.Unix(int64(ts.sec), int64(ts.nsec)).UTC().Format(time.RFC3339Nano)
}
