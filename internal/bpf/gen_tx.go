package bpf

// The transmit fast path (bpf/tc_tx.c), generated like the shield (gen.go).
// bpf2go derives the Go types of the maps' keys and values and of the
// exported variables by itself, so no -type flags are needed.
//go:generate ../../bpf/bpf2go.sh fptx ../../bpf/tc_tx.c
