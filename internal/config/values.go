package config

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// This file holds the typed values a config is made of and their parsers. Each parser's
// error message is written for the person editing the file: it quotes what they wrote
// and shows what to write instead. The field path and line are added by the caller.

// Rate is a link rate in bits per second. Zero means "not set": aggd measures the link.
type Rate uint64

// maxRate guards against unit slips ("10000gbit"); no access link is faster.
const maxRate = 1_000_000_000_000 // 1000gbit

type unit struct {
	name string
	mult uint64
}

// rateUnits are the units ParseRate accepts, matched case-insensitively. Rates are in
// bits, decimal multiples, as tc writes them; "bps" is accepted as a synonym of "bit".
var rateUnits = []unit{
	{"gbit", 1e9}, {"mbit", 1e6}, {"kbit", 1e3}, {"bit", 1},
	{"gbps", 1e9}, {"mbps", 1e6}, {"kbps", 1e3}, {"bps", 1},
}

// byteUnits are what people write when they mean bytes; ParseRate rejects them with
// the bit rate they probably meant, ParseSize accepts them.
var byteUnits = []unit{
	{"gib", 1 << 30}, {"mib", 1 << 20}, {"kib", 1 << 10},
	{"gb", 1e9}, {"mb", 1e6}, {"kb", 1e3}, {"b", 1},
}

// prefixWord names a unit prefix in messages.
var prefixWord = map[string]string{"": "", "k": "kilo", "m": "mega", "g": "giga", "ki": "kibi", "mi": "mebi", "gi": "gibi"}

// ParseRate parses a rate such as "10mbit", "2.5Gbit", "500kbps" or "100mbit/s".
// A number without a unit, or a byte unit such as "10mb", is an error: the message
// explains bits versus bytes rather than guessing.
func ParseRate(s string) (Rate, error) {
	num, unitName, err := splitNumber(s)
	if err != nil {
		return 0, err
	}
	if unitName == "" {
		return 0, fmt.Errorf("%q has no unit; write e.g. \"10mbit\" or \"500kbit\"", s)
	}
	lu := strings.TrimSuffix(strings.ToLower(unitName), "/s")
	if u, ok := findUnit(rateUnits, lu); ok {
		bits := math.Round(num * float64(u.mult))
		switch {
		case bits > maxRate:
			return 0, fmt.Errorf("%q is more than %s; check the unit", s, Rate(maxRate))
		case bits < 1:
			return 0, fmt.Errorf("%q is zero; leave the key out to let aggd measure the link", s)
		}
		return Rate(bits), nil
	}
	if u, ok := findUnit(byteUnits, lu); ok {
		// Say both readings: "10mb" may mean megabits (write mbit) or megabytes (×8).
		prefix := strings.TrimSuffix(strings.TrimSuffix(lu, "ib"), "b")
		asBits := Rate(math.Round(num * float64(u.mult) * 8))
		return 0, fmt.Errorf("%q counts bytes; rates are in bits per second: write %q for %s %sbits/s, or %q if you meant %s %sbytes/s",
			s, trimFloat(num)+prefix+"bit", trimFloat(num), prefixWord[prefix], asBits.String(), trimFloat(num), prefixWord[lu[:len(lu)-1]])
	}
	return 0, fmt.Errorf("%q has an unknown unit %q; use bit, kbit, mbit or gbit, e.g. \"10mbit\"", s, unitName)
}

// String writes the rate in the largest unit it reaches, e.g. "2.5gbit"; ParseRate reads
// it back exactly.
func (r Rate) String() string {
	for _, u := range rateUnits[:3] {
		if uint64(r) >= u.mult {
			return trimFloat(float64(r)/float64(u.mult)) + u.name
		}
	}
	return strconv.FormatUint(uint64(r), 10) + "bit"
}

func (r *Rate) parseScalar(s string) error { return assign(r, ParseRate, s) }

// Size is an amount of memory in bytes.
type Size uint64

// ParseSize parses a size such as "4MiB", "512KiB", "65536B" or "1GB" (KiB/MiB/GiB are
// powers of 1024, kB/MB/GB powers of 1000), case-insensitively.
func ParseSize(s string) (Size, error) {
	num, unitName, err := splitNumber(s)
	if err != nil {
		return 0, err
	}
	if unitName == "" {
		return 0, fmt.Errorf("%q has no unit; write e.g. \"4MiB\", \"512KiB\" or \"65536B\"", s)
	}
	lu := strings.ToLower(unitName)
	if u, ok := findUnit(byteUnits, lu); ok {
		b := math.Round(num * float64(u.mult))
		if b > float64(1<<50) {
			return 0, fmt.Errorf("%q is more than a pebibyte; check the unit", s)
		}
		return Size(b), nil
	}
	if _, ok := findUnit(rateUnits, strings.TrimSuffix(lu, "/s")); ok {
		return 0, fmt.Errorf("%q is a rate in bits; this is a size in bytes: write e.g. \"4MiB\"", s)
	}
	return 0, fmt.Errorf("%q has an unknown unit %q; use B, KiB, MiB or GiB, e.g. \"4MiB\"", s, unitName)
}

// String writes the size in the largest binary unit that divides it, e.g. "4MiB".
func (z Size) String() string {
	for _, u := range byteUnits[:3] {
		if z != 0 && uint64(z)%u.mult == 0 {
			return strconv.FormatUint(uint64(z)/u.mult, 10) + strings.ToUpper(u.name[:1]) + "iB"
		}
	}
	return strconv.FormatUint(uint64(z), 10) + "B"
}

func (z *Size) parseScalar(s string) error { return assign(z, ParseSize, s) }

// splitNumber splits "2.5 gbit" into 2.5 and "gbit".
func splitNumber(s string) (float64, string, error) {
	t := strings.TrimSpace(s)
	if strings.HasPrefix(t, "-") {
		return 0, "", fmt.Errorf("%q is negative", s)
	}
	i := strings.IndexFunc(t, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	if i < 0 {
		i = len(t)
	}
	if i == 0 {
		return 0, "", fmt.Errorf("%q does not start with a number", s)
	}
	num, err := strconv.ParseFloat(t[:i], 64)
	if err != nil {
		return 0, "", fmt.Errorf("%q does not start with a number", s)
	}
	return num, strings.TrimSpace(t[i:]), nil
}

func findUnit(units []unit, lower string) (unit, bool) {
	for _, u := range units {
		if u.name == lower {
			return u, true
		}
	}
	return unit{}, false
}

func trimFloat(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) }

// Key is an X25519 public key, written in the file as 44 characters of standard base64
// (the form `wg pubkey` also prints).
type Key [32]byte

// ParseKey parses a base64 key and rejects anything that is not exactly 32 bytes, or is
// all zeros (a placeholder left in place).
func ParseKey(s string) (Key, error) {
	const want = "a key is 44 characters of base64 ending in \"=\""
	if len(s) == 64 && strings.Trim(strings.ToLower(s), "0123456789abcdef") == "" {
		return Key{}, fmt.Errorf("%q looks like hex; %s", s, want)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return Key{}, fmt.Errorf("%q is not valid base64; %s", s, want)
	}
	if len(b) != len(Key{}) {
		return Key{}, fmt.Errorf("%q decodes to %d bytes, not 32; %s (was it cut short or pasted twice?)", s, len(b), want)
	}
	var k Key
	copy(k[:], b)
	if k.IsZero() {
		return Key{}, fmt.Errorf("%q is all zeros; put the peer's real public key here", s)
	}
	return k, nil
}

// IsZero reports whether the key is unset.
func (k Key) IsZero() bool { return k == Key{} }

// String returns the key in base64, as written in the file.
func (k Key) String() string { return base64.StdEncoding.EncodeToString(k[:]) }

func (k *Key) parseScalar(s string) error { return assign(k, ParseKey, s) }

// Endpoint is a remote "host:port" where host is an IP address or a DNS name. It is
// kept as written: resolving the name is the caller's job, and may give a different
// answer on every attempt.
type Endpoint struct {
	Host string // IP address or DNS name, without brackets
	Port uint16 // 1..65535
}

// ParseEndpoint parses "headend.example.net:4242", "203.0.113.1:4242" or
// "[2001:db8::1]:4242".
func ParseEndpoint(s string) (Endpoint, error) {
	host, port, err := splitHostPort(s, "headend.example.net:4242")
	if err != nil {
		return Endpoint{}, err
	}
	if host == "" {
		return Endpoint{}, fmt.Errorf("%q has no host; write host:port, e.g. \"headend.example.net:4242\"", s)
	}
	if _, err := netip.ParseAddr(host); err != nil && !isHostname(host) {
		return Endpoint{}, fmt.Errorf("%q: %q is neither an IP address nor a host name", s, host)
	}
	return Endpoint{Host: host, Port: port}, nil
}

// IsZero reports whether the endpoint is unset.
func (e Endpoint) IsZero() bool { return e == Endpoint{} }

// String returns "host:port", bracketing IPv6 addresses.
func (e Endpoint) String() string { return net.JoinHostPort(e.Host, strconv.Itoa(int(e.Port))) }

func (e *Endpoint) parseScalar(s string) error { return assign(e, ParseEndpoint, s) }

// isHostname checks DNS name syntax: dot-separated labels of letters, digits, '-' and
// '_', not starting or ending with '-'. An all-numeric name is a mistyped IPv4 address.
func isHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 || strings.Trim(h, "0123456789.") == "" {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
				return false
			}
		}
	}
	return true
}

// parseListen parses a local "ip:port" to listen on.
func parseListen(s string) (netip.AddrPort, error) {
	host, port, err := splitHostPort(s, "0.0.0.0:4242")
	if err != nil {
		return netip.AddrPort{}, err
	}
	if host == "" {
		return netip.AddrPort{}, fmt.Errorf("%q has no address; write \"0.0.0.0:%d\" or \"[::]:%d\" to listen on all addresses", s, port, port)
	}
	a, err := netip.ParseAddr(host)
	if err != nil || a.Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("%q: %q is not an IP address; write e.g. \"127.0.0.1:%d\" (this machine only) or \"0.0.0.0:%d\" (every address)", s, host, port, port)
	}
	return netip.AddrPortFrom(a, port), nil
}

// splitHostPort splits s and checks the port, with messages for the usual slips.
func splitHostPort(s, example string) (string, uint16, error) {
	host, portStr, err := net.SplitHostPort(s)
	if err != nil {
		var ae *net.AddrError
		switch {
		case errors.As(err, &ae) && ae.Err == "missing port in address":
			return "", 0, fmt.Errorf("%q has no port; write host:port, e.g. %q", s, example)
		case errors.As(err, &ae) && ae.Err == "too many colons in address":
			return "", 0, fmt.Errorf("%q: write an IPv6 address in brackets, e.g. \"[2001:db8::1]:4242\"", s)
		}
		return "", 0, fmt.Errorf("%q is not host:port, e.g. %q", s, example)
	}
	p, err := strconv.ParseUint(portStr, 10, 32)
	if err != nil {
		return "", 0, fmt.Errorf("%q: port %q is not a number", s, portStr)
	}
	if p < 1 || p > 65535 {
		return "", 0, fmt.Errorf("%q: port %d is out of range 1..65535", s, p)
	}
	return host, uint16(p), nil
}

// parseAddr parses a single IP address.
func parseAddr(s string) (netip.Addr, error) {
	if strings.Contains(s, "/") {
		return netip.Addr{}, fmt.Errorf("%q is a prefix; write the address alone, e.g. %q", s, strings.SplitN(s, "/", 2)[0])
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("%q is not an IP address (e.g. \"192.0.2.10\" or \"2001:db8::10\")", s)
	}
	return a, nil
}

// parsePrefix parses "address/length". An address without a length is refused with the
// single-host form to write, rather than guessed, since /24 is as likely as /32.
func parsePrefix(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.Prefix{}, fmt.Errorf("%q has no prefix length; write e.g. %q", s, netip.PrefixFrom(a, a.BitLen()).String())
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an IP prefix (e.g. \"192.0.2.0/24\" or \"2001:db8::/48\")", s)
	}
	return p, nil
}

// parseDuration parses Go duration syntax ("200ms", "1.5s", "2m"). A bare number is
// refused: "200" could be milliseconds or seconds.
func parseDuration(s string) (time.Duration, error) {
	if _, err := strconv.ParseFloat(s, 64); err == nil && s != "0" {
		return 0, fmt.Errorf("%q has no unit; write e.g. \"200ms\" or \"2s\"", s)
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration; write e.g. \"200ms\", \"1.5s\" or \"2m\" (units ns, us, ms, s, m, h)", s)
	}
	if d < 0 {
		return 0, fmt.Errorf("%q is negative", s)
	}
	return d, nil
}

// Class says when the scheduler may use an uplink.
type Class string

const (
	// ClassPrimary links carry traffic whenever they are up.
	ClassPrimary Class = "primary"
	// ClassOverflow links carry traffic only when the primaries are full (e.g. metered LTE).
	ClassOverflow Class = "overflow"
	// ClassBackup links carry traffic only when no primary link is up.
	ClassBackup Class = "backup"
)

func (c *Class) parseScalar(s string) error {
	return parseEnum(s, c, ClassPrimary, ClassOverflow, ClassBackup)
}

// LogLevel is the least severe log message printed.
type LogLevel string

// Log levels, from most to least verbose.
const (
	LogDebug LogLevel = "debug"
	LogInfo  LogLevel = "info"
	LogWarn  LogLevel = "warn"
	LogError LogLevel = "error"
)

// SlogLevel returns the level for log/slog.
func (l LogLevel) SlogLevel() slog.Level {
	switch l {
	case LogDebug:
		return slog.LevelDebug
	case LogWarn:
		return slog.LevelWarn
	case LogError:
		return slog.LevelError
	}
	return slog.LevelInfo
}

func (l *LogLevel) parseScalar(s string) error {
	return parseEnum(s, l, LogDebug, LogInfo, LogWarn, LogError)
}

// LogFormat is how log lines are written.
type LogFormat string

// Log formats: key=value text for people, JSON for collectors.
const (
	LogText LogFormat = "text"
	LogJSON LogFormat = "json"
)

func (f *LogFormat) parseScalar(s string) error { return parseEnum(s, f, LogText, LogJSON) }

// parseEnum accepts one of the allowed values, ignoring case.
func parseEnum[T ~string](s string, out *T, allowed ...T) error {
	names := make([]string, len(allowed))
	for i, a := range allowed {
		if strings.EqualFold(s, string(a)) {
			*out = a
			return nil
		}
		names[i] = string(a)
	}
	msg := fmt.Sprintf("%q is not one of %s", s, strings.Join(names, ", "))
	if near := closest(strings.ToLower(s), names); near != "" {
		msg += fmt.Sprintf(" (did you mean %s?)", near)
	}
	return errors.New(msg)
}

// assign parses s with parse and stores the result only on success.
func assign[T any](out *T, parse func(string) (T, error), s string) error {
	v, err := parse(s)
	if err != nil {
		return err
	}
	*out = v
	return nil
}

// closest returns the candidate within two edits of s, or one that starts the same
// ("warning" for warn), for "did you mean" hints.
func closest(s string, candidates []string) string {
	best, bestDist := "", 3
	for _, c := range candidates {
		d := editDistance(s, c)
		if len(s) >= 3 && len(c) >= 3 && (strings.HasPrefix(s, c) || strings.HasPrefix(c, s)) {
			d = min(d, 2)
		}
		if d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between two short strings.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
