package check

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
)

// TestReportText runs the checks that need no database on fixtures and
// compares the text report with the expected one (testdata/*/want.txt).
func TestReportText(t *testing.T) {
	for _, tc := range []struct {
		dir    string
		failed bool
	}{
		{dir: "testdata/failing", failed: true},   // a rule test fails
		{dir: "testdata/badconfig", failed: true}, // config and rule file mistakes
	} {
		t.Run(tc.dir, func(t *testing.T) {
			rep, err := Run(context.Background(), Options{Config: tc.dir + "/cachewarden.yaml"})
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			if err := rep.WriteText(&b); err != nil {
				t.Fatal(err)
			}
			want, err := os.ReadFile(tc.dir + "/want.txt")
			if err != nil {
				t.Fatal(err)
			}
			if b.String() != string(want) {
				t.Errorf("report:\n%s\nwant:\n%s", b.String(), want)
			}
			if rep.Failed(false) != tc.failed {
				t.Errorf("failed %v, want %v", rep.Failed(false), tc.failed)
			}
		})
	}
}

// TestReportJSON checks the JSON form: one object, every finding with
// its position and severity, the counts.
func TestReportJSON(t *testing.T) {
	rep, err := Run(context.Background(), Options{Config: "testdata/badconfig/cachewarden.yaml"})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	var got struct {
		Findings []map[string]any `json:"findings"`
		Errors   int              `json:"errors"`
		Warnings int              `json:"warnings"`
	}
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatalf("%v:\n%s", err, b.String())
	}
	if got.Errors != 2 || got.Warnings != 0 || len(got.Findings) != 2 {
		t.Fatalf("got %+v", got)
	}
	f := got.Findings[1]
	if f["file"] != "testdata/badconfig/rules/blog.yaml" || f["line"] != 5.0 || f["column"] != 11.0 || f["severity"] != "error" {
		t.Errorf("finding %v", f)
	}
}

// TestExplicitTests runs the rule tests named, not those beside the
// rules, and reports a path that does not exist.
func TestExplicitTests(t *testing.T) {
	rep, err := Run(context.Background(), Options{Config: "testdata/failing/cachewarden.yaml",
		Tests: []string{"../configs/rules/tests/comments.yaml", "testdata/nowhere"}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.TestFiles != 1 || rep.TestsFailed != 0 || rep.TestsPassed == 0 || rep.Errors != 1 || rep.Findings[0].File != "testdata/nowhere" {
		t.Errorf("report %+v", rep)
	}
}

func TestFindingString(t *testing.T) {
	for _, tc := range []struct {
		f    Finding
		want string
	}{
		{Finding{File: "a.yaml", Line: 3, Column: 7, Severity: Error, Message: "bad"}, "a.yaml:3:7: error: bad"},
		{Finding{File: "a.yaml", Line: 3, Severity: Warning, Message: "x\n  y\n"}, "a.yaml:3: warning: x; y"},
		{Finding{File: "a.yaml", Severity: Error, Message: "diff:\n- a\n+ b"}, "a.yaml: error: diff: - a; + b"},
		{Finding{Severity: Error, Message: "no file"}, "error: no file"},
	} {
		if got := tc.f.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.f, got, tc.want)
		}
	}
}

// TestSchemaSkippedSummary: a schema asked for but not checked says why
// in the summary, never "no --dsn".
func TestSchemaSkippedSummary(t *testing.T) {
	for _, tc := range []struct {
		o    Options
		want string
	}{
		{Options{Config: "testdata/badconfig/cachewarden.yaml", ConfigDSN: true}, ", schema not checked (the config does not load): 2 errors"},
		{Options{Config: "testdata/badconfig/cachewarden.yaml", DSN: "cw@tcp(127.0.0.1:1)/app"}, ", schema not checked (the config does not load): 2 errors"},
		{Options{Config: "testdata/failing/cachewarden.yaml", ConfigDSN: true}, ", schema not checked (mysql.dsn is not set): 2 errors"},
		{Options{Config: "testdata/badconfig/cachewarden.yaml"}, ", no schema (no --dsn): 2 errors"},
	} {
		rep, err := Run(context.Background(), tc.o)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := rep.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("%+v: report\n%s\nwant it to end %q", tc.o, b.String(), tc.want)
		}
	}
}
