package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/integration"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

const exampleConfig = "../../configs/cachewarden.yaml"

func TestCheckUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		err  string // in the error, when set
	}{
		{args: []string{"check"}, code: 2},
		{args: []string{"check", "-c", exampleConfig, "--format", "xml"}, code: 2},
		{args: []string{"check", "-c", exampleConfig, "--database", "shop"}, code: 2},
		{args: []string{"check", "-c", exampleConfig, "extra"}, code: 2},
		{args: []string{"check", "-c", exampleConfig, "--dsn", "x@tcp(h:1)/d", "--config-dsn"}, code: 2},
		{args: []string{"check", "-c", exampleConfig, "--dsn", ""}, code: 2, err: "--dsn is empty (an unset variable?)"},
		{args: []string{"check", "-c", exampleConfig, "--dsn="}, code: 2, err: "--dsn is empty"},
		{args: []string{"help", "check"}, code: 0},
	} {
		_, _, err := invoke(t, "", tc.args...)
		if got := exitCode(err); got != tc.code || (tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err))) {
			t.Errorf("%q: exit code %d (err %v), want %d and %q", tc.args, got, err, tc.code, tc.err)
		}
	}
}

// TestCheckExitStatus runs `check` on the example rules against the
// example schema with and without the index their recount needs: a
// warning fails only with --warnings-as-errors; --format json is one
// object.
func TestCheckExitStatus(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	if err := integration.NewSchema("", "").Create(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	out, _, err := invoke(t, "", "check", "-c", exampleConfig, "--dsn", dsn, "--warnings-as-errors")
	if err != nil || !strings.Contains(out, "0 errors, 0 warnings") {
		t.Fatalf("example rules: err %v, output:\n%s", err, out)
	}
	if _, err := db.Exec("ALTER TABLE comments DROP INDEX post_id"); err != nil {
		t.Fatal(err)
	}
	out, _, err = invoke(t, "", "check", "-c", exampleConfig, "--dsn", dsn)
	if err != nil || !strings.Contains(out, "blog.yaml:28:16: warning: rule \"post-comments\": recount reads the whole table comments") {
		t.Fatalf("without the index: err %v, output:\n%s", err, out)
	}
	_, _, err = invoke(t, "", "check", "-c", exampleConfig, "--dsn", dsn, "--warnings-as-errors")
	if exitCode(err) != 1 {
		t.Fatalf("--warnings-as-errors: err %v, want exit status 1", err)
	}
	out, _, err = invoke(t, "", "check", "-c", exampleConfig, "--dsn", dsn, "--format", "json")
	var rep struct {
		Findings []struct{ File, Severity, Message string }
		Warnings int
	}
	if err != nil || json.Unmarshal([]byte(out), &rep) != nil || rep.Warnings != 1 || len(rep.Findings) != 1 {
		t.Fatalf("json: err %v, output:\n%s", err, out)
	}
}
