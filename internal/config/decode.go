package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// The decoder walks the yaml.Node tree itself instead of calling yaml's Decode: Decode
// with KnownFields stops at the first unknown key and its type errors carry no field
// path. Walking the tree against the struct's yaml tags lets us report every problem,
// each with its path and line, and parse each value with a message written for it.

// scalarParser is implemented (on the pointer) by the config's own value types.
type scalarParser interface {
	parseScalar(s string) error
}

// defaulter is implemented by list elements that have defaults of their own (a new
// uplink starts as class primary), since a list's elements do not exist until decoded.
type defaulter interface {
	setDefaults()
}

// syntaxLine pulls the line number out of yaml.v3's syntax errors ("yaml: line 3: ...").
var syntaxLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// decodeDocument parses data and decodes it into out, a pointer to a struct that
// already holds the defaults. It returns false if the file could not be parsed at all
// (a syntax error), in which case checking it further would only add noise.
func (c *collector) decodeDocument(data []byte, out any) bool {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return true // an empty file: every required key will be reported missing
		}
		c.syntaxError(err, data)
		return false
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		c.addFile(extra.Line, "a second YAML document starts here (after ---); a config file holds one")
	} else if !errors.Is(err, io.EOF) {
		c.syntaxError(err, data)
		return false
	}
	if len(doc.Content) == 0 {
		return true
	}
	c.value("", doc.Content[0], reflect.ValueOf(out).Elem())
	return true
}

func (c *collector) syntaxError(err error, data []byte) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if m := syntaxLine.FindStringSubmatch(err.Error()); m != nil {
		line, _ = strconv.Atoi(m[1])
		msg = m[2]
		line = fixSyntaxLine(line, msg, data)
	}
	if strings.Contains(msg, "found character that cannot start any token") {
		msg += " (a tab? indent with spaces only)"
	}
	c.addFile(line, "YAML syntax error: %s", msg)
}

// parserErrors are the messages of yaml.v3's parser (as opposed to its scanner). The
// parser reports the line where the enclosing construct starts, counted from 0.
var parserErrors = []string{
	"did not find expected key",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
	"did not find expected node content",
	"did not find expected '-' indicator",
	"did not find expected <document start>",
}

// fixSyntaxLine turns yaml.v3's reported line into the one to show the user: parser
// lines are made 1-based, and a misplaced tab, reported at the line before its
// context, is found by looking for it.
func fixSyntaxLine(line int, msg string, data []byte) int {
	for _, p := range parserErrors {
		if msg == p {
			return line + 1
		}
	}
	if strings.Contains(msg, "tab character") {
		lines := strings.Split(string(data), "\n")
		for i := max(line-1, 0); i < len(lines); i++ {
			indent := lines[i][:len(lines[i])-len(strings.TrimLeft(lines[i], " \t"))]
			if strings.Contains(indent, "\t") {
				return i + 1
			}
		}
	}
	return line
}

// value decodes node n into v. A null value (`key:` or `key: ~`) leaves v as it was,
// so the default stays.
func (c *collector) value(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		return
	}
	switch p := v.Addr().Interface().(type) {
	case scalarParser:
		c.scalar(path, n, p.parseScalar)
		return
	case *time.Duration:
		c.scalar(path, n, func(s string) error { return assign(p, parseDuration, s) })
		return
	case *netip.Addr:
		c.scalar(path, n, func(s string) error { return assign(p, parseAddr, s) })
		return
	case *netip.Prefix:
		c.scalar(path, n, func(s string) error { return assign(p, parsePrefix, s) })
		return
	case *netip.AddrPort:
		c.scalar(path, n, func(s string) error { return assign(p, parseListen, s) })
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		c.mapping(path, n, v)
	case reflect.Slice:
		c.sequence(path, n, v)
	case reflect.String:
		c.scalar(path, n, func(s string) error { v.SetString(s); return nil })
	case reflect.Bool:
		c.scalar(path, n, func(s string) error { return parseBool(s, v) })
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		c.scalar(path, n, func(s string) error { return parseInt(s, v) })
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		c.scalar(path, n, func(s string) error { return parseUint(s, v) })
	default:
		// A field type this walker does not know is a bug in the schema, not in the file.
		panic("config: no decoder for " + v.Type().String())
	}
}

// scalar checks that n is a single value and hands its text to parse.
func (c *collector) scalar(path string, n *yaml.Node, parse func(string) error) {
	if n.Kind != yaml.ScalarNode {
		c.addAt(path, n.Line, "want a single value, found %s", kindName(n))
		return
	}
	if err := parse(n.Value); err != nil {
		c.addAt(path, n.Line, "%s", err.Error())
	}
}

// mapping decodes a YAML mapping into a struct, reporting every unknown or repeated key.
func (c *collector) mapping(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.MappingNode {
		c.addAt(path, n.Line, "want keys and values (a mapping), found %s", kindName(n))
		return
	}
	fields := yamlFields(v.Type())
	firstLine := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		p := joinPath(path, k.Value)
		switch idx, known := fields[k.Value]; {
		case k.Kind != yaml.ScalarNode:
			c.addAt(path, k.Line, "a key must be a plain name, found %s", kindName(k))
		case k.Value == "<<":
			c.addAt(path, k.Line, "merge keys (<<) are not supported; write the keys out")
		case firstLine[k.Value] != 0:
			c.addAt(p, k.Line, "set twice (first on line %d); keep one", firstLine[k.Value])
		case !known:
			firstLine[k.Value] = k.Line
			c.addAt(p, k.Line, "%s", unknownKey(k.Value, fields))
		default:
			firstLine[k.Value] = k.Line
			c.lines[p] = k.Line
			c.value(p, val, v.Field(idx))
		}
	}
}

// sequence decodes a YAML list into a fresh slice: a list in the file replaces the
// default list rather than adding to it.
func (c *collector) sequence(path string, n *yaml.Node, v reflect.Value) {
	if n.Kind != yaml.SequenceNode {
		c.addAt(path, n.Line, "want a list, found %s; write [a, b] or one \"- item\" per line", kindName(n))
		return
	}
	s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
	for i, el := range n.Content {
		p := fmt.Sprintf("%s[%d]", path, i)
		c.lines[p] = el.Line
		e := s.Index(i)
		if d, ok := e.Addr().Interface().(defaulter); ok {
			d.setDefaults()
		}
		if el.Kind == yaml.ScalarNode && el.ShortTag() == "!!null" {
			c.addAt(p, el.Line, "empty list entry; fill it in or delete the \"-\" line")
			continue
		}
		c.value(p, el, e)
	}
	v.Set(s)
}

// yamlFields maps yaml key names to struct field indices.
func yamlFields(t reflect.Type) map[string]int {
	m := map[string]int{}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			m[name] = i
		}
	}
	return m
}

func unknownKey(key string, fields map[string]int) string {
	names := make([]string, 0, len(fields))
	for n := range fields {
		names = append(names, n)
	}
	sort.Strings(names)
	if near := closest(key, names); near != "" {
		return fmt.Sprintf("unknown key %q; did you mean %q?", key, near)
	}
	return fmt.Sprintf("unknown key %q; known keys here: %s", key, strings.Join(names, ", "))
}

func joinPath(parent, key string) string {
	if parent == "" {
		return key
	}
	return parent + "." + key
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "keys and values (a mapping)"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("the single value %q", n.Value)
	}
	return "something else"
}

// parseBool accepts true or false only: YAML 1.1's yes/no/on/off mean different things
// to different tools, so they are refused with a clear message.
func parseBool(s string, v reflect.Value) error {
	switch strings.ToLower(s) {
	case "true":
		v.SetBool(true)
	case "false":
		v.SetBool(false)
	default:
		return fmt.Errorf("%q is not true or false", s)
	}
	return nil
}

func parseInt(s string, v reflect.Value) error {
	x, err := strconv.ParseInt(s, 10, v.Type().Bits())
	if err != nil {
		return numberError(s, err, v)
	}
	v.SetInt(x)
	return nil
}

func parseUint(s string, v reflect.Value) error {
	if strings.HasPrefix(s, "-") {
		return fmt.Errorf("%q is negative", s)
	}
	x, err := strconv.ParseUint(s, 10, v.Type().Bits())
	if err != nil {
		return numberError(s, err, v)
	}
	v.SetUint(x)
	return nil
}

func numberError(s string, err error, v reflect.Value) error {
	if errors.Is(err, strconv.ErrRange) {
		limit := uint64(1)<<v.Type().Bits() - 1 // unsigned maximum; wraps to all ones for 64 bits
		if v.CanInt() {
			limit >>= 1
		}
		return fmt.Errorf("%q is too large (at most %d)", s, limit)
	}
	return fmt.Errorf("%q is not a whole number", s)
}
