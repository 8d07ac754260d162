package check

import (
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestScanQuery(t *testing.T) {
	data, err := os.ReadFile("testdata/sqlscan.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name, Query, Ref, Table string
		Has, Columns            []string
	}
	if err := yaml.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			s := scanQuery(tc.Query)
			ref, ok := s.table(tc.Ref)
			if !ok || ref.name != tc.Table {
				t.Errorf("table(%q) = %+v, %v; want %q (tables %+v)", tc.Ref, ref, ok, tc.Table, s.tables)
			}
			got := s.indexColumns(tc.Ref, func(c string) bool { return slices.Contains(tc.Has, c) })
			if !slices.Equal(got, tc.Columns) && !(len(got) == 0 && len(tc.Columns) == 0) {
				t.Errorf("index columns %q, want %q (conditions %+v)", got, tc.Columns, s.conds)
			}
		})
	}
}

// TestExplicitCollations reads the collations queries name for their
// columns (testdata/collate.yaml).
func TestExplicitCollations(t *testing.T) {
	data, err := os.ReadFile("testdata/collate.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name, Query string
		Collations  map[string][]string
		Collapses   bool
	}
	if err := yaml.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			got := explicitCollations(tc.Query)
			if len(got) != len(tc.Collations) {
				t.Errorf("collations %q, want %q", got, tc.Collations)
			}
			for col, want := range tc.Collations {
				if !slices.Equal(got[col], want) {
					t.Errorf("collations of %s: %q, want %q (all: %q)", col, got[col], want, got)
				}
			}
			if c := collapses(tc.Query); c != tc.Collapses {
				t.Errorf("collapses = %v, want %v", c, tc.Collapses)
			}
		})
	}
}

func TestIsSelect(t *testing.T) {
	for q, want := range map[string]bool{
		"SELECT 1":                             true,
		"  select id from t":                   true,
		"(SELECT 1) UNION (SELECT 2)":          true,
		"WITH x AS (SELECT 1) SELECT * FROM x": true,
		"/* note */ SELECT 1":                  true,
		"DELETE FROM t WHERE id = ?":           false,
		"UPDATE t SET a = 1":                   false,
		"":                                     false,
	} {
		if got := isSelect(q); got != want {
			t.Errorf("isSelect(%q) = %v, want %v", q, got, want)
		}
	}
}

// FuzzScanQuery feeds rule queries (text from rule files) to the scanner:
// it must never panic nor loop.
func FuzzScanQuery(f *testing.F) {
	for _, q := range []string{
		"SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1",
		"SELECT `a``b` FROM `t` x JOIN u ON u.a = x.b WHERE x.c IN (?, 'q?') /*! AND d = ? */",
		"SELECT id FROM t WHERE tag = CAST(? AS BINARY(4)) AND BINARY x COLLATE y <=> ? COLLATE 'z'", "CAST(CAST(", "? COLLATE",
		"SELECT 'unterminated", "/* open", "`", "a.b.c.d = ?", "? = ?", "FROM", "FROM a,", "-- x", "/*!",
	} {
		f.Add(q)
	}
	f.Fuzz(func(t *testing.T, q string) {
		s := scanQuery(q)
		for _, tr := range s.tables {
			s.indexColumns(tr.name, func(string) bool { return true })
			s.table(tr.alias)
		}
		isSelect(q)
		explicitCollations(q)
		collapses(q)
		selectOf(q)
	})
}

// TestSelectOf reads the select lists of testdata/selects.yaml.
func TestSelectOf(t *testing.T) {
	data, err := os.ReadFile("testdata/selects.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		Name, Query, Groups string
		Items               []string
		None                bool
	}
	if err := yaml.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	describe := func(it selectItem) string {
		name := func(c colName) string {
			if c.qualifier != "" {
				return c.qualifier + "." + c.name
			}
			return c.name
		}
		switch {
		case it.star:
			return strings.TrimSpace("star " + it.starQualifier)
		case it.column != nil:
			return "column " + name(*it.column)
		}
		words := []string{"expr"}
		if it.count {
			words = append(words, "count")
		}
		if it.opaque {
			words = append(words, "opaque")
		}
		for _, c := range it.refs {
			words = append(words, name(c))
		}
		return strings.Join(words, " ")
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			sel, ok := selectOf(tc.Query)
			if ok == tc.None {
				t.Fatalf("found a select list: %v, want %v", ok, !tc.None)
			}
			var got []string
			for _, it := range sel.items {
				got = append(got, describe(it))
			}
			if !slices.Equal(got, tc.Items) || sel.groups != tc.Groups {
				t.Errorf("items %q, groups %q; want %q, %q", got, sel.groups, tc.Items, tc.Groups)
			}
		})
	}
}
