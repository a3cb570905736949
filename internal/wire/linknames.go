package wire

import "encoding/binary"

// LINK_NAMES (type 9): the CPE tells the headend what it calls each uplink ("dsl",
// "lte"), so that the headend's metrics and `aggd status` can say which of a CPE's
// links is which. Layout: counter (8), count n (1), then n entries of link id (1),
// name length (1) and the name (1 to MaxLinkNameLen bytes, as a config name: a letter
// or digit, then letters, digits, '-', '_' or '.').

// MaxLinkNameLen is the longest name ValidName accepts.
const MaxLinkNameLen = 32

// LinkName names one link.
type LinkName struct {
	LinkID uint8
	Name   string
}

// LinkNamesBody is the body of LINK_NAMES.
type LinkNamesBody struct {
	Counter uint64
	Links   []LinkName
}

// Append encodes the body. A name that is not valid, or more than 255 links, panics:
// the config has checked the names, so that is a bug (see FeedbackBody).
func (b LinkNamesBody) Append(dst []byte) []byte {
	dst = appendListHeader(dst, b.Counter, len(b.Links), MaxLinkParams, "link names")
	for _, l := range b.Links {
		if !ValidName(l.Name) {
			panic("wire: link name " + l.Name + " is not valid on the wire")
		}
		dst = append(dst, l.LinkID, uint8(len(l.Name)))
		dst = append(dst, l.Name...)
	}
	return dst
}

// Marshal encodes the body into a new buffer.
func (b LinkNamesBody) Marshal() []byte { return b.Append(nil) }

// ParseLinkNames decodes a LINK_NAMES body: exactly n well-formed entries (bad_length
// otherwise), names valid and link ids unique (bad_body otherwise).
func ParseLinkNames(b []byte) (LinkNamesBody, error) {
	if len(b) < listHeaderLen {
		return LinkNamesBody{}, errorf(ReasonBadLength, "%s body is %d bytes, shorter than its %d-byte counter and count", TypeLinkNames, len(b), listHeaderLen)
	}
	body := LinkNamesBody{Counter: binary.BigEndian.Uint64(b)}
	n := int(b[CounterLen])
	rest := b[listHeaderLen:]
	var seen [256]bool
	for i := range n {
		if len(rest) < 2 || len(rest) < 2+int(rest[1]) {
			return LinkNamesBody{}, errorf(ReasonBadLength, "%s body ends inside entry %d of %d", TypeLinkNames, i, n)
		}
		id, name := rest[0], string(rest[2:2+int(rest[1])])
		if !ValidName(name) {
			return LinkNamesBody{}, errorf(ReasonBadBody, "link %d's name %q is not a letter or digit and up to %d more letters, digits, '-', '_' or '.'", id, name, MaxLinkNameLen-1)
		}
		if seen[id] {
			return LinkNamesBody{}, errorf(ReasonBadBody, "link %d is named twice", id)
		}
		seen[id] = true
		body.Links = append(body.Links, LinkName{LinkID: id, Name: name})
		rest = rest[2+len(name):]
	}
	if len(rest) != 0 {
		return LinkNamesBody{}, errorf(ReasonBadLength, "%s body has %d bytes after its %d entries", TypeLinkNames, len(rest), n)
	}
	return body, nil
}

// ValidName reports whether s is a name aggd accepts for a link (it travels in
// LINK_NAMES) or a peer: 1 to MaxLinkNameLen bytes, a letter or digit first, then
// letters, digits, '-', '_' or '.'. Such names appear in logs, metric labels and
// commands, so they stay short and plain. The config checks its names with it.
func ValidName(s string) bool {
	if len(s) == 0 || len(s) > MaxLinkNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '-' && c != '_' && c != '.') {
			return false
		}
	}
	return true
}
