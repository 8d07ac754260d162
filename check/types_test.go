package check

import (
	"database/sql"
	"os"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestColumnTypes(t *testing.T) {
	data, err := os.ReadFile("testdata/types.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []struct {
		DataType   string `yaml:"data_type"`
		ColumnType string `yaml:"column_type"`
		CharMax    *int64 `yaml:"char_max"`
		OctetMax   *int64 `yaml:"octet_max"`
		Precision  *int64
		Max        int64
		Render     Severity
		When       Severity
	}
	if err := yaml.Unmarshal(data, &cases); err != nil {
		t.Fatal(err)
	}
	null := func(p *int64) sql.NullInt64 {
		if p == nil {
			return sql.NullInt64{}
		}
		return sql.NullInt64{Int64: *p, Valid: true}
	}
	for _, tc := range cases {
		c := &column{Name: "c", DataType: tc.DataType, ColumnType: tc.ColumnType,
			CharMax: null(tc.CharMax), OctetMax: null(tc.OctetMax), Precision: null(tc.Precision)}
		if got, ok := maxRendered(c); got != tc.Max || ok != (tc.Max > 0) {
			t.Errorf("%s: maxRendered = %d, %v; want %d", tc.ColumnType, got, ok, tc.Max)
		}
		if sev, why := renderProblem(c); sev != tc.Render || (sev != "" && why == "") {
			t.Errorf("%s: renderProblem = %q %q, want %q", tc.ColumnType, sev, why, tc.Render)
		}
		if sev, why := whenProblem(c); sev != tc.When || (sev != "" && why == "") {
			t.Errorf("%s: whenProblem = %q %q, want %q", tc.ColumnType, sev, why, tc.When)
		}
	}
}

func TestWhenColumns(t *testing.T) {
	for src, want := range map[string][]whenColumn{
		"active == 1":                           {{"active", 0}},
		`status == "published" && price > 1`:    {{"status", 0}, {"price", 25}},
		"x in [a, 2, b] || !flag":               {{"x", 0}, {"a", 6}, {"b", 12}, {"flag", 19}},
		"deleted_at == null":                    {{"deleted_at", 0}},
		"naïve == 1 and ok":                     {{"naïve", 0}, {"ok", 15}},
		"a startsWith \"x\" or b matches \"y\"": {{"a", 0}, {"b", 20}},
	} {
		got, err := whenColumns(src)
		if err != nil {
			t.Errorf("%q: %v", src, err)
			continue
		}
		if len(got) != len(want) {
			t.Errorf("%q: %v, want %v", src, got, want)
			continue
		}
		for i := range want {
			if got[i] != want[i] {
				t.Errorf("%q: %v, want %v", src, got, want)
				break
			}
		}
	}
}
