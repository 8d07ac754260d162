package rules_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// TestKeysQuery covers the optional `keys` field of set and count rules:
// what loads, and the problems reported (with their positions) for what
// does not.
func TestKeysQuery(t *testing.T) {
	tests := []struct {
		name     string
		body     string // the rule's set/count block and what follows
		wantKeys string
		wantErr  string // substring of the single problem; "" = loads
	}{
		{
			name: "count with keys",
			body: `    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = 1"
      keys: "SELECT DISTINCT post_id FROM comments"
`,
			wantKeys: "SELECT DISTINCT post_id FROM comments",
		},
		{
			name: "set with keys and explicit args",
			body: `    set:
      key: "interests:{user_id}:{kind}"
      member: "{interest_id}"
      load: "SELECT interest_id FROM user_interests WHERE kind = ? AND user_id = ?"
      args: [kind, user_id]
      keys: "SELECT DISTINCT user_id, kind FROM user_interests"
`,
			wantKeys: "SELECT DISTINCT user_id, kind FROM user_interests",
		},
		{
			name: "keys absent",
			body: `    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
`,
		},
		{
			name: "keys without recount",
			body: `    count:
      key: "comments:{post_id}"
      keys: "SELECT DISTINCT post_id FROM comments"
`,
			wantErr: "t.yaml:8:13: keys needs recount",
		},
		{
			name: "keys without load",
			body: `    set:
      key: "interests:{user_id}"
      member: "{interest_id}"
      keys: "SELECT DISTINCT user_id FROM user_interests"
`,
			wantErr: "t.yaml:9:13: keys needs load",
		},
		{
			name: "keys with a placeholder",
			body: `    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      keys: "SELECT DISTINCT post_id FROM comments WHERE post_id > ?"
`,
			wantErr: "t.yaml:9:13: keys must not have '?' placeholders (found 1)",
		},
		{
			name: "question mark inside a string literal is not a placeholder",
			body: `    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      keys: "SELECT DISTINCT post_id FROM comments WHERE body <> '?'"
`,
			wantKeys: "SELECT DISTINCT post_id FROM comments WHERE body <> '?'",
		},
		{
			name: "key without placeholders",
			body: `    count:
      key: "comments:all"
      recount: "SELECT COUNT(*) FROM comments"
      keys: "SELECT 1"
`,
			wantErr: `t.yaml:9:13: keys is for key templates with placeholders; "comments:all" has none`,
		},
		{
			name: "argument not in the key",
			body: `    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ? AND user_id = ?"
      args: [post_id, user_id]
      keys: "SELECT DISTINCT post_id FROM comments"
`,
			wantErr: `t.yaml:10:13: keys cannot be used: recount argument "user_id" is not a placeholder of key "comments:{post_id}"`,
		},
		{
			name: "empty keys",
			body: `    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      keys: ""
`,
			wantErr: "t.yaml:9:13: keys must not be empty",
		},
		{
			name: "keys on a bump rule",
			body: `    bump:
      keys: "SELECT id FROM comments"
`,
			wantErr: "bump must be a string",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := "version: 1\nrules:\n  - name: r\n    table: blog.comments\n    when: \"approved == 1\"\n" + tc.body
			rs, err := rulefile.Parse("t.yaml", []byte(src))
			if tc.wantErr != "" {
				var le *rules.LoadError
				if !errors.As(err, &le) {
					t.Fatalf("Parse: got %v, want a *LoadError containing %q", err, tc.wantErr)
				}
				if len(le.Problems) != 1 || !strings.Contains(le.Problems[0].String(), tc.wantErr) {
					t.Fatalf("Parse problems:\n%v\nwant one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := rs.Rule("r").Keys; got != tc.wantKeys {
				t.Errorf("Keys = %q, want %q", got, tc.wantKeys)
			}
		})
	}
}
