package testsvc

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Metric returns the sum of the values of the samples of the counter or
// gauge name in reg whose labels match every "label=value" of labels
// (all samples when none is given); 0 when there is none.
func Metric(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather metrics: %v", err)
	}
	sum := 0.0
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
	samples:
		for _, m := range f.GetMetric() {
			for _, want := range labels {
				k, v, _ := strings.Cut(want, "=")
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k {
						found = lp.GetValue() == v
						break
					}
				}
				if !found {
					continue samples
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}
