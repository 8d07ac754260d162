package rulefile

import (
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// TestFieldLocations checks Rule.At: where each field's value is.
func TestFieldLocations(t *testing.T) {
	src := `version: 1
rules:
  - name: post-comments
    table: blog.comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
      recount: SELECT COUNT(*) FROM comments WHERE post_id = ?
`
	rs, err := Parse("at.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	at := rs.Rules()[0].At
	for field, want := range map[string]rules.Location{
		"name":          {Line: 3, Column: 11},
		"table":         {Line: 4, Column: 12},
		"when":          {Line: 5, Column: 11},
		"count.key":     {Line: 7, Column: 12},
		"count.recount": {Line: 8, Column: 16},
	} {
		if got, ok := at[field]; !ok || got != want {
			t.Errorf("At[%q] = %v (present %v), want %v", field, got, ok, want)
		}
	}
}
