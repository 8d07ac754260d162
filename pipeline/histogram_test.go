package pipeline

import (
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// TestRunHistogramMatchesObserve: runs of equal observations given to
// ObserveN expose the buckets, count and sum that as many single
// observations give a Prometheus histogram, bounds (le is inclusive),
// zero and values past the last bound included.
func TestRunHistogramMatchesObserve(t *testing.T) {
	bounds := []float64{0.001, 0.01, 0.025, 0.1, 1}
	runs := []struct {
		v float64
		n int
	}{
		{0, 3}, {0.0005, 1}, {0.001, 2}, {0.0011, 5}, {0.025, 7}, {0.02500001, 1},
		{0.5, 4}, {1, 1}, {3, 2}, {1e9, 1}, {0.3, 0}, {0.3, -2},
	}
	got := newRunHistogram("h", "help", bounds)
	want := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Help: "help", Buckets: bounds})
	for _, r := range runs {
		got.ObserveN(r.v, r.n)
		for range max(r.n, 0) {
			want.Observe(r.v)
		}
	}
	var g, w dto.Metric
	if err := got.Write(&g); err != nil {
		t.Fatal(err)
	}
	if err := want.Write(&w); err != nil {
		t.Fatal(err)
	}
	gh, wh := g.GetHistogram(), w.GetHistogram()
	if gh.GetSampleCount() != wh.GetSampleCount() {
		t.Errorf("count %d, want %d", gh.GetSampleCount(), wh.GetSampleCount())
	}
	if d := math.Abs(gh.GetSampleSum() - wh.GetSampleSum()); d > 1e-6*wh.GetSampleSum() {
		t.Errorf("sum %v, want %v", gh.GetSampleSum(), wh.GetSampleSum())
	}
	if len(gh.GetBucket()) != len(wh.GetBucket()) {
		t.Fatalf("%d buckets, want %d", len(gh.GetBucket()), len(wh.GetBucket()))
	}
	for i, b := range wh.GetBucket() {
		gb := gh.GetBucket()[i]
		if gb.GetUpperBound() != b.GetUpperBound() || gb.GetCumulativeCount() != b.GetCumulativeCount() {
			t.Errorf("bucket le=%v: %d, want le=%v: %d", gb.GetUpperBound(), gb.GetCumulativeCount(), b.GetUpperBound(), b.GetCumulativeCount())
		}
	}
}
