package pipeline

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/internal/pipetest"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules/rulefile"
	"github.com/prometheus/client_golang/prometheus"
)

// The shared helpers of the pipeline's and the sources' tests.
var (
	metricValue    = pipetest.MetricValue
	waitFor        = pipetest.WaitFor
	testLogger     = pipetest.TestLogger
	row            = pipetest.Row
	createComments = pipetest.CreateComments
)

const (
	daemonRules = pipetest.DaemonRules
	rebumpRules = pipetest.RebumpRules
)

// The rig of the pipeline's tests: a pipeline over real memcached (and
// MySQL), and Debezium messages to feed it.

// lockedBuffer collects log output from many goroutines.
type lockedBuffer = testsvc.LogBuffer

// rig is a pipeline over real memcached (and MySQL when a DSN is given),
// for one test's unique key prefix.
type rig struct {
	t        *testing.T
	prefix   string
	mc       *memcache.Client
	reg      *prometheus.Registry
	metrics  *Metrics
	rebump   *Rebumper
	pipeline *Pipeline
	log      *slog.Logger
	logs     *lockedBuffer
}

type rigOptions struct {
	mcAddr   string // default: the test memcached
	mysqlDSN string
	poison   PoisonSink
	prefix   string // default: a unique one
}

// newRig loads rulesYAML (with PREFIX replaced by a unique key prefix).
func newRig(t *testing.T, rulesYAML string, opts rigOptions) *rig {
	t.Helper()
	if opts.mcAddr == "" {
		opts.mcAddr = testsvc.Memcached(t)
	}
	r := &rig{t: t, prefix: opts.prefix}
	if r.prefix == "" {
		r.prefix = "cwtest:" + testsvc.Unique() + ":"
	}
	r.log, r.logs = testLogger(t)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(rulesYAML, "PREFIX", r.prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatalf("rules: %v", err)
	}
	r.mc = memcache.New(opts.mcAddr)
	r.mc.Timeout = 200 * time.Millisecond
	r.mc.MaxIdleConns = 16
	var loader cacheops.SetLoader
	var recounter counters.Recounter
	if opts.mysqlDSN != "" {
		db, err := counters.OpenMySQL(opts.mysqlDSN, counters.DBConfig{}, r.log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		loader, recounter = db, db
	}
	// No compaction on a sample: the tests read exact set items.
	w := cacheops.NewTextApplier(r.mc, loader, nil, cacheops.Config{MaxConcurrency: 8, CompactSample: -1}, r.log)
	c := counters.New(r.mc, recounter, counters.Config{MaxConcurrency: 8}, r.log)
	r.reg = prometheus.NewRegistry()
	r.metrics = NewMetrics(r.reg)
	r.rebump = NewRebumper(w, r.metrics, r.log)
	pc := Config{
		Rules: rs, Writer: w, Counters: c, Poison: opts.poison, Rebump: r.rebump,
		Metrics: r.metrics, Logger: r.log, RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond,
		Positions: MemcachePositions(r.mc),
	}
	r.pipeline, err = New(pc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) key(k string) string { return r.prefix + k }

func (r *rig) set(k, v string) {
	r.t.Helper()
	if err := r.mc.Set(&memcache.Item{Key: r.key(k), Value: []byte(v)}); err != nil {
		r.t.Fatalf("memcached set %s: %v", k, err)
	}
}

// get returns the item's value, or "<missing>".
func (r *rig) get(k string) string {
	r.t.Helper()
	it, err := r.mc.Get(r.key(k))
	if err == memcache.ErrCacheMiss {
		return "<missing>"
	}
	if err != nil {
		return "<error " + err.Error() + ">"
	}
	return string(it.Value)
}

// debezium returns a Debezium change event (no schema envelope).
func debezium(op, db, table string, before, after map[string]any) Message {
	return Message{Value: pipetest.Debezium(op, db, table, before, after)}
}
