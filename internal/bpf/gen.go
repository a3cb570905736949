package bpf

// The BPF objects are generated, not committed: `make generate` (or
// `go generate ./internal/bpf/...`) compiles them for both byte orders.
//go:generate ../../bpf/bpf2go.sh shield ../../bpf/xdp_shield.c
