package bpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Pinning keeps the fast path alive across a daemon restart (ARCHITECTURE §8): the
// maps and the BPF links that attach the programs are pinned in a directory on a BPF
// filesystem, so that the kernel keeps forwarding with the last state after the daemon
// dies, and the next daemon loads its programs onto the same maps and swaps them into
// the same hooks without a moment in which nothing is attached.

// CheckPinDir makes sure dir can hold pins: it must lie on a BPF filesystem. If it
// lies under /sys/fs/bpf and nothing is mounted there yet, one is mounted (as systemd
// does at boot). dir is created if missing.
func CheckPinDir(dir string) error {
	if !filepath.IsAbs(dir) {
		return fmt.Errorf("pin directory %q is not an absolute path", dir)
	}
	const sysBPF = "/sys/fs/bpf"
	if !onBPFFS(dir) && (dir == sysBPF || strings.HasPrefix(dir, sysBPF+"/")) && !onBPFFS(sysBPF) {
		if err := unix.Mount("bpf", sysBPF, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("no BPF filesystem at %s, and mounting one failed: %w (mount -t bpf bpf %s)", sysBPF, err, sysBPF)
		}
	}
	if !onBPFFS(dir) {
		return fmt.Errorf("%s is not on a BPF filesystem (mount -t bpf bpf DIR, or point bpf.pin_dir at one)", dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("creating pin directory %s: %w", dir, err)
	}
	return nil
}

// onBPFFS reports whether path, or its nearest existing parent, is on a BPF filesystem.
func onBPFFS(path string) bool {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == nil {
			return st.Type == unix.BPF_FS_MAGIC
		}
		if p == "/" {
			return false
		}
	}
}

// HasPins reports whether dir holds pins of an earlier run.
func HasPins(dir string) bool {
	entries, err := os.ReadDir(dir)
	return err == nil && len(entries) > 0
}

// RemovePins unpins everything in dir and removes it. A pinned BPF link that nothing
// else holds is detached by this; a map is freed once no program uses it.
func RemovePins(dir string) error {
	if dir == "" {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("removing pins in %s: %w", dir, err)
	}
	return nil
}

// loadCollection loads spec into objs. With dir set, every map of the object (not the
// per-program global-variable sections) is pinned by name in dir, and a map pinned
// there by an earlier run is used instead of a new one. Pins whose layout this build
// does not share (an upgrade changed a map) are replaced by new maps: the state they
// held is lost, which a restart without pins would lose too.
func loadCollection(spec *ebpf.CollectionSpec, objs any, dir string) error {
	if dir == "" {
		return spec.LoadAndAssign(objs, nil)
	}
	for name, m := range spec.Maps {
		if !strings.HasPrefix(name, ".") {
			m.Pinning = ebpf.PinByName
		}
	}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}}
	err := spec.LoadAndAssign(objs, opts)
	if !errors.Is(err, ebpf.ErrMapIncompatible) {
		return err
	}
	for name, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			_ = os.Remove(filepath.Join(dir, name))
		}
	}
	return spec.LoadAndAssign(objs, opts)
}

// LinkPin is where the BPF link of a program attached to a hook of an interface is
// pinned in dir ("" when dir is ""). hook names the attach point, e.g. "xdp",
// "tc_ingress", "tc_egress".
func LinkPin(dir, hook, ifname string) string {
	if dir == "" {
		return ""
	}
	return filepath.Join(dir, linkPinPrefix+hook+"_"+ifname)
}

// linkPinPrefix starts the name of every pinned link (maps are pinned by their names).
const linkPinPrefix = "link_"

// attachPinned attaches prog through attach, unless a link pinned at pin (by an earlier
// run) still holds the hook: that link is switched to prog, so the hook is never
// empty. A new link is pinned at pin. pin "" attaches an unpinned link. adopted says
// whether an existing link was taken over.
func attachPinned(prog *ebpf.Program, pin string, attach func() (link.Link, error)) (l link.Link, adopted bool, err error) {
	if pin == "" {
		l, err = attach()
		return l, false, err
	}
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		if err := old.Update(prog); err == nil {
			return pinnedLink{old}, true, nil
		}
		// Not updatable (another kind of link, or one whose hook is gone): drop it and
		// attach afresh.
		_ = old.Unpin()
		_ = old.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		_ = os.Remove(pin)
	}
	if l, err = attach(); err != nil {
		return nil, false, err
	}
	if err := l.Pin(pin); err != nil {
		_ = l.Close()
		return nil, false, fmt.Errorf("pinning the link at %s: %w", pin, err)
	}
	return pinnedLink{l}, false, nil
}

// pinnedLink is a pinned BPF link whose Close detaches it (unpins it first): Close is
// the clean shutdown; a daemon that dies without it leaves the program attached.
type pinnedLink struct{ link.Link }

func (p pinnedLink) Close() error {
	return errors.Join(p.Unpin(), p.Link.Close())
}

// RemoveLinkPins unpins the links in dir whose hook name starts with hookPrefix: a
// link nothing else holds is detached.
func RemoveLinkPins(dir, hookPrefix string) {
	if dir == "" {
		return
	}
	pins, _ := filepath.Glob(filepath.Join(dir, linkPinPrefix+hookPrefix+"*"))
	for _, p := range pins {
		_ = os.Remove(p)
	}
}

// RemoveLinkPinsExcept unpins the links in dir on hook (LinkPin's) whose interface is
// not in keep, and returns those interfaces' names: an earlier run attached programs
// there where this run attaches none.
func RemoveLinkPinsExcept(dir, hook string, keep []string) []string {
	if dir == "" {
		return nil
	}
	prefix := linkPinPrefix + hook + "_"
	pins, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	var removed []string
	for _, p := range pins {
		name := strings.TrimPrefix(filepath.Base(p), prefix)
		if slices.Contains(keep, name) {
			continue
		}
		if err := os.Remove(p); err == nil {
			removed = append(removed, name)
		}
	}
	return removed
}
