package daemon

import (
	"testing"
	"time"
)

// An uplink event ends what is cached for links on that interface only (a name that
// merely starts with it is another interface).
func TestNexthopCacheForgetsOneInterface(t *testing.T) {
	c := newNexthopCache()
	for _, key := range []string{"up3|203.0.113.1|10.98.3.2", "up3|2001:db8::1|invalid IP", "up31|203.0.113.1|10.98.31.2", "up1|203.0.113.1|10.98.1.2"} {
		c.m[key] = nexthop{ifindex: 1, at: time.Now()}
	}
	c.forget("up3")
	for key, want := range map[string]bool{"up3|203.0.113.1|10.98.3.2": false, "up3|2001:db8::1|invalid IP": false, "up31|203.0.113.1|10.98.31.2": true, "up1|203.0.113.1|10.98.1.2": true} {
		if _, ok := c.m[key]; ok != want {
			t.Errorf("%s cached %v after forget(up3), want %v", key, ok, want)
		}
	}
}
