#!/bin/sh
# Compile one BPF C program for both byte orders with bpf2go, with the flags
# every aggd BPF object shares. Called from //go:generate lines in
# internal/bpf (go generate sets GOPACKAGE/GOFILE, which bpf2go needs):
#
#   bpf2go.sh <ident> <source.c> [extra bpf2go flags...]
#
# Paths are relative to internal/bpf, where go generate runs.
set -eu

ident=$1
src=$2
shift 2

# Relative, so no checkout path ends up in the objects' BTF line info.
here=$(dirname "$0")

# <linux/types.h> includes <asm/types.h>, which Debian/Ubuntu keep in the
# multiarch directory; clang -target bpf does not search it by itself.
multiarch=$(gcc -print-multiarch 2>/dev/null || true)
if [ -z "$multiarch" ]; then
	multiarch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo "$(uname -m)-linux-gnu")
fi

# bpfel and bpfeb: MIPS routers are big-endian (ARCHITECTURE §9).
exec go run github.com/cilium/ebpf/cmd/bpf2go \
	-tags linux \
	-target bpfel,bpfeb \
	-cflags "-O2 -g -Wall -Werror -std=gnu11" \
	"$@" \
	"$ident" "$src" -- \
	-I"$here/include" \
	-I"/usr/include/$multiarch"
