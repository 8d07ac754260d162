package kafka

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestLagForgotten: a partition's lag is exported while it is assigned
// and not once it was revoked.
func TestLagForgotten(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.setLag("cdc", 2, 17)
	if got := testsvc.Metric(t, reg, "cachewarden_consumer_lag", "topic=cdc", "partition=2"); got != 17 {
		t.Fatalf("lag = %v, want 17", got)
	}
	m.forgetPartition("cdc", 2)
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "cachewarden_consumer_lag" && len(f.GetMetric()) > 0 {
			t.Errorf("lag of a revoked partition still exported")
		}
	}
}
