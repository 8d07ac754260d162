package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// docObserverExample returns the observer section example of
// docs/operations.md (the YAML block after the observer-config marker).
func docObserverExample(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- observer-config -->")
	if !ok {
		t.Fatal("docs/operations.md has no <!-- observer-config --> marker")
	}
	_, rest, ok = strings.Cut(rest, "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```")
	if !ok || !ok2 {
		t.Fatal("no YAML block after the observer-config marker")
	}
	return block
}

// TestObserverSection loads the observer section of docs/operations.md
// in a minimal config.
func TestObserverSection(t *testing.T) {
	base, err := os.ReadFile("testdata/minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadBytes("testdata/observer.yaml", append(base, docObserverExample(t)...), env(nil))
	if err != nil {
		t.Fatalf("the documented observer section does not load:\n%v", err)
	}
	want := Observer{
		Enabled: true, Sample: 0.01, MaxPerSecond: 10,
		Windows:      []time.Duration{time.Second, 10 * time.Second, time.Minute},
		ConfirmAfter: 5 * time.Second, MySQLQueriesPerSecond: 50, MemcachedReadsPerSecond: 500,
	}
	if !reflect.DeepEqual(cfg.Observer, want) {
		t.Errorf("observer:\n got %+v\nwant %+v", cfg.Observer, want)
	}
	if g := cfg.ObserverGroup(); g != "cw-observer" {
		t.Errorf("observe's group %q, want cw-observer", g)
	}
	if cfg, err := LoadEnv("testdata/minimal.yaml", env(nil)); err != nil || cfg.Observer.Enabled {
		t.Errorf("the observer is on by default (%v)", err)
	}
}

// TestObserverProblems reports every problem of a bad observer section
// (testdata/observer-bad.errors; go test -update rewrites it).
func TestObserverProblems(t *testing.T) {
	_, err := LoadEnv("testdata/observer-bad.yaml", env(nil))
	if err == nil {
		t.Fatal("no error")
	}
	got := err.Error() + "\n"
	golden := filepath.Join("testdata", "observer-bad.errors")
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
}
