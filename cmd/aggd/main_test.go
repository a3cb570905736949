package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheckConfigAcceptsTheExamples(t *testing.T) {
	for _, f := range []string{"cpe.example.yaml", "headend.example.yaml"} {
		var out, errOut bytes.Buffer
		// --offline: the examples name interfaces (ppp0, wwan0) this machine lacks.
		code := run([]string{"check-config", "--offline", filepath.Join("../../configs", f)}, nil, &out, &errOut)
		if code != 0 {
			t.Errorf("check-config %s exited %d:\n%s", f, code, errOut.String())
		}
		if !strings.Contains(out.String(), "valid") {
			t.Errorf("check-config %s printed %q, want a confirmation", f, out.String())
		}
	}
}

// TestCheckConfigReportsEveryProblem runs the command on every broken config of the
// config package's test data and checks that it fails and prints each expected problem
// as FILE:LINE: PATH: MESSAGE.
func TestCheckConfigReportsEveryProblem(t *testing.T) {
	wants, err := filepath.Glob("../../internal/config/testdata/bad/*.want")
	if err != nil || len(wants) == 0 {
		t.Fatalf("no broken configs found: %v", err)
	}
	for _, want := range wants {
		yaml := strings.TrimSuffix(want, ".want") + ".yaml"
		role := "cpe"
		if strings.HasPrefix(filepath.Base(yaml), "headend-") {
			role = "headend"
		}
		t.Run(filepath.Base(yaml), func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run([]string{"check-config", "--offline", "--role", role, yaml}, nil, &out, &errOut)
			if code != 2 {
				t.Fatalf("exit code %d, want 2; output:\n%s", code, errOut.String())
			}
			for _, w := range expectedProblems(t, want) {
				if !strings.Contains(errOut.String(), w) {
					t.Errorf("output lacks %q; got:\n%s", w, errOut.String())
				}
			}
		})
	}
}

// expectedProblems turns a .want file into the text each problem must print:
// "FILE:LINE: PATH: " prefix and the message substring. Problems about interfaces that
// do not exist on this machine are left out: --offline skips that check.
func expectedProblems(t *testing.T, path string) []string {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") || strings.Contains(line, "no interface") {
			continue
		}
		lineNo, rest, _ := strings.Cut(line, " ")
		field, msg, _ := strings.Cut(rest, ": ")
		var prefix string
		switch {
		case lineNo != "-" && field != "-":
			prefix = fmt.Sprintf(":%s: %s: ", lineNo, field)
		case lineNo != "-":
			prefix = fmt.Sprintf(":%s: ", lineNo)
		case field != "-":
			prefix = fmt.Sprintf(": %s: ", field)
		}
		out = append(out, prefix, msg)
	}
	return out
}

func TestUnknownCommandIsAUsageError(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"bogus"}, nil, &out, &errOut); code != 2 {
		t.Errorf("exit %d, want 2", code)
	}
	if !strings.Contains(errOut.String(), "unknown command") || !strings.Contains(errOut.String(), "Usage:") {
		t.Errorf("unhelpful message: %s", errOut.String())
	}
}

func TestGenkeyPubkeyRoundTrip(t *testing.T) {
	var key, pub, errOut bytes.Buffer
	if code := run([]string{"genkey"}, nil, &key, &errOut); code != 0 {
		t.Fatalf("genkey exited %d: %s", code, errOut.String())
	}
	if code := run([]string{"pubkey"}, bytes.NewReader(key.Bytes()), &pub, &errOut); code != 0 {
		t.Fatalf("pubkey exited %d: %s", code, errOut.String())
	}
	if p := strings.TrimSpace(pub.String()); len(p) != 44 || p == strings.TrimSpace(key.String()) {
		t.Errorf("pubkey printed %q", p)
	}
	if code := run([]string{"pubkey"}, strings.NewReader("not a key"), &pub, &errOut); code != 2 {
		t.Errorf("pubkey of garbage exited %d, want 2", code)
	}
}
