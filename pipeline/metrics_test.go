package pipeline

import (
	"fmt"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// TestOutcomeCounts: every op kind and outcome fits the array, and a flush
// adds each pair's count under its labels once, then starts again.
func TestOutcomeCounts(t *testing.T) {
	for k := range 256 {
		if name := rules.OpKind(k).String(); name != "unknown" && k >= 16 {
			t.Errorf("op kind %s is %d, beyond outcomeCounts", name, k)
		}
		if name := cacheops.Outcome(k).String(); !strings.HasPrefix(name, "outcome(") && k >= 16 {
			t.Errorf("outcome %s is %d, beyond outcomeCounts", name, k)
		}
	}
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	var c outcomeCounts
	for _, p := range []struct {
		k rules.OpKind
		o cacheops.Outcome
	}{{rules.OpBump, cacheops.OutcomeIncr}, {rules.OpBump, cacheops.OutcomeAdded}, {rules.OpBump, cacheops.OutcomeIncr},
		{rules.OpSetDelete, cacheops.OutcomeRecountNeeded}, {rules.OpCount, cacheops.OutcomeFailed}} {
		c.add(p.k, p.o)
	}
	c.flush(m.ops)
	c.add(rules.OpBump, cacheops.OutcomeIncr)
	c.flush(m.ops)
	c.flush(m.ops)
	want := map[[2]string]float64{
		{"bump", "incr"}: 3, {"bump", "added"}: 1, {"set_delete", "recount_needed"}: 1, {"count", "failed"}: 1,
	}
	got := map[[2]string]float64{}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "cachewarden_ops_total" {
			continue
		}
		for _, mt := range f.GetMetric() {
			got[[2]string{label(mt, "kind"), label(mt, "outcome")}] = mt.GetCounter().GetValue()
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("cachewarden_ops_total %v, want %v", got, want)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
