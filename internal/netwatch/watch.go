package netwatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/aggd/aggd/internal/netcfg"
)

// Config says what to watch.
type Config struct {
	// Interfaces are watched by name; one that does not exist yet is reported when it
	// appears (it comes with its carrier and addresses).
	Interfaces []string
	// Namespace, when set, is the network namespace to watch (tests); nil watches the
	// daemon's own.
	Namespace *netns.NsHandle
	// Log receives the watcher's own trouble (notifications lost, resubscribing); nil
	// discards it.
	Log *slog.Logger
}

// Watcher reports changes on the watched interfaces on Events until its context ends.
type Watcher struct {
	events chan Event
	ns     netns.NsHandle
	h      *netlink.Handle
	log    *slog.Logger
	state  map[string]*ifState // owned by the run goroutine after Start
}

// eventBuffer absorbs a burst (an interface going down takes its addresses and routes
// with it) while the consumer is busy.
const eventBuffer = 64

// retryAfter is the pause before subscribing again after rtnetlink failed.
const retryAfter = time.Second

// Start subscribes to rtnetlink's link, address and route notifications, reads the
// interfaces' current state, and reports every change from then on. It fails only if
// it cannot talk to rtnetlink at all.
func Start(ctx context.Context, cfg Config) (*Watcher, error) {
	w := &Watcher{
		events: make(chan Event, eventBuffer),
		ns:     netns.None(),
		log:    cfg.Log,
		state:  make(map[string]*ifState, len(cfg.Interfaces)),
	}
	if cfg.Namespace != nil {
		w.ns = *cfg.Namespace
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	h, err := netlink.NewHandleAt(w.ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netwatch: open rtnetlink: %w", err)
	}
	w.h = h
	// Subscribe before reading, so that no change falls between the two.
	subs, err := w.subscribe()
	if err != nil {
		h.Close()
		return nil, err
	}
	for _, name := range cfg.Interfaces {
		st, err := readState(h, name)
		if err != nil {
			subs.close()
			h.Close()
			return nil, fmt.Errorf("netwatch: read the state of %s: %w", name, err)
		}
		w.state[name] = st
	}
	go w.run(ctx, subs)
	return w, nil
}

// Events delivers the changes. It is closed when the watcher's context ends.
func (w *Watcher) Events() <-chan Event { return w.events }

// run follows the notifications, subscribing again whenever the kernel's socket fails
// (typically ENOBUFS: notifications were dropped) and catching up on what was missed.
func (w *Watcher) run(ctx context.Context, subs *subscription) {
	defer close(w.events)
	defer w.h.Close()
	for {
		err := w.follow(ctx, subs)
		subs.close()
		if ctx.Err() != nil {
			return
		}
		w.log.Warn("netlink notifications interrupted; subscribing again and re-reading the uplinks", "err", err)
		for {
			if subs, err = w.subscribe(); err == nil {
				break
			}
			w.log.Warn("netlink subscription failed; retrying", "err", err, "in", retryAfter)
			select {
			case <-ctx.Done():
				return
			case <-time.After(retryAfter):
			}
		}
		w.resync(ctx, "resync after lost notifications")
	}
}

// follow handles notifications until one of the subscriptions ends or ctx does.
func (w *Watcher) follow(ctx context.Context, subs *subscription) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case u, ok := <-subs.links:
			if !ok {
				return subs.failure("link")
			}
			w.onLink(ctx, u)
		case u, ok := <-subs.addrs:
			if !ok {
				return subs.failure("address")
			}
			w.onAddr(ctx, u)
		case u, ok := <-subs.routes:
			if !ok {
				return subs.failure("route")
			}
			w.onRoute(ctx, u)
		}
	}
}

// onLink reports a carrier change, then catches up on the interface's addresses and
// routes: the kernel does not always announce the routes it flushes with a link.
func (w *Watcher) onLink(ctx context.Context, u netlink.LinkUpdate) {
	a := u.Attrs()
	st := w.state[a.Name]
	if st == nil {
		return
	}
	if u.Header.Type == unix.RTM_DELLINK {
		w.replace(ctx, a.Name, newIfState(), "interface deleted")
		return
	}
	if st.index != a.Index {
		cause := "interface created"
		if st.index != 0 {
			cause = fmt.Sprintf("interface index changed from %d to %d", st.index, a.Index)
		}
		st.index, st.mtu = a.Index, a.MTU
		w.emit(ctx, Event{Interface: a.Name, Kind: Created, Cause: cause})
	}
	if a.MTU != st.mtu {
		st.mtu = a.MTU
		w.emit(ctx, Event{Interface: a.Name, Kind: MTUChanged, MTU: a.MTU, Cause: "MTU changed"})
	}
	if c := hasCarrier(a); c != st.carrier {
		st.carrier = c
		w.emit(ctx, carrierEvent(a.Name, c, carrierCause(a)))
	}
	if cur, err := readState(w.h, a.Name); err == nil {
		cur.carrier = st.carrier // as notified: a re-read must not hide a flap
		w.replace(ctx, a.Name, cur, "after a link change")
	}
}

func (w *Watcher) onAddr(ctx context.Context, u netlink.AddrUpdate) {
	name, st := w.byIndex(u.LinkIndex)
	if st == nil {
		return
	}
	p, ok := globalPrefix(&u.LinkAddress, u.Scope)
	if !ok || st.addrs[p] == u.NewAddr {
		return
	}
	if u.NewAddr {
		st.addrs[p] = true
		w.emit(ctx, Event{Interface: name, Kind: AddressAdded, Address: p, Cause: "address added"})
	} else {
		delete(st.addrs, p)
		w.emit(ctx, Event{Interface: name, Kind: AddressRemoved, Address: p, Cause: "address removed"})
	}
}

func (w *Watcher) onRoute(ctx context.Context, u netlink.RouteUpdate) {
	if !netcfg.IsDefaultRoute(&u.Route) {
		return
	}
	name, st := w.byIndex(u.LinkIndex)
	if st == nil {
		return
	}
	fam := u.Family
	was, had := st.gateways[fam]
	switch u.Type {
	case unix.RTM_NEWROUTE:
		gw := gatewayOf(&u.Route)
		if had && was == gw {
			return
		}
		st.gateways[fam] = gw
		w.emit(ctx, Event{Interface: name, Kind: RouteChanged, Gateway: gw, Cause: "default route added or replaced"})
	case unix.RTM_DELROUTE:
		if !had {
			return
		}
		delete(st.gateways, fam)
		w.emit(ctx, Event{Interface: name, Kind: RouteChanged, Cause: "default route removed"})
	}
}

// resync re-reads every watched interface and reports what changed unnoticed.
func (w *Watcher) resync(ctx context.Context, cause string) {
	for name := range w.state {
		cur, err := readState(w.h, name)
		if err != nil {
			w.log.Warn("cannot re-read an uplink's state; its next change will be reported", "interface", name, "err", err)
			continue
		}
		w.replace(ctx, name, cur, cause)
	}
}

// replace makes cur the interface's known state, reporting the difference.
func (w *Watcher) replace(ctx context.Context, name string, cur *ifState, cause string) {
	old := w.state[name]
	w.state[name] = cur
	for _, e := range diff(name, old, cur, cause) {
		w.emit(ctx, e)
	}
}

func (w *Watcher) byIndex(index int) (string, *ifState) {
	for name, st := range w.state {
		if st.index == index && index != 0 {
			return name, st
		}
	}
	return "", nil
}

// emit hands an event to the consumer, waiting for room rather than dropping it.
func (w *Watcher) emit(ctx context.Context, e Event) {
	select {
	case w.events <- e:
	case <-ctx.Done():
	}
}

// subscription is one set of rtnetlink subscriptions.
type subscription struct {
	done   chan struct{}
	links  chan netlink.LinkUpdate
	addrs  chan netlink.AddrUpdate
	routes chan netlink.RouteUpdate
	errs   chan error
	// Which subscriptions started: only theirs will close their channels.
	linksOn, addrsOn, routesOn bool
}

func (w *Watcher) subscribe() (*subscription, error) {
	s := &subscription{
		done:   make(chan struct{}),
		links:  make(chan netlink.LinkUpdate, eventBuffer),
		addrs:  make(chan netlink.AddrUpdate, eventBuffer),
		routes: make(chan netlink.RouteUpdate, eventBuffer),
		errs:   make(chan error, 3),
	}
	onErr := func(err error) {
		select {
		case s.errs <- err:
		default:
		}
	}
	ns := w.ns
	const buf = 1 << 20 // survive a burst of route changes without ENOBUFS
	errL := netlink.LinkSubscribeWithOptions(s.links, s.done, netlink.LinkSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	errA := netlink.AddrSubscribeWithOptions(s.addrs, s.done, netlink.AddrSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	errR := netlink.RouteSubscribeWithOptions(s.routes, s.done, netlink.RouteSubscribeOptions{
		Namespace: &ns, ErrorCallback: onErr, ReceiveBufferSize: buf})
	s.linksOn, s.addrsOn, s.routesOn = errL == nil, errA == nil, errR == nil
	if err := errors.Join(wrap("links", errL), wrap("addresses", errA), wrap("routes", errR)); err != nil {
		s.close()
		return nil, fmt.Errorf("netwatch: subscribe to rtnetlink (needs CAP_NET_ADMIN in the namespace): %w", err)
	}
	return s, nil
}

func wrap(what string, err error) error {
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	return nil
}

// close ends the subscriptions and drains their channels, so that their goroutines,
// which may be blocked sending, can see the closed socket and exit.
func (s *subscription) close() {
	close(s.done)
	if s.linksOn {
		go drain(s.links)
	}
	if s.addrsOn {
		go drain(s.addrs)
	}
	if s.routesOn {
		go drain(s.routes)
	}
}

func drain[T any](ch <-chan T) {
	for range ch {
	}
}

// failure says why a subscription's channel closed.
func (s *subscription) failure(which string) error {
	select {
	case err := <-s.errs:
		return fmt.Errorf("%s notifications: %w", which, err)
	default:
		return fmt.Errorf("%s notifications ended", which)
	}
}
