package rulefile

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// FuzzParse checks that the loader never panics and that what it accepts
// or rejects is well-formed.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"testdata/good", "testdata/bad", "testdata/dir"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.y*ml"))
		for _, name := range files {
			if data, err := os.ReadFile(name); err == nil { // skips directories
				f.Add(data)
			}
		}
	}
	if data, err := os.ReadFile("../testdata/plan.yaml"); err == nil {
		f.Add(data)
	}
	f.Add([]byte("version: 1\nrules:\n  - name: r\n    table: t\n    when: |\n      a == 1 &&\n        b ** 2\n    bump: k\n"))
	f.Add([]byte("version: 1\nrules:\n  - &a {name: r, table: t, bump: k, on: &o [insert]}\n  - {name: s, table: t, bump: k, on: *o}\n"))
	f.Add([]byte("")) // an empty file: a problem of the whole file
	f.Add([]byte("version: 1\nrules: [{name: r, table: t, when: '((((((a))))))', count: {key: 'c:{x}', recount: '?'}}]"))
	f.Fuzz(func(t *testing.T, data []byte) {
		rs, err := Parse("f.yaml", data)
		if err != nil {
			var le *rules.LoadError
			if !errors.As(err, &le) || len(le.Problems) == 0 {
				t.Fatalf("error %v (%T) is not a *LoadError with problems", err, err)
			}
			for _, p := range le.Problems {
				// A problem of the whole file (an empty one) has no
				// position; every other is at a line and column.
				whole := p.Line == 0 && p.Column == 0
				if p.File != "f.yaml" || !whole && (p.Line < 1 || p.Column < 1) || p.Msg == "" {
					t.Fatalf("malformed problem %+v", p)
				}
			}
			if rs != nil {
				t.Fatal("RuleSet returned along with an error")
			}
			return
		}
		seen := map[string]bool{}
		for _, r := range rs.Rules() {
			if r.Name == "" || seen[r.Name] || r.Key == nil || r.Table == "" || len(r.On) == 0 ||
				(r.Kind == rules.SetRule) != (r.Member != nil) || (r.Query == "" && r.Args != nil) {
				t.Fatalf("malformed rule %+v", *r)
			}
			seen[r.Name] = true
		}
	})
}
