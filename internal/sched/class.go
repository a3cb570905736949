package sched

import "fmt"

// Class says when a link may carry traffic. It is the user's statement of cost: a
// metered LTE uplink should only take what the fixed lines cannot, a satellite
// backup only what is left when they are gone.
type Class uint8

const (
	// ClassPrimary links carry traffic whenever they are usable.
	ClassPrimary Class = iota
	// ClassOverflow links join only when every usable primary is full, or when no
	// primary is usable.
	ClassOverflow
	// ClassBackup links carry traffic only when no primary is usable. Values above
	// ClassBackup (from a newer peer, say) are treated as backup: the most
	// conservative reading.
	ClassBackup
)

var classNames = [...]string{
	ClassPrimary:  "primary",
	ClassOverflow: "overflow",
	ClassBackup:   "backup",
}

// String returns the name used in configuration files and metrics.
func (c Class) String() string {
	if int(c) < len(classNames) {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ParseClass parses a class name as written in configuration files. The empty
// string is ClassPrimary, so a link without a class is an ordinary link.
func ParseClass(s string) (Class, error) {
	if s == "" {
		return ClassPrimary, nil
	}
	for c, name := range classNames {
		if s == name {
			return Class(c), nil
		}
	}
	return 0, fmt.Errorf("sched: unknown link class %q (want primary, overflow or backup)", s)
}

// MarshalText makes a Class read and write as its name in text formats.
func (c Class) MarshalText() ([]byte, error) {
	if int(c) >= len(classNames) {
		return nil, fmt.Errorf("sched: invalid link class %d", uint8(c))
	}
	return []byte(c.String()), nil
}

// UnmarshalText is the inverse of MarshalText; it accepts what ParseClass accepts.
func (c *Class) UnmarshalText(text []byte) error {
	v, err := ParseClass(string(text))
	if err != nil {
		return err
	}
	*c = v
	return nil
}

// effective folds unknown class values into ClassBackup.
func (c Class) effective() Class {
	if c > ClassBackup {
		return ClassBackup
	}
	return c
}
