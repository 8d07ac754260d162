package yamlfile

import (
	"errors"
	"flag"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/internal/yamlfile/yamlfiletest"
)

var update = flag.Bool("update", false, "rewrite testdata/decode/*.out golden files")

// shelf declares the file kind the Decoder tests read: one field of each
// type the Decoder knows.
type shelf struct {
	Name    string            `yaml:"name"`
	Kind    shelfKind         `yaml:"kind"`
	Count   int               `yaml:"count"`
	Ratio   float64           `yaml:"ratio"`
	Open    bool              `yaml:"open"`
	Wait    time.Duration     `yaml:"wait"`
	Waits   []time.Duration   `yaml:"waits"`
	Hosts   []string          `yaml:"hosts,commas"`
	Tags    []string          `yaml:"tags"`
	Labels  map[string]string `yaml:"labels"`
	Weights map[string]int    `yaml:"weights"`
	Box     box               `yaml:"box"`
	Raw     *yaml.Node        `yaml:"raw"`
	Pair    Field             `yaml:"pair"`
	Loaded  string            // not read from the file
}

type shelfKind string

type box struct {
	Size int `yaml:"size"`
}

// shelfPaths are the paths whose places each golden file lists.
var shelfPaths = []string{"name", "count", "hosts[1]", "tags[1]", `weights["a"]`, "box", "box.size", "waits[1]"}

// TestDecode decodes each testdata/decode/NAME.yaml into a shelf, ${X}
// expanding to "x" and ${BAD} failing, a null mapping empty unless NAME
// starts with "strict-", and compares the problems, the
// value decoded, and the places of shelfPaths (Set, Readable, Place and
// KeyPlace) with NAME.out (go test -update rewrites them).
func TestDecode(t *testing.T) {
	files, err := filepath.Glob("testdata/decode/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			root, err := Parse(readFile(t, f))
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			d := &Decoder{
				NullIsEmpty: !strings.HasPrefix(filepath.Base(f), "strict-"),
				Errorf: func(n *yaml.Node, format string, args ...any) {
					fmt.Fprintf(&got, "%d:%d: %s\n", n.Line, n.Column, fmt.Sprintf(format, args...))
				},
				Text: func(s string) (string, error) {
					if strings.Contains(s, "${BAD}") {
						return "", errors.New("${BAD} is not set")
					}
					return strings.ReplaceAll(s, "${X}", "x"), nil
				},
			}
			var s shelf
			d.Decode(root, "", &s)
			if s.Raw != nil {
				fmt.Fprintf(&got, "raw: %s at %v\n", Kind(s.Raw), At(s.Raw))
				s.Raw = nil
			}
			if s.Pair.Value != nil {
				fmt.Fprintf(&got, "pair: %s at %v, %s at %v\n", s.Pair.Key.Value, At(s.Pair.Key), Kind(s.Pair.Value), At(s.Pair.Value))
				s.Pair = Field{}
			}
			fmt.Fprintf(&got, "decoded: %+v\n", s)
			for _, p := range shelfPaths {
				fmt.Fprintf(&got, "%s: set=%v readable=%v place=%v key=%v\n", p, d.Set(p), d.Readable(p), d.Place(p), d.KeyPlace(p))
			}
			yamlfiletest.Golden(t, strings.TrimSuffix(f, ".yaml")+".out", got.String(), *update)
		})
	}
}

// TestScalars reads each value of testdata/scalars.yaml with String and
// with Int (from -5 to 100) and compares what they return and report
// with testdata/scalars.out (go test -update rewrites it).
func TestScalars(t *testing.T) {
	root, err := Parse(readFile(t, "testdata/scalars.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var got strings.Builder
	errorf := func(n *yaml.Node, format string, args ...any) {
		fmt.Fprintf(&got, "  %d:%d: %s\n", n.Line, n.Column, fmt.Sprintf(format, args...))
	}
	for _, f := range Keys(root, "", errorf) {
		s, ok := String(f.Value, f.Key.Value, errorf)
		fmt.Fprintf(&got, "%s: String %q %v\n", f.Key.Value, s, ok)
		i, ok := Int(f.Value, f.Key.Value, -5, 100, errorf)
		fmt.Fprintf(&got, "%s: Int %d %v\n", f.Key.Value, i, ok)
	}
	yamlfiletest.Golden(t, "testdata/scalars.out", got.String(), *update)
}
