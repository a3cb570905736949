package config

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// Problem is one thing wrong with a config file.
type Problem struct {
	// Path is the field in YAML key names with list indices, e.g. "uplinks[1].name".
	// It is empty for problems with the file as a whole, such as a syntax error.
	Path string
	// Line is the 1-based line the problem points at, or 0 when there is no line to
	// point at (a key missing from the top level, an empty file).
	Line int
	// Msg says what is wrong and what to write instead.
	Msg string
}

// Problems is every problem found in one config file. The Load and Parse functions
// return it (as error) whenever the file is not usable; get it back with errors.As.
type Problems struct {
	// File names the config in messages, as the user gave it.
	File string
	// List holds the problems ordered by line; file-wide ones (line 0) come first.
	List []Problem
}

// Error prints one problem per line, compiler style:
//
//	cpe.yaml:12: uplinks[1].rate_up: "10" has no unit; write e.g. "10mbit" or "500kbit"
func (p *Problems) Error() string {
	return strings.Join(p.Lines(), "\n")
}

// Lines returns the problems formatted as in Error, one string each.
func (p *Problems) Lines() []string {
	out := make([]string, len(p.List))
	for i, pr := range p.List {
		out[i] = p.format(pr)
	}
	return out
}

// WriteTo prints the problems for a person at a terminal: one line each and a closing
// count, so that `aggd check-config` and a failed start read the same. It implements
// io.WriterTo.
func (p *Problems) WriteTo(w io.Writer) (int64, error) {
	var b strings.Builder
	for _, l := range p.Lines() {
		b.WriteString(l)
		b.WriteByte('\n')
	}
	noun := "problems"
	if len(p.List) == 1 {
		noun = "problem"
	}
	fmt.Fprintf(&b, "%s: %d %s; fix them and check again with `aggd check-config %s`\n",
		p.file(), len(p.List), noun, p.file())
	n, err := io.WriteString(w, b.String())
	return int64(n), err
}

func (p *Problems) format(pr Problem) string {
	loc := p.file()
	if pr.Line > 0 {
		loc = fmt.Sprintf("%s:%d", loc, pr.Line)
	}
	if pr.Path == "" {
		return loc + ": " + pr.Msg
	}
	return loc + ": " + pr.Path + ": " + pr.Msg
}

func (p *Problems) file() string {
	if p.File == "" {
		return "config"
	}
	return p.File
}

// collector gathers problems while a file is decoded and checked. It remembers the line
// of every path it has seen, so that checks made after decoding can still point at the
// right line.
type collector struct {
	list  []Problem
	lines map[string]int
	bad   map[string]bool // paths that already have a problem
}

func newCollector() *collector {
	return &collector{lines: map[string]int{}, bad: map[string]bool{}}
}

// addAt records a problem at an explicit line (used while decoding, where the node is
// at hand).
func (c *collector) addAt(path string, line int, format string, args ...any) {
	c.list = append(c.list, Problem{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
	c.bad[path] = true
}

// addFile records a problem with the file as a whole (a syntax error, a second
// document). Unlike a problem with the top-level value, it does not silence the checks
// of the fields.
func (c *collector) addFile(line int, format string, args ...any) {
	c.list = append(c.list, Problem{Line: line, Msg: fmt.Sprintf(format, args...)})
}

// add records a problem found after decoding. It stays quiet when the path or one of its
// parents already has a problem: a value that failed to decode is left at its zero
// value, and "missing" on top of "not an IP address" would only confuse.
func (c *collector) add(path string, format string, args ...any) {
	for p := path; ; p = parentPath(p) {
		if c.bad[p] {
			return
		}
		if p == "" {
			break
		}
	}
	c.addAt(path, c.line(path), format, args...)
}

// line finds the line of path, or of its nearest parent the file mentions (a missing
// key points at the mapping it is missing from).
func (c *collector) line(path string) int {
	for p := path; p != ""; p = parentPath(p) {
		if l, ok := c.lines[p]; ok {
			return l
		}
	}
	return 0
}

// err returns the problems as *Problems, or nil (a true nil error) when there are none.
func (c *collector) err(file string) error {
	if len(c.list) == 0 {
		return nil
	}
	list := append([]Problem(nil), c.list...)
	sort.SliceStable(list, func(i, j int) bool { return list[i].Line < list[j].Line })
	return &Problems{File: file, List: list}
}

// parentPath strips the last key or index: "uplinks[1].name" → "uplinks[1]" →
// "uplinks" → "".
func parentPath(p string) string {
	i := strings.LastIndexAny(p, ".[")
	if i < 0 {
		return ""
	}
	return p[:i]
}
