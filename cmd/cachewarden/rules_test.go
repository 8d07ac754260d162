package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestRulesCheck(t *testing.T) {
	t.Run("valid files", func(t *testing.T) {
		out, errOut, err := invoke(t, "", "rules", "check", "testdata/plan/inventory.yaml", "testdata/check/good.yaml")
		if err != nil || errOut != "" {
			t.Fatalf("err %v, stderr %q", err, errOut)
		}
		if out != "9 rules in 2 files OK\n" {
			t.Fatalf("stdout %q", out)
		}
	})

	t.Run("every mistake is reported", func(t *testing.T) {
		const f = "testdata/check/six-mistakes.yaml"
		out, errOut, err := invoke(t, "", "rules", "check", f)
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d (err %v), want 1", code, err)
		}
		if out != "" {
			t.Errorf("stdout %q, want nothing", out)
		}
		// Each mistake at its position; the message is checked loosely
		// (its wording belongs to the rule loader).
		want := []struct{ pos, words string }{
			{f + ":7:5: ", "colums"},
			{f + ":12:11: ", "unclosed"},
			{f + ":14:11: ", "duplicate rule name"},
			{f + ":20:19: ", "when"},
			{f + ":28:5: ", "both bump and count"},
			{f + ":33:18: ", "truncate"},
		}
		lines := strings.Split(strings.TrimSuffix(errOut, "\n"), "\n")
		if len(lines) != len(want) {
			t.Fatalf("%d lines, want %d:\n%s", len(lines), len(want), errOut)
		}
		for i, w := range want {
			if !strings.HasPrefix(lines[i], w.pos) || !strings.Contains(lines[i], w.words) {
				t.Errorf("line %d = %q, want %q... mentioning %q", i+1, lines[i], w.pos, w.words)
			}
		}
	})
}

func TestRulesTest(t *testing.T) {
	t.Run("passing file", func(t *testing.T) {
		out, _, err := invoke(t, "", "rules", "test", "testdata/ruletest/pass.yaml")
		if err != nil {
			t.Fatalf("err %v, output:\n%s", err, out)
		}
		want := "ok   testdata/ruletest/pass.yaml (2 tests)\n2 passed, 0 failed\n"
		if out != want {
			t.Fatalf("stdout:\n%s\nwant:\n%s", out, want)
		}
	})

	t.Run("failing file", func(t *testing.T) {
		out, _, err := invoke(t, "", "rules", "test", "testdata/ruletest/pass.yaml", "testdata/ruletest/fail.yaml")
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d (err %v), want 1; output:\n%s", code, err, out)
		}
		for _, want := range []string{
			"FAIL testdata/ruletest/fail.yaml (3 of 4 tests failed)\n",
			// The wrong key: test name, event index, expected and got.
			"--- FAIL: wrong key on the second event (testdata/ruletest/fail.yaml:9)\n" +
				"    event 2 (line 13): ops differ (- expected, + got):\n" +
				`        {event: 2, rule: product-names, op: set_remove, key: "inv:names:anvil", member: "120"}` + "\n" +
				`      - {event: 2, rule: product-names, op: set_add, key: "inv:names:big anvil", member: "120"}` + "\n" +
				`      + {event: 2, rule: product-names, op: set_add, key: "inv:names:big%20anvil", member: "120"}` + "\n",
			"--- FAIL: an error nobody expected (testdata/ruletest/fail.yaml:19)\n" +
				`    event 1 (line 21): unexpected error: rule "customer": column "id" missing`,
			"--- FAIL: an expected error that does not happen (testdata/ruletest/fail.yaml:24)\n" +
				`    event 1 (line 26): expected an error containing "missing", got none` + "\n",
			"\n3 passed, 3 failed\n",
		} {
			if !strings.Contains(out, want) {
				t.Errorf("output lacks\n%s\n--- output:\n%s", want, out)
			}
		}
		if strings.Contains(out, "--- FAIL: passes") {
			t.Errorf("the passing test is reported as failed:\n%s", out)
		}
	})

	t.Run("broken file", func(t *testing.T) {
		out, _, err := invoke(t, "", "rules", "test", "testdata/ruletest/no-such.yaml")
		if code := exitCode(err); code != 1 {
			t.Fatalf("exit code %d (err %v), want 1", code, err)
		}
		if !strings.Contains(out, "BROKEN testdata/ruletest/no-such.yaml") || !strings.HasSuffix(out, "0 passed, 0 failed, 1 of 1 files could not be run\n") {
			t.Fatalf("output:\n%s", out)
		}
	})
}

// TestExampleRules checks the example rules and runs their unit tests, as
// `make test` does with the built binary.
func TestExampleRules(t *testing.T) {
	out, errOut, err := invoke(t, "", "rules", "check", "../../configs/rules")
	if err != nil || !strings.HasSuffix(out, " OK\n") {
		t.Fatalf("rules check: err %v\n%s%s", err, out, errOut)
	}
	files, err := filepath.Glob("../../configs/rules/tests/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no example rule tests: %v", err)
	}
	out, errOut, err = invoke(t, "", append([]string{"rules", "test"}, files...)...)
	if err != nil || !strings.HasSuffix(out, " failed\n") || strings.Contains(out, "FAIL") {
		t.Fatalf("rules test: err %v\n%s%s", err, out, errOut)
	}
}
