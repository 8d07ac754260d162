package rules_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
)

// TestEntityOps checks that the ops of one entity given by hand are on
// exactly the keys the planner renders for a change of that row (hashed
// long keys, copies, keys of earlier releases, evidence bits), whatever
// the rule's `when` and `columns` say, and that set and count rules get a
// delete of their item with the query's args.
func TestEntityOps(t *testing.T) {
	rs := loadFixture(t, "testdata/entity.yaml")
	long := strings.Repeat("x", 300)
	tests := []struct {
		rule string
		args []string
		// row is the insert's after image the planner is given; the
		// planned ops' keys must equal EntityOps'.
		row  rules.Row
		want []string // "kind key [legacy] [bit=N] [args=...]"
	}{
		{
			rule: "user", args: []string{"id=42"},
			row:  rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: "42"}}, {Name: "active", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "name", Value: rules.Value{Kind: rules.KindString, Text: "a"}}},
			want: []string{"bump e:ns:user:42"},
		},
		{
			rule: "user", args: []string{"id=" + long},
			row:  rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindString, Text: long}}, {Name: "active", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "name", Value: rules.Value{Kind: rules.KindString, Text: "a"}}},
			want: []string{"bump " + rules.FinishKey([]byte("e:ns:user:"+long)), "bump " + "e:ns:user:" + long[:190] + "#" + rules.FinishKey([]byte("e:ns:user:" + long))[202:] + " legacy"},
		},
		{
			rule: "user", args: []string{"id=a b%"},
			row:  rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindString, Text: "a b%"}}, {Name: "active", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "name", Value: rules.Value{Kind: rules.KindString, Text: "a"}}},
			want: []string{"bump e:ns:user:a%20b%25"},
		},
		{
			rule: "hot", args: []string{"id=7"},
			row:  rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: "7"}}},
			want: []string{"bump e:ns:product:7%copy0", "bump e:ns:product:7#0 legacy", "bump e:ns:product:7%copy1", "bump e:ns:product:7#1 legacy"},
		},
		{
			rule: "member", args: []string{"id=9"},
			row:  rules.Row{{Name: "id", Value: rules.Value{Kind: rules.KindInt, Text: "9"}}},
			want: []string{fmt.Sprintf("bump e:ns:member:9 bit=%d", rules.EvidenceBit("9", 64))},
		},
		{
			rule: "interests", args: []string{"user_id=5"},
			want: []string{"set_delete e:interests:5 args=5"},
		},
		{
			rule: "views", args: []string{"kind=like", "post_id=3"},
			want: []string{"set_delete e:views:3:like args=like,3"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.rule+" "+strings.Join(tc.args, " ")[:min(20, len(strings.Join(tc.args, " ")))], func(t *testing.T) {
			r := rs.Rule(tc.rule)
			row, err := r.EntityRow(tc.args)
			if err != nil {
				t.Fatal(err)
			}
			ops, err := r.EntityOps(row)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, op := range ops {
				s := op.Kind.String() + " " + op.Key
				if op.Legacy {
					s += " legacy"
				}
				if r.Evidence != nil {
					s += fmt.Sprintf(" bit=%d", op.EvidenceBit)
				}
				if len(op.Args) > 0 {
					var a []string
					for _, v := range op.Args {
						a = append(a, v.Text)
					}
					s += " args=" + strings.Join(a, ",")
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("ops:\n got %q\nwant %q", got, tc.want)
			}
			if tc.row == nil {
				return
			}
			planned, _, err := rs.Plan(nil, &rules.Event{Database: r.Database, Table: r.Table, Operation: rules.Insert, After: tc.row})
			if err != nil {
				t.Fatal(err)
			}
			var plannedKeys, entityKeys []string
			for _, op := range planned {
				if op.Rule == r {
					plannedKeys = append(plannedKeys, op.Key)
				}
			}
			for _, op := range ops {
				entityKeys = append(entityKeys, op.Key)
			}
			if !slices.Equal(entityKeys, plannedKeys) {
				t.Errorf("keys differ from the planner's:\nentity  %q\nplanned %q", entityKeys, plannedKeys)
			}
		})
	}
}

// TestEntityRowMistakes checks the errors of entity arguments: each names
// the argument and what is wrong.
func TestEntityRowMistakes(t *testing.T) {
	rs := loadFixture(t, "testdata/entity.yaml")
	tests := []struct {
		rule string
		args []string
		want string
	}{
		{"user", []string{"42"}, `rule "user": argument 1 "42": want column=value`},
		{"user", []string{"=42"}, `argument 1 "=42": want column=value`},
		{"user", []string{"name=a"}, `argument 1: "name" is not a column of its key or query arguments (id)`},
		{"user", []string{"id=1", "id=2"}, `argument 2: "id" is given twice`},
		{"user", []string{"id=" + strings.Repeat("x", rules.MaxEntityValueBytes+1)}, `the value of "id" is 65537 bytes, the limit is 65536`},
		{"views", []string{"kind=like"}, `rule "views": give post_id=`},
	}
	for _, tc := range tests {
		r := rs.Rule(tc.rule)
		row, err := r.EntityRow(tc.args)
		if err == nil {
			_, err = r.EntityOps(row)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s %.30q: error %v, want %q", tc.rule, tc.args, err, tc.want)
		}
	}
}
