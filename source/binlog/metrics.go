package binlog

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/internal/promx"
)

// Metrics are the binary log source's Prometheus metrics. Create them with
// NewMetrics beside the pipeline's on the same registry; a Metrics is safe
// for concurrent use.
type Metrics struct {
	behind       prometheus.Gauge
	position     *prometheus.GaugeVec
	events       *prometheus.CounterVec
	transactions prometheus.Counter
	active       prometheus.Gauge
	reopens      prometheus.Counter
}

// NewMetrics creates the metrics and registers them with reg (which must
// not hold them already). A nil reg leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	b := promx.Maker{Reg: reg}
	return &Metrics{
		behind:       b.Gauge("cachewarden_binlog_seconds_behind_source", "Now minus the commit time (on the source's clock) of the last row change applied: how far memcached is behind the database."),
		position:     b.GaugeVec("cachewarden_binlog_position", "The binary log position of the last saved checkpoint, labelled with its file (one series: the label changes when the log rotates).", "file"),
		events:       b.CounterVec("cachewarden_binlog_events_total", "Row changes read from the binary log, by table (db.table) and outcome: applied (planned and applied through the rules), unmapped (the row could not be read: its table's fallback was bumped).", "table", "outcome"),
		transactions: b.Counter("cachewarden_binlog_transactions_total", "Transactions (or parts of large ones) applied from the binary log."),
		active:       b.Gauge("cachewarden_binlog_active", "1 while this instance holds the lease and reads the binary log; 0 for a standby."),
		reopens:      b.Counter("cachewarden_binlog_reopens_total", "Times the binary log stream failed and was opened again from the last checkpoint."),
	}
}

// setPosition records the saved position: its file and offset, when it
// has them.
func (m *Metrics) setPosition(s Start) {
	if s.File == "" {
		return
	}
	m.position.Reset()
	m.position.WithLabelValues(s.File).Set(float64(s.Pos))
}
