package config

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestBadConfigs parses every testdata/bad/*.yaml and checks that exactly the problems
// in its .want file are reported (format: testdata/bad/README.md).
func TestBadConfigs(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no test files found (%v)", err)
	}
	for _, file := range files {
		name := filepath.Base(file)
		t.Run(strings.TrimSuffix(name, ".yaml"), func(t *testing.T) {
			want := readWant(t, strings.TrimSuffix(file, ".yaml")+".want")
			got := parseBad(t, file)
			for _, w := range want {
				i := findProblem(got, w)
				if i < 0 {
					t.Errorf("missing: %d %s: %s", w.Line, w.Path, w.Msg)
					continue
				}
				got = append(got[:i], got[i+1:]...)
			}
			for _, g := range got {
				t.Errorf("unexpected: %d %s: %s", g.Line, g.Path, g.Msg)
			}
		})
	}
}

// parseBad parses a file as the mode its name says and returns the problems.
func parseBad(t *testing.T, file string) []Problem {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{File: filepath.Base(file), InterfaceExists: exampleInterfaces}
	switch {
	case strings.HasPrefix(opts.File, "cpe-"):
		_, err = ParseCPE(data, opts)
	case strings.HasPrefix(opts.File, "headend-"):
		_, err = ParseHeadend(data, opts)
	default:
		t.Fatalf("%s: name must start with cpe- or headend-", file)
	}
	var probs *Problems
	if !errors.As(err, &probs) {
		t.Fatalf("want *Problems, got %T: %v", err, err)
	}
	return append([]Problem(nil), probs.List...)
}

// findProblem returns the index of the problem w describes (w.Msg is a substring).
func findProblem(list []Problem, w Problem) int {
	for i, p := range list {
		if p.Line == w.Line && p.Path == w.Path && strings.Contains(p.Msg, w.Msg) {
			return i
		}
	}
	return -1
}

func readWant(t *testing.T, file string) []Problem {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("every bad config needs a .want file: %v", err)
	}
	var want []Problem
	for n, l := range strings.Split(string(data), "\n") {
		if l = strings.TrimSpace(l); l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		lineStr, rest, ok1 := strings.Cut(l, " ")
		path, msg, ok2 := strings.Cut(rest, ": ")
		line, err := strconv.Atoi(lineStr)
		if lineStr == "-" {
			line, err = 0, nil
		}
		if !ok1 || !ok2 || err != nil || msg == "" {
			t.Fatalf("%s:%d: want \"LINE PATH: SUBSTRING\", got %q", file, n+1, l)
		}
		if path == "-" {
			path = ""
		}
		want = append(want, Problem{Path: path, Line: line, Msg: msg})
	}
	if len(want) == 0 {
		t.Fatalf("%s lists no problems; a bad config must have at least one", file)
	}
	return want
}
