package ruletest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/decode"
	"go.yaml.in/yaml/v3"
)

func TestParseReportsEveryProblem(t *testing.T) {
	_, err := Load("testdata/broken.yaml")
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v, want a *ParseError", err)
	}
	const f = "testdata/broken.yaml"
	want := []string{
		f + ":1:13: rule_files must be a non-empty list of paths",
		f + `:2:9: format "protobuf": want ` + decode.Alternatives(decode.FileNames()) + ` (test events are JSON)`,
		f + `:5:12: table "users": want db.table`,
		f + `:7:9: test "one": an event is a JSON string, a mapping or null (a tombstone)`,
		f + `:8:25: test "one": event: number .inf has no JSON form; write it like 1.5 or 2e-3`,
		f + `:10:17: test "one": event 3 does not exist (the test has 2 events, numbered from 1)`,
		f + `:11:33: test "one": unknown op "grow" (want bump, set_add, set_remove, count or recount)`,
		f + `:12:9: test "one": count needs delta`,
		f + `:13:47: test "one": member is only for set_add and set_remove`,
		f + `:13:58: test "one": delta is only for count`,
		f + `:14:57: test "one": delta 0 is never planned`,
		f + `:15:9: test "one": expected op: missing required key "rule"`,
		f + `:15:38: test "one": expected op: unknown key "colour" (known: event, rule, op, key, member, delta, args)`,
		f + `:17:9: test "one": expected error: missing required key "contains"`,
		f + `:18:5: test "one": missing required key "expect" (write expect: [] when no op is expected)`,
		f + `:18:5: test "one": name already used by the test at line 4`,
		f + `:19:13: test "one": events must be a non-empty list`,
		f + `:20:5: test: missing required key "name"`,
		f + `:22:13: test at line 20: expect must be a list, not a mapping`,
	}
	if got := strings.Join(pe.Problems, "\n"); got != strings.Join(want, "\n") {
		t.Fatalf("problems:\n%s\nwant:\n%s", got, strings.Join(want, "\n"))
	}
}

func TestParseSmallMistakes(t *testing.T) {
	tests := []struct{ name, src, want string }{
		{"empty", "", "t.yaml:1:1: empty test file"},
		{"not YAML", "tests: [\n", "t.yaml:1:8: YAML: did not find expected node content"},
		{"not a mapping", "- a\n", "t.yaml:1:1: test file must be a mapping, not a list"},
		{"unknown top-level field", "rule_files: [r.yaml]\ntests: []\nruels: x\n",
			"t.yaml:2:8: tests must be a non-empty list\nt.yaml:3:1: test file: unknown key \"ruels\" (known: rule_files, format, table, tests)"},
		{"field twice", "rule_files: [r.yaml]\nrule_files: [s.yaml]\ntests: [{name: a, events: [null], expect: []}]\n",
			`t.yaml:2:1: test file: duplicate key "rule_files" (first at line 1)`},
		{"out of order", "rule_files: [r.yaml]\ntests:\n- name: a\n  events: [null, null]\n  expect:\n  - {event: 2, rule: r, op: bump, key: k}\n  - {event: 1, rule: r, op: bump, key: k}\n",
			`t.yaml:7:5: test "a": expected ops must be listed in event order (event 1 after event 2)`},
		{"format avro", "rule_files: [r.yaml]\nformat: avro\ntests: [{name: a, events: [null], expect: []}]\n",
			`t.yaml:2:9: format "avro": want ` + decode.Alternatives(decode.FileNames()) + ` (test events are JSON)`},
		{"two errors for one event", "rule_files: [r.yaml]\ntests:\n- name: a\n  events: [null]\n  expect: []\n  errors: [{event: 1, contains: x}, {event: 1, contains: y}]\n",
			`t.yaml:6:37: test "a": event 1 already has an expected error`},
		{"duplicate key in an event", "rule_files: [r.yaml]\ntests:\n- name: a\n  events: [{op: c, op: u}]\n  expect: []\n",
			`t.yaml:4:20: test "a": event: duplicate key "op" (first at line 4)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.src))
			if err == nil {
				t.Fatal("no error")
			}
			if err.Error() != tt.want {
				t.Fatalf("error:\n%s\nwant:\n%s", err, tt.want)
			}
		})
	}
}

func TestParseResolvesPaths(t *testing.T) {
	s, err := Parse(filepath.Join("some", "dir", "t.yaml"), []byte(
		"rule_files: [../rules.yaml, /abs/r.yaml]\nformat: maxwell\ntable: db.t\ntests:\n- name: a\n  events: [null]\n  expect: []\n- name: b\n  format: canal\n  table: db.u\n  events: [null]\n  expect: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join("some", "rules.yaml"), "/abs/r.yaml"}; strings.Join(s.RuleFiles, " ") != strings.Join(want, " ") {
		t.Errorf("rule files %q, want %q", s.RuleFiles, want)
	}
	if a, b := s.Tests[0], s.Tests[1]; a.Format.String() != "maxwell" || a.Table != "db.t" || b.Format.String() != "canal" || b.Table != "db.u" {
		t.Errorf("defaults not applied or not overridden: %+v / %+v", a, b)
	}
}

// TestEventJSON checks that events written as YAML become the JSON a
// producer would send, with numbers kept digit for digit.
func TestEventJSON(t *testing.T) {
	tests := []struct{ yaml, want string }{
		{`{a: 1, b: -2, c: 0}`, `{"a":1,"b":-2,"c":0}`},
		{`{big: 18446744073709551615, bigger: 123456789012345678901234567890}`, `{"big":18446744073709551615,"bigger":123456789012345678901234567890}`},
		{`{neg: -9223372036854775809}`, `{"neg":-9223372036854775809}`},
		{`{hex: 0x1F, oct: 0o17, plus: +5}`, `{"hex":31,"oct":15,"plus":5}`},
		{`{f: 3.140000104904175, e: 1e-7, g: 4500000001.512456777, p: +1.5}`, `{"f":3.140000104904175,"e":1e-7,"g":4500000001.512456777,"p":1.5}`},
		{`{t: true, f: False, n: null, tilde: ~, empty: }`, `{"t":true,"f":false,"n":null,"tilde":null,"empty":null}`},
		{`{s: "x\"y\\z", u: "grüße", q: '007', d: "12", html: "<&>"}`, `{"s":"x\"y\\z","u":"grüße","q":"007","d":"12","html":"<&>"}`},
		{`{list: [1, "a", [], {}], nested: {x: {y: [null]}}}`, `{"list":[1,"a",[],{}],"nested":{"x":{"y":[null]}}}`},
		{`{z: 1, a: 2, m: 3}`, `{"z":1,"a":2,"m":3}`},
		{"base: &b {id: 1}\ncopy: *b", `{"base":{"id":1},"copy":{"id":1}}`},
		{`{1: one, true: yes}`, `{"1":"one","true":"yes"}`},
	}
	for _, tt := range tests {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(tt.yaml), &doc); err != nil {
			t.Fatalf("%s: %v", tt.yaml, err)
		}
		var buf bytes.Buffer
		if err := appendJSON(&buf, doc.Content[0]); err != nil {
			t.Errorf("%s: %s", tt.yaml, err.msg)
			continue
		}
		if buf.String() != tt.want {
			t.Errorf("%s:\n got %s\nwant %s", tt.yaml, buf.String(), tt.want)
		}
	}
}

func TestEventJSONErrors(t *testing.T) {
	tests := []struct{ yaml, want string }{
		{`{x: .inf}`, "number .inf has no JSON form; write it like 1.5 or 2e-3"},
		{`{x: .nan}`, "number .nan has no JSON form; write it like 1.5 or 2e-3"},
		{`{x: !!binary aGVsbG8=}`, "values tagged !!binary have no JSON form"},
		{`{x: !custom 1}`, "values tagged !custom have no JSON form"},
		{`{[a]: 1}`, "object keys must be strings"},
		{`{~: 1}`, "object keys must be strings"},
		{strings.Repeat("[", 70) + strings.Repeat("]", 70), "nested too deeply"},
		{aliasBomb(), "more than 1048576 values (aliases included)"},
	}
	for _, tt := range tests {
		var doc yaml.Node
		if err := yaml.Unmarshal([]byte(tt.yaml), &doc); err != nil {
			t.Fatalf("%s: %v", tt.yaml, err)
		}
		var buf bytes.Buffer
		err := appendJSON(&buf, doc.Content[0])
		if err == nil || err.msg != tt.want {
			t.Errorf("%s: error %v, want %q", tt.yaml, err, tt.want)
		}
	}
}

// aliasBomb is a small document whose aliases expand to 10^8 values.
func aliasBomb() string {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i <= 8; i++ {
		fmt.Fprintf(&b, "a%d: &a%d [", i, i)
		for j := range 10 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*a%d", i-1)
		}
		b.WriteString("]\n")
	}
	return b.String()
}

func TestIsJSONNumber(t *testing.T) {
	for s, want := range map[string]bool{
		"0": true, "-0": true, "12": true, "1.5": true, "1e5": true, "1E+5": true, "-1.5e-3": true,
		"": false, "-": false, "01": false, "1.": false, ".5": false, "+1": false, "1e": false, "0x1": false, "1_000": false, "NaN": false,
	} {
		if got := isJSONNumber(s); got != want {
			t.Errorf("isJSONNumber(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestDiffLines(t *testing.T) {
	tests := []struct {
		a, b []string
		want string
	}{
		{nil, nil, ""},
		{[]string{"x"}, nil, "- x"},
		{nil, []string{"x"}, "+ x"},
		{[]string{"a", "b", "c"}, []string{"a", "c"}, "  a|- b|  c"},
		{[]string{"a", "c"}, []string{"a", "b", "c"}, "  a|+ b|  c"},
		{[]string{"a", "b"}, []string{"b", "a"}, "- a|  b|+ a"},
		{[]string{"a", "x", "c"}, []string{"a", "y", "c"}, "  a|- x|+ y|  c"},
	}
	for _, tt := range tests {
		if got := strings.Join(diffLines(tt.a, tt.b), "|"); got != tt.want {
			t.Errorf("diff(%q, %q) = %q, want %q", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestRun(t *testing.T) {
	s, err := Load("testdata/suite.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.LoadRules()
	if err != nil {
		t.Fatal(err)
	}
	results := s.Run(rs)
	want := map[string]string{
		"args are compared when listed": "event 1 (line 6): ops differ (- expected, + got):\n" +
			`    {event: 1, rule: interests, op: set_remove, key: "t:interests:7", member: "go", args: ["7"]}` + "\n" +
			`  - {event: 1, rule: interests, op: set_add, key: "t:interests:8", member: "go", args: ["9"]}` + "\n" +
			`  + {event: 1, rule: interests, op: set_add, key: "t:interests:8", member: "go", args: ["8"]}` + "\n",
		"args are not compared when not listed":          "",
		"a tombstone and a skipped message plan nothing": "",
		"errors are matched by substring":                "",
	}
	if len(results) != len(want) {
		t.Fatalf("%d results, want %d", len(results), len(want))
	}
	for _, r := range results {
		w, ok := want[r.Test.Name]
		if !ok {
			t.Errorf("unexpected test %q", r.Test.Name)
			continue
		}
		if got := strings.Join(r.Failures, ""); got != w {
			t.Errorf("%s: failures:\n%s\nwant:\n%s", r.Test.Name, got, w)
		}
		if r.Passed() != (w == "") {
			t.Errorf("%s: Passed() = %v", r.Test.Name, r.Passed())
		}
	}
}

func TestRunFilesReportsBrokenRuleFiles(t *testing.T) {
	dir := t.TempDir()
	test := filepath.Join(dir, "t.yaml")
	if err := os.WriteFile(filepath.Join(dir, "r.yaml"), []byte("version: 1\nrules:\n  - name: x\n    table: a.b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(test, []byte("rule_files: [r.yaml]\ntests: [{name: a, events: [null], expect: []}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	sum, err := RunFiles(&out, test)
	if err != nil {
		t.Fatal(err)
	}
	if sum.OK() || sum.BrokenFiles != 1 {
		t.Fatalf("summary %+v", sum)
	}
	want := "BROKEN " + test + ": rule files do not load\n    " + filepath.Join(dir, "r.yaml") + ":3:5: "
	if !strings.HasPrefix(out.String(), want) || !strings.HasSuffix(out.String(), "0 passed, 0 failed, 1 of 1 files could not be run\n") {
		t.Fatalf("output:\n%s\nwant it to start with:\n%s", out.String(), want)
	}
}

// FuzzParse feeds arbitrary documents to the test-file parser: it must
// return a suite or a *ParseError, never panic.
func FuzzParse(f *testing.F) {
	for _, name := range []string{"broken.yaml", "suite.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte("tests: [{events: [{a: &x [*x]}]}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse("f.yaml", data)
		var pe *ParseError
		if (s == nil) == (err == nil) || err != nil && !errors.As(err, &pe) {
			t.Fatalf("Parse = %v, %v", s, err)
		}
	})
}
