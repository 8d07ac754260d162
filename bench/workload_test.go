package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/planout"

	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

func generate(t *testing.T, w Workload, n int) (values [][]byte, kinds []EventKind) {
	t.Helper()
	g, err := NewGenerator(w)
	if err != nil {
		t.Fatal(err)
	}
	for range n {
		_, v, k := g.Next(nil, nil)
		values = append(values, v)
		kinds = append(kinds, k)
	}
	return values, kinds
}

func TestGeneratorSizeAndMix(t *testing.T) {
	for _, dist := range []Distribution{Uniform, Zipf} {
		t.Run(string(dist), func(t *testing.T) {
			const n = 20_000
			values, kinds := generate(t, Workload{Dist: dist, Keys: 1000, ZipfS: 1.1, Seed: 7}, n)
			total := 0
			count := map[EventKind]int{}
			for i, v := range values {
				if !json.Valid(v) {
					t.Fatalf("event %d is not valid JSON: %s", i, v)
				}
				total += len(v)
				count[kinds[i]]++
			}
			avg := total / n
			t.Logf("%s: average event %d bytes", dist, avg)
			if avg < 700 || avg > 900 {
				t.Errorf("average event size %d bytes, want about 800", avg)
			}
			for kind, pct := range map[EventKind]int{UserUpdate: userSharePct, InterestChange: interestSharePct, CommentChange: 100 - userSharePct - interestSharePct} {
				got := count[kind] * 100 / n
				if got < pct-2 || got > pct+2 {
					t.Errorf("kind %d: %d%% of events, want about %d%%", kind, got, pct)
				}
			}
		})
	}
}

func TestGeneratorDeterministic(t *testing.T) {
	w := Workload{Dist: Zipf, Keys: 100, ZipfS: 1.2, Seed: 3}
	a, _ := generate(t, w, 200)
	b, _ := generate(t, w, 200)
	for i := range a {
		if !bytes.Equal(a[i], b[i]) {
			t.Fatalf("event %d differs between two generators of the same workload", i)
		}
	}
	w.Seed = 4
	c, _ := generate(t, w, 200)
	same := 0
	for i := range a {
		if bytes.Equal(a[i], c[i]) {
			same++
		}
	}
	if same == len(a) {
		t.Fatal("a different seed produced the same stream")
	}
}

func TestZipfSkew(t *testing.T) {
	// With s=1.1 over 100k keys the hottest user receives a large share of
	// the changes; uniform keys spread them.
	hot := func(dist Distribution) int {
		g, err := NewGenerator(Workload{Dist: dist, Keys: 100_000, ZipfS: 1.1, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range 10_000 {
			if g.id() == 1 {
				n++
			}
		}
		return n
	}
	if u, z := hot(Uniform), hot(Zipf); u > 5 || z < 500 {
		t.Errorf("draws of id 1 in 10000: uniform %d (want <= 5), zipf %d (want >= 500)", u, z)
	}
}

func TestNewGeneratorRejects(t *testing.T) {
	for _, w := range []Workload{
		{Dist: Uniform, Keys: 0},
		{Dist: Zipf, Keys: 10, ZipfS: 1},
		{Dist: "pareto", Keys: 10},
	} {
		if _, err := NewGenerator(w); err == nil {
			t.Errorf("NewGenerator(%+v) succeeded", w)
		}
	}
}

// TestBaselinesMatchPlanner checks that both baselines issue, for every
// generated event, the operation cachewarden's planner derives from the
// benchmark rules: the consumers do the same work.
func TestBaselinesMatchPlanner(t *testing.T) {
	rs, err := rulefile.LoadPaths("testdata/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	values, _ := generate(t, Workload{Dist: Uniform, Keys: 50, Seed: 11}, 3000)
	g, err := NewGenerator(Workload{Dist: Uniform, Keys: 50, Seed: 11})
	if err != nil {
		t.Fatal(err)
	}
	_, sample := g.Sample(nil, nil, 5)
	values = append(values, sample)

	var in bytes.Buffer
	for _, v := range values {
		in.Write(v)
		in.WriteByte('\n')
	}
	var out, errOut bytes.Buffer
	sum, err := planout.Stream(context.Background(), &in, &out, &errOut, &decode.Decoder{}, rs, planout.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failed != 0 || errOut.Len() != 0 {
		t.Fatalf("planner rejected %d events: %s", sum.Failed, errOut.String())
	}
	if sum.Ops != len(values) {
		t.Fatalf("planner produced %d ops for %d events, want one each", sum.Ops, len(values))
	}
	dec := json.NewDecoder(&out)
	for i, v := range values {
		var p struct {
			Line   int    `json:"line"`
			Op     string `json:"op"`
			Key    string `json:"key"`
			Member string `json:"member"`
			Delta  int64  `json:"delta"`
		}
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Line != i+1 {
			t.Fatalf("op for line %d, want line %d", p.Line, i+1)
		}
		naive, ok, err := PlanNaive(v)
		if err != nil || !ok {
			t.Fatalf("event %d: PlanNaive: ok=%v err=%v", i+1, ok, err)
		}
		competent, ok, err := PlanCompetent(v)
		if err != nil || !ok {
			t.Fatalf("event %d: PlanCompetent: ok=%v err=%v", i+1, ok, err)
		}
		if competent != naive {
			t.Fatalf("event %d: competent op %+v, naive op %+v", i+1, competent, naive)
		}
		want := map[string]NaiveOp{
			"bump":       {Kind: NaiveBump, Key: p.Key},
			"set_add":    {Kind: NaiveAppend, Key: p.Key, Token: "+" + p.Member + " "},
			"set_remove": {Kind: NaiveAppend, Key: p.Key, Token: "-" + p.Member + " "},
			"count":      {Kind: map[int64]NaiveOpKind{1: NaiveIncr, -1: NaiveDecr}[p.Delta], Key: p.Key},
		}[p.Op]
		if naive != want {
			t.Fatalf("event %d: naive op %+v, planner says %s %q member %q delta %d", i+1, naive, p.Op, p.Key, p.Member, p.Delta)
		}
	}
	if got, want := naiveKey(t, sample), SampleKey(5); got != want {
		t.Errorf("sample event bumps %q, SampleKey says %q", got, want)
	}
}

func naiveKey(t *testing.T, v []byte) string {
	op, ok, err := PlanNaive(v)
	if err != nil || !ok {
		t.Fatalf("PlanNaive: ok=%v err=%v", ok, err)
	}
	return op.Key
}

func TestSeedKeys(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{UserKey(42), "bench:ns:user:42"},
		{InterestsKey(7), "bench:interests:7"},
		{CommentsKey(9), "bench:comments:9"},
		{SampleKey(0), "bench:ns:user:" + strconv.Itoa(SampleIDBase)},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestCounterWorkloadSource: events of a workload with a Source name that
// server, file and positions, and the counter rules plan a count with the
// recount query for their comment changes.
func TestCounterWorkloadSource(t *testing.T) {
	src := &BinlogSource{ServerID: 7, File: "mysql-bin.999999", Pos: 4}
	values, kinds := generate(t, Workload{Dist: Counter, Keys: 50, Seed: 2, Source: src}, 200)
	yaml, err := CounterRulesYAML("SELECT COUNT(*) FROM `cw`.comments WHERE post_id = ? AND approved = 1")
	if err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.Parse("counter.yaml", yaml)
	if err != nil {
		t.Fatal(err)
	}
	var d decode.Decoded
	var ops []rules.Op
	counts := 0
	for i, v := range values {
		if err := (&decode.Decoder{}).Decode(v, rules.Position{}, &d); err != nil || len(d.Events) != 1 {
			t.Fatalf("event %d: %v", i, err)
		}
		ev := &d.Events[0]
		if ev.Source.ServerID != 7 || ev.Source.BinlogFile != "mysql-bin.999999" || ev.Source.BinlogPos != 4+int64(i)*512 {
			t.Fatalf("event %d: source %+v", i, ev.Source)
		}
		if ev.Source.GTID != "0-7-"+strconv.Itoa(1001+i) {
			t.Fatalf("event %d: gtid %q", i, ev.Source.GTID)
		}
		ops, _, err = rs.Plan(ops[:0], ev)
		if err != nil || len(ops) != 1 {
			t.Fatalf("event %d: plan %v %v", i, ops, err)
		}
		if kinds[i] == CommentChange {
			counts++
			if ops[0].Kind != rules.OpCount || ops[0].Rule.Query == "" {
				t.Fatalf("event %d: comment change planned as %+v", i, ops[0])
			}
		}
	}
	if counts == 0 {
		t.Fatal("no comment changes generated")
	}
}

// TestSetSourceTime: the source timestamps are overwritten in place,
// and the decoder reads the new time.
func TestSetSourceTime(t *testing.T) {
	values, _ := generate(t, Workload{Dist: Uniform, Keys: 50, Seed: 2}, 3)
	const now = 1_800_000_000_123
	for _, v := range values {
		if !SetSourceTime(v, now) {
			t.Fatalf("no source timestamps in %s", v)
		}
		if !json.Valid(v) {
			t.Fatalf("invalid JSON after the change: %s", v)
		}
		for _, want := range []string{`"ts_ms":1800000000123,"ts_us":1800000000123000,"ts_ns":1800000000123000000,"snapshot"`} {
			if !bytes.Contains(v, []byte(want)) {
				t.Errorf("%s lacks %s", v, want)
			}
		}
		var d decode.Decoded
		if err := (&decode.Decoder{}).Decode(v, rules.Position{}, &d); err != nil || d.Events[0].Source.TsMs != now {
			t.Errorf("decoded source time %+v, %v", d.Events, err)
		}
	}
	if SetSourceTime([]byte(`{"op":"c"}`), now) {
		t.Error("reported success on an event without a source")
	}
}
