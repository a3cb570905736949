package bpf

// The receive fast path (bpf/tc_rx.c), generated like the shield (gen.go).
// bpf2go derives the Go types of the maps' keys and values and of the
// exported variables by itself, so no -type flags are needed.
//go:generate ../../bpf/bpf2go.sh fprx ../../bpf/tc_rx.c
