package observer

import "github.com/prometheus/client_golang/prometheus"

// metrics are the observer's Prometheus metrics.
type metrics struct {
	checks      *prometheus.CounterVec
	samples     *prometheus.CounterVec
	dropped     *prometheus.CounterVec
	budgetSpent *prometheus.CounterVec
	mcReads     prometheus.Counter
	sqlQueries  prometheus.Counter
	pending     prometheus.Gauge
	// drops are dropped's counters by reason, looked up once.
	drops map[string]prometheus.Counter
}

// Reasons a chosen change is not sampled.
const (
	dropRateLimit  = "rate_limit"
	dropBudget     = "budget"
	dropReadFailed = "read_failed"
	dropQueueFull  = "queue_full"
	dropNotApplied = "not_applied"
	dropReplaced   = "replaced"
)

// drop counts a change not sampled for reason.
func (m *metrics) drop(reason string) { m.drops[reason].Inc() }

// newMetrics creates the metrics and registers them with r (nil: none).
func newMetrics(r prometheus.Registerer) *metrics {
	m := &metrics{
		checks: counterVec("cachewarden_consistency_checks_total",
			"Items of sampled applied changes checked a window after the change, by rule, window and result (consistent, inconsistent, missing, not_judged).",
			"rule", "window", "result"),
		samples: counterVec("cachewarden_observer_samples_total",
			"Applied changes sampled by the consistency observer, by rule.",
			"rule"),
		dropped: counterVec("cachewarden_observer_dropped_total",
			"Changes the observer chose but did not sample, by reason (rate_limit, budget, read_failed, queue_full, not_applied, replaced).",
			"reason"),
		budgetSpent: counterVec("cachewarden_observer_budget_exhausted_total",
			"Reads or queries the observer skipped because its budget per second was spent, by resource (memcached, mysql).",
			"resource"),
		mcReads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_observer_memcached_reads_total",
			Help: "Items the consistency observer read from memcached.",
		}),
		sqlQueries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_observer_mysql_queries_total",
			Help: "Load and recount queries the consistency observer ran.",
		}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_observer_pending_changes",
			Help: "Sampled changes waiting for their last check.",
		}),
	}
	m.drops = make(map[string]prometheus.Counter)
	for _, r := range []string{dropRateLimit, dropBudget, dropReadFailed, dropQueueFull, dropNotApplied, dropReplaced} {
		m.drops[r] = m.dropped.WithLabelValues(r)
	}
	if r != nil {
		r.MustRegister(m.checks, m.samples, m.dropped, m.budgetSpent, m.mcReads, m.sqlQueries, m.pending)
	}
	return m
}

// counterVec returns a new counter vector named name, with help text help
// and the given label names.
func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}
