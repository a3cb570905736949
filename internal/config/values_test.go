package config

import (
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestParseRate(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Rate
	}{
		{"10mbit", 10_000_000},
		{"10Mbit", 10_000_000},
		{"2.5gbit", 2_500_000_000},
		{"2.5Gbps", 2_500_000_000},
		{"500kbit", 500_000},
		{"100mbit/s", 100_000_000},
		{"64bit", 64},
		{" 20 mbit ", 20_000_000},
	} {
		got, err := ParseRate(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseRate(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
}

func TestParseRateRejects(t *testing.T) {
	for _, tc := range []struct{ in, msg string }{
		{"10", `"10" has no unit`},
		{"10mb", `write "10mbit" for 10 megabits/s, or "80mbit" if you meant 10 megabytes/s`},
		{"10MB", `counts bytes`},
		{"1KiB", `or "8.192kbit" if you meant 1 kibibytes/s`},
		{"10m", `unknown unit "m"`},
		{"-5mbit", `is negative`},
		{"mbit", `does not start with a number`},
		{"0kbit", `is zero`},
		{"2000gbit", `is more than 1000gbit`},
	} {
		_, err := ParseRate(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseRate(%q) error = %v; want it to contain %q", tc.in, err, tc.msg)
		}
	}
}

func TestRateStringRoundTrips(t *testing.T) {
	for _, r := range []Rate{1, 999, 1000, 1500, 64_000, 1_234_567, 10_000_000, 2_500_000_000, maxRate} {
		s := r.String()
		back, err := ParseRate(s)
		if err != nil || back != r {
			t.Errorf("Rate(%d).String() = %q, parses back as %d, %v", r, s, back, err)
		}
	}
	if got := Rate(2_500_000_000).String(); got != "2.5gbit" {
		t.Errorf("String() = %q, want 2.5gbit", got)
	}
}

func TestParseSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Size
	}{
		{"4MiB", 4 << 20}, {"4mib", 4 << 20}, {"512KiB", 512 << 10}, {"1GiB", 1 << 30},
		{"1MB", 1_000_000}, {"65536B", 65536}, {"1.5KiB", 1536},
	} {
		got, err := ParseSize(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseSize(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct{ in, msg string }{
		{"4096", "has no unit"}, {"4mbit", "is a rate in bits"}, {"4 parsecs", "unknown unit"},
	} {
		_, err := ParseSize(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseSize(%q) error = %v; want it to contain %q", tc.in, err, tc.msg)
		}
	}
	for z, want := range map[Size]string{4 << 20: "4MiB", 1536: "1536B", 3 << 30: "3GiB", 0: "0B"} {
		if got := z.String(); got != want {
			t.Errorf("Size(%d).String() = %q, want %q", z, got, want)
		}
	}
}

func TestParseKey(t *testing.T) {
	const good = "HeadendPublicKeyPlaceholderReplaceMe000000A="
	k, err := ParseKey(good)
	if err != nil || k.String() != good {
		t.Fatalf("ParseKey(%q) = %v, %v; want it back unchanged", good, k, err)
	}
	for _, tc := range []struct{ in, msg string }{
		{"HeadendPublicKeyPlaceholderReplaceMe0000", "decodes to 30 bytes, not 32"},
		{strings.Repeat("Zz", 32), "decodes to 48 bytes"},
		{"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", "all zeros"},
		{"not base64!", "not valid base64"},
		{strings.Repeat("ab", 32), "looks like hex"},
	} {
		_, err := ParseKey(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseKey(%q) error = %v; want it to contain %q", tc.in, err, tc.msg)
		}
	}
}

func TestParseEndpoint(t *testing.T) {
	for in, want := range map[string]Endpoint{
		"203.0.113.10:4242":        {"203.0.113.10", 4242},
		"[2001:db8::1]:4242":       {"2001:db8::1", 4242},
		"headend.example.net:4242": {"headend.example.net", 4242},
		"headend:1":                {"headend", 1},
	} {
		got, err := ParseEndpoint(in)
		if err != nil || got != want {
			t.Errorf("ParseEndpoint(%q) = %+v, %v; want %+v", in, got, err, want)
		}
		if err == nil && got.String() != in {
			t.Errorf("Endpoint.String() = %q, want %q", got.String(), in)
		}
	}
	for _, tc := range []struct{ in, msg string }{
		{"headend.example.net", "has no port"},
		{"2001:db8::1:4242", "in brackets"},
		{":4242", "has no host"},
		{"headend:0", "out of range 1..65535"},
		{"headend:http", `port "http" is not a number`},
		{"203.0.113.300:4242", "neither an IP address nor a host name"},
		{"bad_host!:4242", "neither an IP address nor a host name"},
		{"-bad.example:4242", "neither an IP address nor a host name"},
	} {
		_, err := ParseEndpoint(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("ParseEndpoint(%q) error = %v; want it to contain %q", tc.in, err, tc.msg)
		}
	}
}

func TestParseDuration(t *testing.T) {
	for in, want := range map[string]time.Duration{"200ms": 200 * time.Millisecond, "1.5s": 1500 * time.Millisecond, "0": 0} {
		got, err := parseDuration(in)
		if err != nil || got != want {
			t.Errorf("parseDuration(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, tc := range []struct{ in, msg string }{
		{"200", "has no unit"}, {"1.5", "has no unit"}, {"-1s", "negative"}, {"soon", "is not a duration"},
	} {
		_, err := parseDuration(tc.in)
		if err == nil || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("parseDuration(%q) error = %v; want it to contain %q", tc.in, err, tc.msg)
		}
	}
}

func TestParseEnumIgnoresCaseAndSuggests(t *testing.T) {
	var c Class
	if err := c.parseScalar("Overflow"); err != nil || c != ClassOverflow {
		t.Errorf("parse Overflow = %q, %v", c, err)
	}
	var l LogLevel
	err := l.parseScalar("warning")
	if err == nil || !strings.Contains(err.Error(), "did you mean warn?") {
		t.Errorf("parse warning: %v; want a suggestion of warn", err)
	}
}

func TestNumberRange(t *testing.T) {
	var cfg struct {
		Metric uint32 `yaml:"metric"`
		MTU    int16  `yaml:"mtu"`
	}
	c := newCollector()
	c.decodeDocument([]byte("metric: 4294967296\nmtu: 40000\n"), &cfg)
	if len(c.list) != 2 ||
		!strings.Contains(c.list[0].Msg, "at most 4294967295") ||
		!strings.Contains(c.list[1].Msg, "at most 32767") {
		t.Errorf("got %v; want both numbers reported with their limits", c.list)
	}
	c = newCollector()
	c.decodeDocument([]byte("metric: 4294967295\n"), &cfg)
	if len(c.list) != 0 || cfg.Metric != 4294967295 {
		t.Errorf("largest uint32 refused: %v", c.list)
	}
}

func TestSlogLevel(t *testing.T) {
	for l, want := range map[LogLevel]slog.Level{
		LogDebug: slog.LevelDebug, LogInfo: slog.LevelInfo, LogWarn: slog.LevelWarn, LogError: slog.LevelError,
	} {
		if got := l.SlogLevel(); got != want {
			t.Errorf("%s.SlogLevel() = %v, want %v", l, got, want)
		}
	}
}
