package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TCMode is how a tc program ended up attached.
type TCMode string

const (
	// TCModeTCX: the kernel's tcx hook (6.6 and newer), owned by a BPF link.
	TCModeTCX TCMode = "tcx"
	// TCModeClsact: a clsact qdisc with a direct-action cls_bpf filter (older kernels).
	TCModeClsact TCMode = "clsact"
	// TCModeAdopted: a TCX link an earlier daemon pinned was switched to the new
	// program.
	TCModeAdopted TCMode = "tcx (adopted)"
)

// TCAttachment is an attached tc program; Close detaches it.
type TCAttachment interface {
	Close() error
}

// AttachTC attaches a tc (SCHED_CLS, direct-action) program to the ingress or egress of
// an interface: with TCX where the kernel has it, else with clsact + cls_bpf through
// netlink (ARCHITECTURE §9: TCX needs 6.6; Debian 12's 6.1 and OpenWrt's 5.15 have not).
func AttachTC(prog *ebpf.Program, ifindex int, egress bool) (TCAttachment, TCMode, error) {
	return AttachTCPinned(prog, ifindex, egress, "")
}

// AttachTCPinned is AttachTC with a TCX link pinned at pin (see LinkPin); a link an
// earlier daemon pinned there is switched to prog instead (mode TCModeAdopted), so
// the hook never goes empty. A clsact filter needs no pin: it stays attached to its
// interface until deleted, and attaching replaces the one left there.
func AttachTCPinned(prog *ebpf.Program, ifindex int, egress bool, pin string) (TCAttachment, TCMode, error) {
	at := ebpf.AttachTCXIngress
	if egress {
		at = ebpf.AttachTCXEgress
	}
	l, adopted, err := attachPinned(prog, pin, func() (link.Link, error) {
		return link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at})
	})
	if err == nil {
		if adopted {
			return l, TCModeAdopted, nil
		}
		return l, TCModeTCX, nil
	}
	tcxErr := err
	a, err := attachClsact(prog, ifindex, egress)
	if err != nil {
		return nil, "", fmt.Errorf("attaching the tc program to interface %d: tcx: %v; clsact: %w", ifindex, tcxErr, err)
	}
	return a, TCModeClsact, nil
}

// clsactFilterPrio is the priority of aggd's cls_bpf filters, so that they can be told
// from other filters on the same hook and removed (also as leftovers of a crash).
const clsactFilterPrio = 0xa6

// clsactAttachment is a cls_bpf filter aggd added (and the clsact qdisc, if it added it).
type clsactAttachment struct {
	filter      *netlink.BpfFilter
	qdisc       *netlink.GenericQdisc // nil: the qdisc was there before us
	removeQdisc bool
}

func attachClsact(prog *ebpf.Program, ifindex int, egress bool) (*clsactAttachment, error) {
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{
			LinkIndex: ifindex, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT,
		},
		QdiscType: "clsact",
	}
	a := &clsactAttachment{qdisc: q}
	switch err := netlink.QdiscAdd(q); {
	case err == nil:
		a.removeQdisc = true
	case errors.Is(err, unix.EEXIST):
	default:
		return nil, fmt.Errorf("adding a clsact qdisc: %w", err)
	}
	parent := uint32(netlink.HANDLE_MIN_INGRESS)
	if egress {
		parent = netlink.HANDLE_MIN_EGRESS
	}
	a.filter = &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: ifindex, Parent: parent, Handle: 1,
			Protocol: unix.ETH_P_ALL, Priority: clsactFilterPrio,
		},
		Fd: prog.FD(), Name: "aggd", DirectAction: true,
	}
	// Replace, so that a filter left by a crashed daemon is taken over, not doubled.
	if err := netlink.FilterReplace(a.filter); err != nil {
		if a.removeQdisc {
			_ = netlink.QdiscDel(q)
		}
		return nil, fmt.Errorf("adding a cls_bpf filter: %w", err)
	}
	return a, nil
}

func (a *clsactAttachment) Close() error {
	err := netlink.FilterDel(a.filter)
	if a.removeQdisc {
		if qerr := netlink.QdiscDel(a.qdisc); qerr != nil && err == nil {
			err = qerr
		}
	}
	return err
}
