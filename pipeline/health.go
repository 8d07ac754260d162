package pipeline

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/internal/promx"
)

// Pinger checks that memcached answers; *memcache.Client is one. Close
// drops its idle connections (the client stays usable): after a failed
// ping Health closes them all at once, since after a memcached restart
// every pooled connection is dead and each would otherwise cost a failed
// request (and a retry backoff) of its own.
type Pinger interface {
	Ping() error
	Close() error
}

// MySQLPinger checks that MySQL answers; *counters.MySQL is one.
type MySQLPinger interface {
	Ping(ctx context.Context) error
}

// MySQLHealth is what Health needs to check MySQL for readiness: set it
// (HealthConfig.MySQL) when some rule runs a load or recount query.
type MySQLHealth struct {
	// DB is pinged every HealthConfig.Interval; required.
	DB MySQLPinger
	// Addr names the server (host:port, never the password) in /readyz,
	// the log and the addr label of cachewarden_mysql_up.
	Addr string
	// Rules are the names of the rules that query MySQL, for /readyz.
	Rules []string
}

// DefaultReadyInterval is the default period of the health checks
// (HealthConfig.Interval).
const DefaultReadyInterval = 2 * time.Second

// mysqlPingTimeout bounds one readiness ping of MySQL.
const mysqlPingTimeout = 5 * time.Second

// HealthConfig assembles a Health.
type HealthConfig struct {
	// Memcached is pinged every Interval; required.
	Memcached Pinger
	// MySQL, when not nil, is pinged every Interval too.
	MySQL *MySQLHealth
	// Interval is the period of the checks; default DefaultReadyInterval.
	Interval time.Duration
	// Metrics receives cachewarden_memcached_up and cachewarden_mysql_up;
	// nil means unregistered metrics of its own.
	Metrics *Metrics
	// Logger receives reachability changes; nil discards.
	Logger *slog.Logger
}

// Health watches what every source needs to apply batches: memcached,
// and MySQL when a rule queries it. A source runs it (Run) and adds its
// reasons to NotReady's. It is safe for concurrent use.
type Health struct {
	cfg         HealthConfig
	m           *Metrics
	log         *slog.Logger
	memcachedUp atomic.Bool
	mysqlUp     atomic.Bool
	// mysqlErr is the last failed MySQL ping's error text.
	mysqlErr atomic.Pointer[string]
}

// NewHealth checks cfg and returns a Health; it connects to nothing.
func NewHealth(cfg HealthConfig) (*Health, error) {
	if cfg.Memcached == nil {
		return nil, errors.New("pipeline: health: a memcached Pinger is required")
	}
	if cfg.MySQL != nil && cfg.MySQL.DB == nil {
		return nil, errors.New("pipeline: health: MySQL without a DB to ping")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultReadyInterval
	}
	m := cfg.Metrics
	if m == nil {
		m = NewMetrics(nil)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Health{cfg: cfg, m: m, log: log}, nil
}

// Interval returns the period of the checks.
func (h *Health) Interval() time.Duration { return h.cfg.Interval }

// Run checks memcached, and MySQL when set, at once and then every
// Interval until ctx ends, calling after (which may be nil) after each
// check: the source updates its readiness there.
func (h *Health) Run(ctx context.Context, after func()) {
	var wg sync.WaitGroup
	wg.Go(func() { Every(ctx, h.cfg.Interval, h.checkMemcached, after) })
	if h.cfg.MySQL != nil {
		wg.Go(func() { Every(ctx, h.cfg.Interval, h.checkMySQL, after) })
	}
	wg.Wait()
}

// Every runs check at once and then every interval until ctx ends or
// check returns false, calling after (when not nil) after each run;
// first is true on the first run.
func Every(ctx context.Context, interval time.Duration, check func(ctx context.Context, first bool) bool, after func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for first := true; ; first = false {
		if !check(ctx, first) {
			return
		}
		if after != nil {
			after()
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// NotReady returns why memcached or MySQL keep the daemon from being
// ready, one reason per line of /readyz; none when both answered their
// last check.
func (h *Health) NotReady() []string {
	var reasons []string
	if !h.memcachedUp.Load() {
		reasons = append(reasons, "memcached: unreachable, or a server does not answer the meta commands (see the log)")
	}
	if my := h.cfg.MySQL; my != nil && !h.mysqlUp.Load() {
		why := "not checked yet"
		if e := h.mysqlErr.Load(); e != nil {
			why = *e
		}
		reasons = append(reasons, "mysql: "+my.Addr+" unreachable ("+why+"); rules "+strings.Join(my.Rules, ", ")+" run load or recount queries there")
	}
	return reasons
}

// reachabilityChanged records up in state and reports whether it differs
// from the last check, or this is the first: when to log it.
func reachabilityChanged(state *atomic.Bool, up, first bool) bool {
	return state.Swap(up) != up || first
}

// checkMemcached pings memcached, drops the idle connections when it
// fails, and logs and gauges the reachability. It always returns true.
func (h *Health) checkMemcached(_ context.Context, first bool) bool {
	err := h.cfg.Memcached.Ping()
	up := err == nil
	if !up {
		h.cfg.Memcached.Close()
	}
	if reachabilityChanged(&h.memcachedUp, up, first) {
		if up {
			h.log.Info("memcached reachable")
		} else {
			h.log.Warn("memcached unreachable; not ready", "error", err.Error())
		}
	}
	promx.SetBool(h.m.memcachedUp, up)
	return true
}

// checkMySQL pings MySQL, bounded by mysqlPingTimeout, and records, logs
// and gauges the reachability. It returns false when ctx ended.
func (h *Health) checkMySQL(ctx context.Context, first bool) bool {
	my := h.cfg.MySQL
	pctx, cancel := context.WithTimeout(ctx, mysqlPingTimeout)
	err := my.DB.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return false
	}
	up := err == nil
	if !up {
		msg := err.Error()
		h.mysqlErr.Store(&msg)
	}
	if reachabilityChanged(&h.mysqlUp, up, first) {
		if up {
			h.log.Info("MySQL reachable", "addr", my.Addr)
		} else {
			h.log.Warn("MySQL unreachable; not ready", "addr", my.Addr, "rules", my.Rules, "error", err.Error())
		}
	}
	promx.SetBool(h.m.mysqlUp.WithLabelValues(my.Addr), up)
	return true
}
