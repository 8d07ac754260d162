package pipeline

import (
	"bufio"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

var coalesceRules = map[string]*rules.Rule{
	"r":    {Name: "r"},
	"slow": {Name: "slow", RebumpAfter: 5 * time.Second},
	"fast": {Name: "fast", RebumpAfter: time.Second},
}

type coalesceCase struct {
	name    string
	line    int
	opts    CoalesceOptions
	in      []rules.Op
	out     []string
	inLines bool
}

// parseOpLine reads "KIND KEY [MEMBER | DELTA | TOKENS...] [rule=NAME]".
func parseOpLine(line string) (rules.Op, error) {
	f := strings.Fields(line)
	rule := coalesceRules["r"]
	if n := len(f); n > 0 && strings.HasPrefix(f[n-1], "rule=") {
		rule = coalesceRules[strings.TrimPrefix(f[n-1], "rule=")]
		if rule == nil {
			return rules.Op{}, fmt.Errorf("unknown rule in %q", line)
		}
		f = f[:n-1]
	}
	if len(f) < 2 {
		return rules.Op{}, fmt.Errorf("short op line %q", line)
	}
	op := rules.Op{Key: f[1], Rule: rule}
	switch f[0] {
	case "bump":
		op.Kind = rules.OpBump
	case "set_delete":
		op.Kind = rules.OpSetDelete
	case "recount":
		op.Kind = rules.OpRecount
	case "set_add", "set_remove":
		op.Kind = rules.OpSetAdd
		if f[0] == "set_remove" {
			op.Kind = rules.OpSetRemove
		}
		if len(f) != 3 {
			return op, fmt.Errorf("want a member in %q", line)
		}
		op.Member = f[2]
	case "set_append":
		op.Kind = rules.OpSetAppend
		op.Tokens = strings.Join(f[2:], " ") + " "
	case "count":
		op.Kind = rules.OpCount
		if len(f) != 3 {
			return op, fmt.Errorf("want a delta in %q", line)
		}
		d, err := strconv.ParseInt(f[2], 10, 64)
		if err != nil {
			return op, err
		}
		op.Delta = d
	default:
		return op, fmt.Errorf("unknown kind in %q", line)
	}
	return op, nil
}

func formatOp(op rules.Op) string {
	var b strings.Builder
	b.WriteString(op.Kind.String())
	b.WriteByte(' ')
	b.WriteString(op.Key)
	switch op.Kind {
	case rules.OpSetAdd, rules.OpSetRemove:
		b.WriteString(" " + op.Member)
	case rules.OpSetAppend:
		b.WriteString(" " + strings.TrimSuffix(op.Tokens, " "))
	case rules.OpCount:
		fmt.Fprintf(&b, " %d", op.Delta)
	}
	if op.Rule != nil {
		b.WriteString(" rule=" + op.Rule.Name)
	}
	return b.String()
}

func readCoalesceCases(t *testing.T, path string) []coalesceCase {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var cases []coalesceCase
	var cur *coalesceCase
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "=== "):
			cases = append(cases, coalesceCase{name: strings.TrimPrefix(line, "=== "), line: n})
			cur, section = &cases[len(cases)-1], ""
		case cur == nil:
			t.Fatalf("%s:%d: line outside a case", path, n)
		case strings.HasPrefix(line, "options:"):
			for _, o := range strings.Fields(strings.TrimPrefix(line, "options:")) {
				switch o {
				case "recount":
					cur.opts.Recount = true
				case "reset_sets":
					cur.opts.ResetSets = true
				default:
					t.Fatalf("%s:%d: unknown option %q", path, n, o)
				}
			}
		case line == "in:" || line == "out:":
			section = line
		case section == "in:":
			op, err := parseOpLine(line)
			if err != nil {
				t.Fatalf("%s:%d: %v", path, n, err)
			}
			cur.in = append(cur.in, op)
		case section == "out:":
			cur.out = append(cur.out, line)
		default:
			t.Fatalf("%s:%d: unexpected %q", path, n, line)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return cases
}

func TestCoalesce(t *testing.T) {
	cases := readCoalesceCases(t, "testdata/coalesce.txt")
	if len(cases) == 0 {
		t.Fatal("no cases")
	}
	// One Coalescer across all cases also checks that scratch memory from
	// an earlier batch never leaks into the next.
	var c Coalescer
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := append([]rules.Op(nil), tc.in...)
			out, st := c.Coalesce(nil, in, tc.opts)
			var got []string
			for _, op := range out {
				got = append(got, formatOp(op))
			}
			got = append(got, fmt.Sprintf("stats in=%d out=%d recounted=%d absorbed=%d zero=%d",
				st.In, st.Out, st.DeltasToRecounts, st.RecountsAbsorbed, st.ZeroSums))
			if strings.Join(got, "\n") != strings.Join(tc.out, "\n") {
				t.Errorf("testdata/coalesce.txt:%d\n got:\n%s\nwant:\n%s", tc.line, strings.Join(got, "\n"), strings.Join(tc.out, "\n"))
			}
			for i := range in {
				if !opsEqual(in[i], tc.in[i]) {
					t.Errorf("input op %d was modified", i)
				}
			}
		})
	}
}

func opsEqual(a, b rules.Op) bool { return formatOp(a) == formatOp(b) && a.Source == b.Source }

// TestCoalesceKeepsFirstSourceAndArgs checks what a merged op carries.
func TestCoalesceKeepsFirstSourceAndArgs(t *testing.T) {
	r := coalesceRules["r"]
	args := []rules.Value{{Kind: rules.KindInt, Text: "9"}}
	ops := []rules.Op{
		{Kind: rules.OpCount, Rule: r, Key: "c", Delta: 1, Args: args, Source: rules.Position{Topic: "t", Offset: 10}},
		{Kind: rules.OpCount, Rule: r, Key: "c", Delta: 1, Args: args, Source: rules.Position{Topic: "t", Offset: 11}},
		{Kind: rules.OpSetAdd, Rule: r, Key: "s", Member: "m", Args: args, Source: rules.Position{Topic: "t", Offset: 12}},
	}
	out, _ := Coalesce(nil, ops, CoalesceOptions{Recount: true})
	if len(out) != 2 {
		t.Fatalf("got %d ops", len(out))
	}
	if out[0].Kind != rules.OpRecount || out[0].Source.Offset != 10 || len(out[0].Args) != 1 || out[0].Args[0].Text != "9" || out[0].Delta != 0 {
		t.Errorf("recount = %+v", out[0])
	}
	if out[1].Kind != rules.OpSetAppend || out[1].Member != "" || out[1].Tokens != "+m " || out[1].Source.Offset != 12 {
		t.Errorf("set append = %+v", out[1])
	}
}

func BenchmarkCoalesce(b *testing.B) {
	r := coalesceRules["r"]
	ops := make([]rules.Op, 0, 6000)
	for i := range 2000 {
		ops = append(ops,
			rules.Op{Kind: rules.OpBump, Rule: r, Key: "ns:user:" + strconv.Itoa(i%300)},
			rules.Op{Kind: rules.OpSetAdd, Rule: r, Key: "s:" + strconv.Itoa(i%50), Member: strconv.Itoa(i)},
			rules.Op{Kind: rules.OpCount, Rule: r, Key: "c:" + strconv.Itoa(i%100), Delta: 1},
		)
	}
	var c Coalescer
	var dst []rules.Op
	var st CoalesceStats
	b.ReportAllocs()
	for b.Loop() {
		dst, st = c.Coalesce(dst[:0], ops, CoalesceOptions{})
	}
	b.ReportMetric(float64(st.Saved())/float64(st.In)*100, "%saved")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(ops)), "ns/op-in")
}

// TestCoalesceManyTokens: however many tokens one set key gets in a
// batch (past the point where they are indexed in a map too), the joined
// tokens are each member's last token, in the order of those tokens.
func TestCoalesceManyTokens(t *testing.T) {
	rule := &rules.Rule{Name: "s"}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 8, 9, 30, 200} {
		var ops []rules.Op
		last := map[string]int{}
		var seq []string
		for i := range n {
			m := strconv.Itoa(rng.IntN(12))
			kind := rules.OpSetAdd
			tok := "+" + m + " "
			if rng.IntN(2) == 0 {
				kind, tok = rules.OpSetRemove, "-"+m+" "
			}
			ops = append(ops, rules.Op{Kind: kind, Rule: rule, Key: "k", Member: m})
			last[m] = i
			seq = append(seq, tok)
		}
		want := ""
		for i, tok := range seq {
			if last[strings.TrimSpace(tok)[1:]] == i {
				want += tok
			}
		}
		var c Coalescer
		for range 2 { // the second call reuses the first one's scratch
			out, _ := c.Coalesce(nil, ops, CoalesceOptions{})
			if len(out) != 1 || out[0].Kind != rules.OpSetAppend || out[0].Tokens != want {
				t.Fatalf("%d tokens: coalesced to %+v, want one set_append of %q", n, out, want)
			}
		}
	}
}
