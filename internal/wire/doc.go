// Package wire encodes and decodes aggd's on-the-wire format, version 1.
//
// The byte diagram, the meaning of every field and the order in which a receiver
// checks a datagram live in docs/wire-format.md; that document is authoritative and
// this package follows it. The BPF fast path has its own C definition
// (bpf/include/aggd_wire.h); both are tested against the golden vectors in
// testdata/wire/vectors.json, which this package's tests generate
// (go test ./internal/wire -run TestGolden -update).
//
// Parsers never panic on input: a datagram that does not follow the format is
// rejected with an *Error whose Reason is the counted drop reason. Authentication
// (the SipHash tag) and replay protection are in package auth, because they need
// keys and per-session state; this package only knows the bytes.
package wire
