package ruletest

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/yaml-mistakes/*.errors")

// TestYAMLMistakes parses testdata/yaml-mistakes/NAME.yaml, each a test file
// with one YAML mistake, and compares the problems with NAME.errors: each
// mistake has one wording in config, rule files and rule tests
// (internal/yamlfile).
func TestYAMLMistakes(t *testing.T) {
	files, err := filepath.Glob("testdata/yaml-mistakes/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			got := ""
			if _, err := Parse(f, data); err != nil {
				got = err.Error() + "\n"
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".errors"
			if *update {
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
		})
	}
}
