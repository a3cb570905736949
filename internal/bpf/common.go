package bpf

import (
	"encoding/binary"
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Pieces every loader of this package shares.

// setTunnelPort sets an object's tunnel_port constant before it is loaded.
func setTunnelPort(spec *ebpf.CollectionSpec, port uint16) error {
	return setVariable(spec, "tunnel_port", port)
}

// setVariable sets one of an object's constants (const volatile) before it is loaded.
func setVariable(spec *ebpf.CollectionSpec, name string, value any) error {
	v, ok := spec.Variables[name]
	if !ok {
		return fmt.Errorf("object has no %s variable (rebuild with go generate)", name)
	}
	if err := v.Set(value); err != nil {
		return fmt.Errorf("set %s: %w", name, err)
	}
	return nil
}

// checkEnum checks a counter enum compiled into an object's BTF against the Go list
// of its names, so that C and Go cannot drift apart silently. Each value's name is its
// enumerator without prefix, in lower case (rename maps exceptions); the enumerator
// named prefix+"_COUNT" must equal the list's length.
func checkEnum(spec *ebpf.CollectionSpec, enumName, prefix string, names []string, rename map[string]string) error {
	var enum *btf.Enum
	if err := spec.Types.TypeByName(enumName, &enum); err != nil {
		return fmt.Errorf("object lacks enum %s in BTF (rebuild with go generate): %w", enumName, err)
	}
	n := 0
	for _, v := range enum.Values {
		name := strings.ToLower(strings.TrimPrefix(v.Name, prefix))
		if name == "_count" {
			if v.Value != uint64(len(names)) {
				return fmt.Errorf("enum %s has %d values, Go knows %d", enumName, v.Value, len(names))
			}
			continue
		}
		if r, ok := rename[name]; ok {
			name = r
		}
		if v.Value >= uint64(len(names)) || names[v.Value] != name {
			return fmt.Errorf("enum %s value %s = %d does not match Go's list", enumName, v.Name, v.Value)
		}
		n++
	}
	if n != len(names) {
		return fmt.Errorf("enum %s has %d values, Go knows %d", enumName, n, len(names))
	}
	return nil
}

// sumPerCPU reads a per-CPU array of u64 counters, one per name, summed over CPUs.
func sumPerCPU(m *ebpf.Map, names []string, what string) (map[string]uint64, error) {
	out := make(map[string]uint64, len(names))
	var perCPU []uint64
	for i, name := range names {
		if err := m.Lookup(uint32(i), &perCPU); err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, name, err)
		}
		var sum uint64
		for _, v := range perCPU {
			sum += v
		}
		out[name] = sum
	}
	return out, nil
}

// sessionIndexes lists the session indexes a map keyed by sessionMapKey holds.
func sessionIndexes(m *ebpf.Map) ([]uint32, error) {
	var out []uint32
	var k [4]byte
	v := make([]byte, m.ValueSize())
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, binary.BigEndian.Uint32(k[:]))
	}
	return out, it.Err()
}
