// Package promx makes Prometheus metrics and registers each with a
// registry, so that each package of the daemon declares its metrics in
// one list.
package promx

import "github.com/prometheus/client_golang/prometheus"

// Maker makes metrics and registers each with Reg, unless Reg is nil
// (unregistered metrics, for tests and tools).
type Maker struct{ Reg prometheus.Registerer }

// Made registers c with b's registry, unless it is nil, and returns it.
func Made[C prometheus.Collector](b Maker, c C) C {
	if b.Reg != nil {
		b.Reg.MustRegister(c)
	}
	return c
}

// Counter makes a counter.
func (b Maker) Counter(name, help string) prometheus.Counter {
	return Made(b, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

// CounterVec makes a counter with labels.
func (b Maker) CounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return Made(b, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

// Gauge makes a gauge.
func (b Maker) Gauge(name, help string) prometheus.Gauge {
	return Made(b, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

// GaugeVec makes a gauge with labels.
func (b Maker) GaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return Made(b, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

// Histogram makes a histogram with the buckets given.
func (b Maker) Histogram(name string, buckets []float64, help string) prometheus.Histogram {
	return Made(b, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

// HistogramVec makes a histogram with labels.
func (b Maker) HistogramVec(name string, buckets []float64, help string, labels ...string) *prometheus.HistogramVec {
	return Made(b, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
}

// SetBool sets g to 1 when v, else 0.
func SetBool(g prometheus.Gauge, v bool) {
	if v {
		g.Set(1)
	} else {
		g.Set(0)
	}
}

// LatencyBuckets span 0.5 ms to about 16 s (seconds).
var LatencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)
