// Package buildinfo holds the version stamped into the binary at link time.
package buildinfo

import "runtime"

// Version is set by the Makefile with -ldflags "-X ...Version=...".
var Version = "dev"

// GoVersion is the Go toolchain the binary was built with.
func GoVersion() string { return runtime.Version() }
