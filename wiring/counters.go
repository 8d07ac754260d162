package wiring

import (
	"context"
	"fmt"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/pipeline"
)

// countersConfig translates the settings the counters package takes.
// servers and dial are the stack's memcached selector and dialer, so that
// the counters' pipelined stores (meta protocol, so not with
// memcached.protocol: text) land where every other client looks.
func countersConfig(cfg *config.Config, m *pipeline.Metrics, servers *itemformat.Selector, dial func(ctx context.Context, network, addr string) (net.Conn, error)) counters.Config {
	var sel memcache.ServerSelector
	if servers != nil && cfg.Memcached.Protocol != config.ProtocolText {
		sel = servers
	}
	return counters.Config{
		Servers:          sel,
		Meta:             metaPool(cfg, dial),
		MaxConcurrency:   cfg.Memcached.MaxConcurrency,
		ObserveRoundTrip: m.ObserveMemcached,
		Fencing:          cfg.Counters.Fencing,
		FenceTTL:         cfg.Counters.FenceTTL,
	}
}

// checkFencing refuses to start with counters.fencing: required when the
// database cannot fence recounts (docs/exact-counters.md). c may be nil
// (no counters): then required fencing cannot hold either, unless no rule
// counts.
func checkFencing(c *counters.Counters, cfg *config.Config) error {
	if cfg.Counters.Fencing != counters.FencingRequired {
		return nil
	}
	if c == nil {
		return fmt.Errorf("wiring: counters.fencing is required but no counters are kept with a database connection (set mysql.dsn): %w", counters.ErrCannotFence)
	}
	timeout := cfg.MySQL.QueryTimeout
	if timeout <= 0 {
		timeout = counters.DefaultQueryTimeout
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout+time.Second)
	defer cancel()
	if err := c.CheckFencing(ctx); err != nil {
		return fmt.Errorf("wiring: counters.fencing: required: %w", err)
	}
	return nil
}

// registerCounterMetrics exports the counters' fencing statistics.
func registerCounterMetrics(reg *prometheus.Registry, c *counters.Counters) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "cachewarden_recount_fenced_total",
			Help: "Counter recounts stored with a fence at their snapshot's binary log position (exact counters).",
		}, func() float64 { return float64(c.Stats().FencedRecounts) }),
		&unfencedCollector{c: c, desc: prometheus.NewDesc("cachewarden_recount_unfenced_total",
			"Counter recounts stored without a fence, by reason: binlog_off, no_snapshot_position (MySQL), status_unreadable, disabled (counters.fencing: off), no_snapshots.",
			[]string{"reason"}, nil)},
	)
}

// unfencedCollector reports Stats.UnfencedBy, one series per reason.
type unfencedCollector struct {
	c    *counters.Counters
	desc *prometheus.Desc
}

func (u *unfencedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- u.desc }

func (u *unfencedCollector) Collect(ch chan<- prometheus.Metric) {
	by := u.c.Stats().UnfencedBy
	for _, r := range counters.UnfencedReasons() {
		ch <- prometheus.MustNewConstMetric(u.desc, prometheus.CounterValue, float64(by[r.String()]), r.String())
	}
}
