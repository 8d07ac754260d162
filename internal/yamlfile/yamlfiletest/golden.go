// Package yamlfiletest holds the table test that config, rule files and
// rule tests share: each reads the files of its
// testdata/yaml-mistakes/NAME.yaml, each holding one YAML mistake, and
// its problems must be those of NAME.errors, so that every mistake is
// worded once (package yamlfile).
package yamlfiletest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Mistakes runs one subtest per testdata/yaml-mistakes/NAME.yaml:
// parse(path, contents) must fail with the error text of NAME.errors
// (one problem a line), or succeed when NAME.errors is empty. update
// rewrites the .errors files from what parse returns.
func Mistakes(t *testing.T, update bool, parse func(path string, data []byte) error) {
	t.Helper()
	files, err := filepath.Glob("testdata/yaml-mistakes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures in testdata/yaml-mistakes: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if err := parse(f, data); err != nil {
				got = err.Error() + "\n"
			}
			Golden(t, strings.TrimSuffix(f, ".yaml")+".errors", got, update)
		})
	}
}

// Golden compares got with the contents of the file golden, after
// writing got there when update is set.
func Golden(t *testing.T, golden, got string, update bool) {
	t.Helper()
	if update {
		if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("problems differ\n--- got\n%s--- want\n%s", got, want)
	}
}
