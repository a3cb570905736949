package bpf

// Test-only BPF objects: generated next to the others, but with a _test
// suffix, so they are compiled into the test binary only.
//go:generate ../../bpf/bpf2go.sh siphashtest ../../bpf/test/siphash_test.c
