package rules_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// FuzzPlan builds rules from fuzzed templates, prefix and predicate and
// plans a fuzzed event: the planner must not panic, every key must be a
// legal memcached key, and an insert's keys must equal those of the
// exported key function.
func FuzzPlan(f *testing.F) {
	f.Add("p:", "k:{a}", "{b}", "a == 1", uint8(0), "1", "x", "y", uint8(0), uint8(0xff))
	f.Add("", "{a}{b}{c}", "{c}", "a > b || c in ['x']", uint8(1), "18446744073709551616", "1e400", "", uint8(0x5a), uint8(0x0f))
	f.Add("long:", "k:{a}", "{a}", "b startsWith 'x'", uint8(2), strings.Repeat("é ", 200), "x y", "%", uint8(0x33), uint8(0xf0))
	f.Add("x", "lit", "m", "!a", uint8(3), "", "\x00\x7f", "\n", uint8(0x12), uint8(0x3c))
	f.Add("", "{a}", "{a}", "true", uint8(4), "", "", "", uint8(0), uint8(0xff))
	f.Fuzz(func(t *testing.T, prefix, keyTmpl, memberTmpl, when string, op uint8, va, vb, vc string, kinds, presence uint8) {
		src := "version: 1\nprefix: " + strconv.Quote(prefix) + "\nrules:\n" +
			"  - {name: b, table: t, on: [insert, update, delete, read], columns: [a], when: " + strconv.Quote(when) + ", bump: " + strconv.Quote(keyTmpl) + "}\n" +
			"  - {name: s, table: t, on: [insert, update, delete, read], when: " + strconv.Quote(when) + ", set: {key: " + strconv.Quote(keyTmpl) + ", member: " + strconv.Quote(memberTmpl) + "}}\n" +
			"  - {name: c, table: t, on: [insert, update, delete, read], when: " + strconv.Quote(when) + ", count: {key: " + strconv.Quote(keyTmpl) + ", recount: 'SELECT 1'}}\n"
		rs, err := rulefile.Parse("f.yaml", []byte(src))
		if err != nil {
			return
		}
		vals := []string{va, vb, vc}
		image := func(shift uint8) rules.Row {
			r := rules.Row{}
			for i, name := range []string{"a", "b", "c"} {
				bits := (kinds >> (shift + uint8(i)*2)) & 3
				if presence&(1<<(shift+uint8(i))) == 0 {
					continue // column missing
				}
				v := rules.Value{Kind: []rules.Kind{rules.KindString, rules.KindInt, rules.KindNull, rules.KindFloat}[bits], Text: vals[i]}
				if v.Kind == rules.KindNull {
					v.Text = ""
				}
				r = append(r, rules.Column{Name: name, Value: v})
			}
			return r
		}
		ev := &rules.Event{Table: "t", Operation: rules.Operation(op%6 + 1)}
		if presence&0x40 != 0 {
			ev.Before = image(0)
		}
		if presence&0x80 != 0 {
			ev.After = image(1)
		}
		ops, _, err := rs.Plan([]rules.Op{{Key: "keep"}}, ev)
		if err != nil {
			var ee *rules.EventError
			if !errors.As(err, &ee) || len(ops) != 1 || ops[0].Key != "keep" {
				t.Fatalf("err %v (%T), %d ops", err, err, len(ops))
			}
			return
		}
		for _, o := range ops[1:] {
			if o.Rule == nil {
				t.Fatalf("op without rule: %+v", o)
			}
			checkLegalKey(t, o.Key)
			for i := 0; i < len(o.Member); i++ {
				if c := o.Member[i]; c <= 0x20 || c == 0x7f {
					t.Fatalf("member %q has byte 0x%02x", o.Member, c)
				}
			}
			if (o.Kind == rules.OpCount) != (o.Delta != 0) || o.Delta < -1 || o.Delta > 1 {
				t.Fatalf("op %+v has delta %d", o, o.Delta)
			}
			if ev.Operation == rules.Insert {
				values := map[string]string{}
				for _, c := range ev.After {
					values[c.Name] = c.Value.Text
				}
				want, err := rules.Key(prefix, keyTmpl, values)
				if err != nil || want != o.Key {
					t.Fatalf("planned key %q, Key() = %q (%v)", o.Key, want, err)
				}
			}
		}
	})
}
