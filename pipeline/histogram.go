package pipeline

import (
	"math"
	"sort"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// runHistogram is a Prometheus histogram that takes a run of equal
// observations in one call (ObserveN): the messages of one fetch share
// their fetch time, the row changes of one millisecond their source time,
// and a batch observes thousands of them. It is exposed like any
// histogram (_bucket, _sum, _count). Safe for concurrent use.
type runHistogram struct {
	desc   *prometheus.Desc
	bounds []float64       // upper bounds, ascending, without +Inf
	counts []atomic.Uint64 // per bucket (not cumulative); the last is +Inf
	sum    atomic.Uint64   // float64 bits of the sum of observations
}

func newRunHistogram(name, help string, bounds []float64) *runHistogram {
	return &runHistogram{
		desc:   prometheus.NewDesc(name, help, nil, nil),
		bounds: bounds,
		counts: make([]atomic.Uint64, len(bounds)+1),
	}
}

// ObserveN records n observations of v.
func (h *runHistogram) ObserveN(v float64, n int) {
	if n <= 0 {
		return
	}
	i := sort.SearchFloat64s(h.bounds, v) // first bound >= v: le is inclusive
	h.counts[i].Add(uint64(n))
	add := v * float64(n)
	for {
		old := h.sum.Load()
		if h.sum.CompareAndSwap(old, math.Float64bits(math.Float64frombits(old)+add)) {
			return
		}
	}
}

// Describe implements prometheus.Collector.
func (h *runHistogram) Describe(ch chan<- *prometheus.Desc) { ch <- h.desc }

// Collect implements prometheus.Collector.
func (h *runHistogram) Collect(ch chan<- prometheus.Metric) { ch <- h.metric() }

// Write writes the histogram's current state into out, as
// prometheus.Metric's Write does.
func (h *runHistogram) Write(out *dto.Metric) error { return h.metric().Write(out) }

// metric is the histogram's current state. The count is the sum of the
// buckets read, so that it always equals the +Inf bucket.
func (h *runHistogram) metric() prometheus.Metric {
	cumulative := make(map[float64]uint64, len(h.bounds))
	var count uint64
	for i, b := range h.bounds {
		count += h.counts[i].Load()
		cumulative[b] = count
	}
	count += h.counts[len(h.bounds)].Load()
	return prometheus.MustNewConstHistogram(h.desc, count, math.Float64frombits(h.sum.Load()), cumulative)
}
