package yamlfile

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestParseSyntax parses each testdata/syntax/NAME.yaml and compares the
// error with NAME.error ("line:col: message"; empty when the file parses).
func TestParseSyntax(t *testing.T) {
	files, err := filepath.Glob("testdata/syntax/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			data := readFile(t, f)
			want := strings.TrimSpace(string(readFile(t, strings.TrimSuffix(f, ".yaml")+".error")))
			_, err := Parse(data)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != want {
				t.Errorf("Parse(%q):\n got %q\nwant %q", data, got, want)
			}
		})
	}
}

// TestMapping walks each testdata/mapping/NAME.yaml as a mapping of
// name, size and shape called "box" and compares the problems with
// NAME.errors.
func TestMapping(t *testing.T) {
	files, err := filepath.Glob("testdata/mapping/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no fixtures: %v", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			root, err := Parse(readFile(t, f))
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			errorf := func(n *yaml.Node, format string, args ...any) {
				fmt.Fprintf(&got, "%d:%d: %s\n", n.Line, n.Column, fmt.Sprintf(format, args...))
			}
			fs, ok := Mapping(root, "box", []string{"name", "size", "shape"}, errorf)
			want := string(readFile(t, strings.TrimSuffix(f, ".yaml")+".errors"))
			if got.String() != want {
				t.Errorf("problems:\n%s\nwant:\n%s", got.String(), want)
			}
			if !ok {
				return
			}
			for _, f := range fs {
				if f.Value.Kind == yaml.AliasNode || f.Key.Kind == yaml.AliasNode {
					t.Errorf("field %q: alias not followed", f.Key.Value)
				}
			}
		})
	}
}

func TestMappingKeepsFileOrderAndFirstValue(t *testing.T) {
	root, err := Parse([]byte("size: 1\nname: a\nsize: 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	var problems int
	fs, _ := Mapping(root, "", []string{"name", "size"}, func(*yaml.Node, string, ...any) { problems++ })
	if len(fs) != 2 || fs[0].Key.Value != "size" || fs[1].Key.Value != "name" || problems != 1 {
		t.Fatalf("fields %v, %d problems; want size, name and one problem", fs, problems)
	}
	if f, _ := fs.Get("size"); f.Value.Value != "1" {
		t.Errorf("size = %q, want the first value 1", f.Value.Value)
	}
	if fs.Has("shape") {
		t.Error("Has(shape) = true for a key left out")
	}
}

func TestKind(t *testing.T) {
	for src, want := range map[string]string{
		"~": "null", "a": "a string", "'1'": "a string", "1": "an integer", "1.5": "a number",
		"true": "a boolean", "[1]": "a list", "{a: 1}": "a mapping", "!!binary aGk=": "a value",
	} {
		n, err := Parse([]byte(src))
		if err != nil {
			t.Fatal(err)
		}
		if got := Kind(n); got != want {
			t.Errorf("Kind(%s) = %q, want %q", src, got, want)
		}
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// FuzzParse checks that any input parses or fails with an *Error inside
// the file, and that walking the result as a mapping never panics.
func FuzzParse(f *testing.F) {
	seeds, _ := filepath.Glob("testdata/*/*.yaml")
	for _, s := range seeds {
		data, err := os.ReadFile(s)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		root, err := Parse(data)
		if err != nil {
			e, ok := err.(*Error)
			if !ok {
				t.Fatalf("error %T, want *Error: %v", err, err)
			}
			lines := len(lineStarts(data))
			if e.Line < 1 || e.Line > lines || e.Column < 1 || e.Msg == "" {
				t.Fatalf("error %q outside the file of %d lines", e, lines)
			}
			return
		}
		if root == nil {
			return
		}
		Mapping(root, "x", []string{"a"}, func(n *yaml.Node, format string, args ...any) {
			if n == nil {
				t.Fatalf("problem %q at no node", fmt.Sprintf(format, args...))
			}
		})
	})
}
