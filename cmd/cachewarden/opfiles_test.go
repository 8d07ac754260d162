package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/yamlfile"
	"github.com/cachewarden/cachewarden/rules"
)

// opfileDeadline bounds each command of TestOperatorFilesBounded, far
// above the milliseconds it takes, so that a command that reads without
// end fails the test instead of reaching the binary's timeout.
const opfileDeadline = time.Minute

// TestOperatorFilesBounded runs check, rules check, rules test and plan on
// files that never end or are too large: each stops at its limit with an
// error naming the file and the limit.
func TestOperatorFilesBounded(t *testing.T) {
	dir := t.TempDir()
	big := filepath.Join(dir, "big.yaml") // 1 MiB and 1 byte of comments
	write(t, big, "#"+strings.Repeat("\n", 1<<20))
	cfgBigRules := filepath.Join(dir, "big-rules.yaml")
	write(t, cfgBigRules, "kafka: {brokers: [k:9092], group: g, topics: [t]}\nmemcached: {servers: [m:11211]}\nrules: [big.yaml]\n")
	deep := filepath.Join(dir, "deep.yaml")
	write(t, deep, strings.Repeat("[", 200<<10))
	laughs := filepath.Join(dir, "laughs.yaml")
	var lol strings.Builder
	lol.WriteString("rule_files: [deep.yaml]\nl0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= 9; i++ {
		fmt.Fprintf(&lol, "l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 9), ", "))
	}
	lol.WriteString("tests: *l9\n")
	write(t, laughs, lol.String())
	nots := filepath.Join(dir, "nots.yaml")
	write(t, nots, "version: 1\nrules:\n  - name: n\n    table: shop.users\n    when: '"+strings.Repeat("!", 1_000_000)+"a'\n    bump: \"ns:{id}\"\n")
	replayCfg := writeReplayConfig(t, "127.0.0.1:1", "127.0.0.1:1", "nobody@tcp(127.0.0.1:1)/none",
		filepath.Join(mustAbs(t, "testdata/plan"), "inventory.yaml"))
	fifo := filepath.Join(dir, "fifo.yaml")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	go feedForever(fifo) // ends when the reader closes the FIFO

	for _, tc := range []struct {
		name  string
		stdin io.Reader
		args  []string
		want  string // in the error or on stdout
	}{
		{name: "check -c /dev/zero", args: []string{"check", "-c", "/dev/zero"},
			want: "/dev/zero: error: more than 1048576 bytes, the limit (read up to it and stopped)"},
		{name: "check -c FIFO", args: []string{"check", "-c", fifo},
			want: fifo + ": error: more than 1048576 bytes, the limit (read up to it and stopped)"},
		{name: "check -c a large file", args: []string{"check", "-c", big},
			want: big + ": error: 1048577 bytes, more than the limit of 1048576"},
		{name: "check --tests /dev/zero", args: []string{"check", "-c", "../../configs/cachewarden.yaml", "--tests", "/dev/zero"},
			want: "/dev/zero: error: rule test file: more than 1048576 bytes, the limit (read up to it and stopped)"},
		{name: "check a config naming a large rule file", args: []string{"check", "-c", cfgBigRules},
			want: big + ": error: 1048577 bytes, more than the limit of 1048576"},
		{name: "rules check 200 KiB of open brackets", args: []string{"rules", "check", deep},
			want: deep + ":1:10004: YAML: nested more than 10000 levels deep, deeper than the limit of 100"},
		{name: "rules test of a billion laughs", args: []string{"rules", "test", laughs},
			want: laughs + ":7:25: YAML: aliases expand to more than 1048576 bytes, the limit"},
		{name: "rules check a when of 1,000,000 nots", args: []string{"rules", "check", nots},
			want: nots + ":5:12: when: expression is 1000001 bytes, more than the limit of 16384"},
		{name: "rules check /dev/zero", args: []string{"rules", "check", "/dev/zero"},
			want: "/dev/zero: more than 1048576 bytes, the limit (read up to it and stopped)"},
		{name: "rules test /dev/zero", args: []string{"rules", "test", "/dev/zero"},
			want: "/dev/zero: more than 1048576 bytes, the limit (read up to it and stopped)"},
		{name: "plan with endless stdin", stdin: &zeroReader{}, args: []string{"plan", "--rules", "testdata/plan/inventory.yaml"},
			want: "read line 1: line too long: more than 16777216 bytes, the limit"},
		{name: "replay --file /dev/zero", args: []string{"replay", "-c", replayCfg, "--file", "/dev/zero", "--dry-run"},
			want: "replay: /dev/zero: replay: read line 1: line too long: more than 16777216 bytes, the limit"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			stdin := tc.stdin
			if stdin == nil {
				stdin = strings.NewReader("")
			}
			out, errOut, err := runWithin(t, stdin, tc.args...)
			if exitCode(err) != 1 {
				t.Errorf("exit code %d (err %v), want 1", exitCode(err), err)
			}
			if !strings.Contains(fmt.Sprint(err)+out+errOut, tc.want) {
				t.Errorf("no %q in the error %v, stdout:\n%s\nstderr:\n%s", tc.want, err, out, errOut)
			}
		})
	}
}

// runWithin is invoke with any standard input, failing the test when the
// command takes longer than opfileDeadline.
func runWithin(t *testing.T, stdin io.Reader, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- runWithInput(context.Background(), stdin, args, &out, &errOut) }()
	select {
	case err = <-done:
		t.Logf("%q: %v", args, time.Since(start).Round(time.Millisecond))
		return out.String(), errOut.String(), err
	case <-time.After(opfileDeadline):
		t.Fatalf("%q still running after %v", args, opfileDeadline)
		return "", "", nil
	}
}

// zeroReader reads as /dev/zero.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// feedForever writes YAML comments into the FIFO at path until its
// reader is gone.
func feedForever(path string) {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	chunk := []byte(strings.Repeat("# a comment that never ends\n", 1024))
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.EPIPE) {
				return
			}
			return
		}
	}
}

func write(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestDocsStateFileLimits checks that docs/rules.md and the README state
// the limits of operator files as the packages declare them.
func TestDocsStateFileLimits(t *testing.T) {
	mib := func(n int) string { return fmt.Sprintf("%d MiB", n>>20) }
	for path, wants := range map[string][]string{
		"../../docs/rules.md": {
			fmt.Sprintf("%s (%d bytes)", mib(yamlfile.MaxFileBytes), yamlfile.MaxFileBytes),
			fmt.Sprintf("| %d levels |", yamlfile.MaxDepth),
			fmt.Sprintf("| %s |", mib(yamlfile.MaxAliasBytes)),
			fmt.Sprintf("%d KiB (%d bytes)", rules.MaxWhenBytes>>10, rules.MaxWhenBytes),
			fmt.Sprintf("| %d levels |", rules.MaxWhenDepth),
			fmt.Sprintf("more than %d", decode.MaxLineBytes),
		},
		"../../README.md": {
			fmt.Sprintf("up to %s each and nest up to %d levels", mib(yamlfile.MaxFileBytes), yamlfile.MaxDepth),
			fmt.Sprintf("a `when` up to %d KiB and %d\nlevels", rules.MaxWhenBytes>>10, rules.MaxWhenDepth),
			fmt.Sprintf("input up to %s", mib(decode.MaxLineBytes)),
		},
	} {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range wants {
			if !strings.Contains(string(data), want) {
				t.Errorf("%s does not say %q", path, want)
			}
		}
	}
}
