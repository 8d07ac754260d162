package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"strings"
	"testing"
)

// update rewrites the golden files of TestPlanGolden. Review every change
// by hand against the rule files before committing it.
var update = flag.Bool("update", false, "rewrite golden files")

// invoke runs one command line in-process with stdin as standard input.
func invoke(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = runWithInput(context.Background(), strings.NewReader(stdin), args, &out, &errOut)
	return out.String(), errOut.String(), err
}

func TestUsage(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		wantCode int
		// wantOut and wantErr must appear in stdout and stderr.
		wantOut, wantErr string
	}{
		{name: "no command", args: nil, wantCode: 2, wantErr: "Usage: cachewarden"},
		{name: "unknown command", args: []string{"frobnicate"}, wantCode: 2},
		{name: "help lists the commands", args: []string{"help"}, wantCode: 0, wantOut: "  plan "},
		{name: "-h", args: []string{"-h"}, wantCode: 0, wantErr: "Commands:"},
		{name: "help of a command goes to stdout", args: []string{"help", "plan"}, wantCode: 0, wantOut: "-strict"},
		{name: "help of a subcommand", args: []string{"help", "rules", "check"}, wantCode: 0, wantOut: "rules check PATH..."},
		{name: "plan -h", args: []string{"plan", "-h"}, wantCode: 0, wantErr: "--rules"},
		{name: "plan without rules", args: []string{"plan"}, wantCode: 2, wantErr: "Usage: cachewarden plan"},
		{name: "plan with an argument", args: []string{"plan", "--rules", "x.yaml", "input.ndjson"}, wantCode: 2},
		{name: "plan with a bad format", args: []string{"plan", "--rules", "x.yaml", "--format", "avro"}, wantCode: 2},
		{name: "plan with a bad table", args: []string{"plan", "--rules", "x.yaml", "--table", "users"}, wantCode: 2},
		{name: "plan with an unknown flag", args: []string{"plan", "--rulez", "x.yaml"}, wantCode: 2, wantErr: "flag provided but not defined: -rulez"},
		{name: "rules without subcommand", args: []string{"rules"}, wantCode: 2},
		{name: "rules check without paths", args: []string{"rules", "check"}, wantCode: 2},
		{name: "rules test without files", args: []string{"rules", "test"}, wantCode: 2},
		{name: "bad log format", args: []string{"--log-format", "xml", "help"}, wantCode: 2},
		{name: "bad log level", args: []string{"--log-level", "loud", "help"}, wantCode: 2},
		{name: "json logs", args: []string{"--log-format", "json", "--log-level", "debug", "rules", "check", "testdata/plan/inventory.yaml"}, wantCode: 0, wantOut: "8 rules in 1 file OK"},
		{name: "missing rule file fails", args: []string{"rules", "check", "testdata/no-such.yaml"}, wantCode: 1, wantErr: "testdata/no-such.yaml: no such file or directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, errOut, err := invoke(t, "", tt.args...)
			if code := exitCode(err); code != tt.wantCode {
				t.Errorf("exit code %d (err %v), want %d", code, err, tt.wantCode)
			}
			if !strings.Contains(out, tt.wantOut) {
				t.Errorf("stdout does not contain %q:\n%s", tt.wantOut, out)
			}
			if !strings.Contains(errOut, tt.wantErr) {
				t.Errorf("stderr does not contain %q:\n%s", tt.wantErr, errOut)
			}
		})
	}
}

func compareGolden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("%s differs:\n--- got\n%s\n--- want\n%s", path, got, want)
	}
}
