// Package bench is cachewarden's end-to-end throughput benchmark: it loads
// a Kafka-protocol broker with generated Debezium change events and
// measures, on the same data, a naive consumer (one memcached command and
// one synchronous offset commit per event) and the cachewarden daemon run
// as users run it (`cachewarden run -c FILE`, a process of its own). The
// command bench/cmd/cwbench drives it; docs/benchmarks.md explains the
// method and holds the results.
//
// Everything runs on the loopback interface: a broker process (cwbroker,
// or the brokers in KAFKA_BROKERS), a memcached process, and the consumers,
// each measured through /proc (Linux only).
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"
)

// Options configure Run. Zero values take the documented defaults.
type Options struct {
	// Events per workload topic; default 1,000,000.
	Events int
	// Runs is how many times each measurement is repeated (results are
	// the medians); default 3.
	Runs int
	// Partitions of every topic; default 4.
	Partitions int
	// Keys is the number of distinct users and posts; default 100,000.
	Keys int
	// ZipfS is the exponent of the Zipf workload; default 1.1.
	ZipfS float64
	// Seed of the generated workloads; default 1.
	Seed uint64
	// Workloads to measure; default uniform and zipf, and counter when
	// MySQLDSN is set.
	Workloads []Distribution
	// SkipBaselines leaves the naive and the competent consumer out;
	// SkipNaive only the naive one.
	SkipBaselines, SkipNaive bool
	// MySQLDSN is the MySQL/MariaDB server (binary log on) of the counter
	// workload, where the harness creates a database of its own.
	MySQLDSN string
	// CounterMissEvery leaves the comment counter of every n-th post out
	// of the seeded cache in counter workload runs, so that deltas to it
	// miss and recount; default 10 (a tenth of the counters).
	CounterMissEvery int
	// LatencyRate is the offered rate of the latency measurement in
	// events/s; default 50,000. Negative skips the measurement.
	LatencyRate int
	// LatencyDuration is how long latency is measured after
	// LatencyWarmup; defaults 10s and 2s.
	LatencyDuration, LatencyWarmup time.Duration
	// LatencySamplesPerSec is how many sample events per second the paced
	// producer sends; default 500.
	LatencySamplesPerSec int
	// RSSEvents, when positive, runs only the memory-flatness measurement
	// over that many events, sampling the daemon's RSS every RSSInterval
	// (default 1s).
	RSSEvents   int
	RSSInterval time.Duration
	// Binaries: cachewarden (default bin/cachewarden), cwbroker (default
	// bin/cwbroker), memcached (default /usr/bin/memcached) and the
	// harness itself (default os.Executable), which runs the baseline.
	CachewardenBin, BrokerBin, MemcachedBin, SelfBin string
	// KafkaBrokers, when set ("host:port,..."), is an existing broker to
	// use instead of starting cwbroker.
	KafkaBrokers string
	// RunTimeout bounds one consumer run; default 15m.
	RunTimeout time.Duration
	// Doc, when set, is the Markdown file whose results sections are
	// rewritten (docs/benchmarks.md); Command is the command line shown
	// there, as Markdown.
	Doc, Command string
	// DaemonBatch, when set, is the `batch` section of the daemon's
	// config as a YAML flow mapping; default the daemon's defaults.
	DaemonBatch string
	// ProfileDir, when set, is where the daemon's CPU profiles of the
	// throughput runs are written (the daemon then runs with http.pprof):
	// one file per second of each run, DIR/GROUP-NNN.pprof, which
	// `go tool pprof` merges when given them all, and the heap profile
	// at the end of the run, DIR/GROUP-heap.pprof, and an execution
	// trace of one second early in the run, DIR/GROUP-trace.out
	// (`go tool trace`; `go tool trace -pprof=sync` and `-pprof=net`
	// show where the daemon waits).
	ProfileDir string
	// ObserverSample, when positive, also measures the daemon with its
	// consistency observer on at this sample (e.g. 0.01), right after
	// the daemon without it in every run of the uniform and zipf
	// workloads.
	ObserverSample float64
	// Out receives the progress and the results table; default stdout.
	Out io.Writer
	// Log receives diagnostics; default discards.
	Log *slog.Logger
}

func (o *Options) defaults() error {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&o.Events, 1_000_000)
	def(&o.Runs, 3)
	def(&o.Partitions, 4)
	def(&o.Keys, 100_000)
	def(&o.LatencyRate, 50_000)
	def(&o.LatencySamplesPerSec, 500)
	if o.ZipfS == 0 {
		o.ZipfS = 1.1
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if len(o.Workloads) == 0 {
		o.Workloads = []Distribution{Uniform, Zipf}
		if o.MySQLDSN != "" {
			o.Workloads = append(o.Workloads, Counter)
		}
	}
	def(&o.CounterMissEvery, 10)
	if o.LatencyDuration <= 0 {
		o.LatencyDuration = 10 * time.Second
	}
	if o.LatencyWarmup <= 0 {
		o.LatencyWarmup = 2 * time.Second
	}
	if o.RSSInterval <= 0 {
		o.RSSInterval = time.Second
	}
	if o.CachewardenBin == "" {
		o.CachewardenBin = "bin/cachewarden"
	}
	if o.BrokerBin == "" {
		o.BrokerBin = "bin/cwbroker"
	}
	if o.MemcachedBin == "" {
		o.MemcachedBin = "/usr/bin/memcached"
	}
	if o.SelfBin == "" {
		self, err := os.Executable()
		if err != nil {
			return fmt.Errorf("bench: find own executable: %w", err)
		}
		o.SelfBin = self
	}
	if o.RunTimeout <= 0 {
		o.RunTimeout = 15 * time.Minute
	}
	if o.Out == nil {
		o.Out = os.Stdout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Events < 0 || o.Runs < 1 || o.Partitions < 1 || o.Keys < 1 || o.LatencySamplesPerSec < 1 {
		return errors.New("bench: events, runs, partitions, keys and latency samples must be positive")
	}
	return nil
}

// env is the running benchmark environment.
type env struct {
	opts   Options
	log    *slog.Logger
	out    io.Writer
	dir    string // configs and consumer logs
	prefix string // unique per invocation: topics and groups
	broker *Broker
	mc     *Memcached
	// counterDB is the counter workload's database (nil without it).
	counterDB *CounterDB
}

// Results are everything one Run measured.
type Results struct {
	Machine   Machine
	Options   Options
	Produce   map[Distribution]time.Duration // time to load each topic
	Consumers []ConsumerResult
	Latency   []LatencyResult
	Ceiling   []CeilingResult
	// LatencyFetchOnly are the fetch-only latency runs (runLatency with
	// bare), one after each of Latency.
	LatencyFetchOnly []LatencyResult
	RSS              *RSSResult
	// CounterServer is the version of the counter workload's database
	// server ("" without the counter workload).
	CounterServer string
	// LoadAvgEnd is the load average when the measurements ended; with
	// Machine.LoadAvg it shows how busy the machine was meanwhile.
	LoadAvgEnd string
}

// Run sets up the broker and memcached, loads the workloads, measures the
// consumers Runs times, prints the results table to Out, and rewrites the
// results sections of Doc when set.
func Run(ctx context.Context, o Options) (*Results, error) {
	if err := o.defaults(); err != nil {
		return nil, err
	}
	for _, bin := range []string{o.CachewardenBin, o.MemcachedBin, o.SelfBin} {
		if _, err := os.Stat(bin); err != nil {
			return nil, fmt.Errorf("bench: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "cwbench-")
	if err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	e := &env{opts: o, log: o.Log, out: o.Out, dir: dir, prefix: fmt.Sprintf("cwbench-%d-%d", time.Now().Unix(), os.Getpid())}
	res := &Results{Machine: DescribeMachine(o.MemcachedBin), Options: o, Produce: map[Distribution]time.Duration{}}
	failed := true
	defer func() {
		if failed {
			fmt.Fprintf(e.out, "configs and consumer logs kept in %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()

	m := res.Machine
	fmt.Fprintf(e.out, "machine: %d CPUs (%s), %s, %s, %s, %s; load average %s\n",
		m.CPUs, m.CPUModel, m.MemTotal, m.Kernel, m.GoVersion, m.Memcached, m.LoadAvg)
	if o.KafkaBrokers != "" {
		e.broker = ExternalBroker(o.KafkaBrokers)
		fmt.Fprintf(e.out, "broker: external %v\n", e.broker.Addrs)
	} else {
		if e.broker, err = StartBroker(ctx, o.BrokerBin, o.Partitions); err != nil {
			return nil, err
		}
		defer e.broker.Stop()
		fmt.Fprintf(e.out, "broker: cwbroker (kfake) pid %d on %v\n", e.broker.Pid(), e.broker.Addrs)
	}
	if e.mc, err = StartMemcached(ctx, o.MemcachedBin); err != nil {
		return nil, err
	}
	defer e.mc.Stop()
	fmt.Fprintf(e.out, "memcached: pid %d on %s %v\n", e.mc.Pid(), e.mc.Addr, MemcachedArgs)

	if o.RSSEvents > 0 {
		if res.RSS, err = e.runRSS(ctx); err != nil {
			return res, err
		}
		PrintRSS(e.out, res.RSS)
		res.LoadAvgEnd = LoadAverage()
		if o.Doc != "" {
			if err := UpdateDoc(o.Doc, res); err != nil {
				return res, err
			}
		}
		failed = false
		return res, nil
	}

	if slices.Contains(o.Workloads, Counter) {
		if o.MySQLDSN == "" {
			return res, errors.New("bench: the counter workload needs a MySQL DSN (-mysql-dsn)")
		}
		name := strings.ReplaceAll(e.prefix, "-", "_")
		if e.counterDB, err = SetupCounterDB(ctx, o.MySQLDSN, name, o.Keys); err != nil {
			return res, err
		}
		defer func() {
			if err := e.counterDB.Close(); err != nil {
				e.log.Warn("cannot drop the counter database", "error", err.Error())
			}
		}()
		res.CounterServer = e.counterDB.Version
		fmt.Fprintf(e.out, "counter database: %s on %s (server_id %d), events name binary log %s\n",
			name, e.counterDB.Version, e.counterDB.Source.ServerID, e.counterDB.Source.File)
	}

	topics := map[Distribution]string{}
	for _, wl := range o.Workloads {
		topic := fmt.Sprintf("%s-%s", e.prefix, wl)
		if err := e.broker.CreateTopic(ctx, topic, o.Partitions); err != nil {
			return res, err
		}
		d, err := Produce(ctx, e.broker.Addrs, topic, e.workload(wl), o.Events)
		if err != nil {
			return res, err
		}
		res.Produce[wl] = d
		topics[wl] = topic
		fmt.Fprintf(e.out, "loaded %d %s events into %s in %v (%.0f events/s)\n",
			o.Events, wl, topic, d.Round(time.Millisecond), float64(o.Events)/d.Seconds())
	}

	for run := 1; run <= o.Runs; run++ {
		c, err := e.runCeiling(ctx, run, topics[o.Workloads[0]], int64(o.Events))
		if err != nil {
			return res, fmt.Errorf("run %d, fetch-only: %w", run, err)
		}
		res.Ceiling = append(res.Ceiling, c)
		fmt.Fprintf(e.out, "run %d fetch-only ceiling (%s): %s events/s, client %.2f CPU µs/event (%.3f page faults/event), broker %.2f CPU µs/event\n",
			run, o.Workloads[0], thousands(c.EventsPerSec()), c.ClientCPUPerEvent(), float64(c.ClientFaults)/float64(c.Events),
			float64(c.BrokerCPU.Microseconds())/float64(c.Events))
		for _, wl := range o.Workloads {
			for _, c := range o.consumers(wl) {
				r, err := e.runConsumer(ctx, c, wl, run, topics[wl], int64(o.Events))
				if err != nil {
					return res, fmt.Errorf("run %d, %s, %s: %w", run, wl, c, err)
				}
				res.Consumers = append(res.Consumers, r)
				PrintConsumerRun(e.out, r)
			}
		}
		if o.LatencyRate > 0 {
			l, err := e.runLatency(ctx, run, false)
			if err != nil {
				return res, fmt.Errorf("run %d, latency: %w", run, err)
			}
			res.Latency = append(res.Latency, l)
			PrintLatencyRun(e.out, l)
			if l, err = e.runLatency(ctx, run, true); err != nil {
				return res, fmt.Errorf("run %d, fetch-only latency: %w", run, err)
			}
			res.LatencyFetchOnly = append(res.LatencyFetchOnly, l)
			PrintLatencyRun(e.out, l)
		}
	}
	res.LoadAvgEnd = LoadAverage()
	fmt.Fprintf(e.out, "load average at the end: %s\n", res.LoadAvgEnd)
	PrintSummary(e.out, res)
	if o.Doc != "" {
		if err := UpdateDoc(o.Doc, res); err != nil {
			return res, err
		}
		fmt.Fprintf(e.out, "updated %s\n", o.Doc)
	}
	failed = false
	return res, nil
}

func (e *env) workload(d Distribution) Workload {
	w := Workload{Dist: d, Keys: e.opts.Keys, ZipfS: e.opts.ZipfS, Seed: e.opts.Seed}
	if d == Counter && e.counterDB != nil {
		w.Source = &e.counterDB.Source
	}
	return w
}

// consumers returns the consumers measured on workload wl, in order.
func (o *Options) consumers(wl Distribution) []string {
	if wl == Counter {
		return []string{ConsumerFenced, ConsumerUnfenced}
	}
	var out []string
	if !o.SkipBaselines && !o.SkipNaive {
		out = append(out, ConsumerNaive)
	}
	if !o.SkipBaselines {
		out = append(out, ConsumerCompetent)
	}
	out = append(out, ConsumerCachewarden)
	if o.ObserverSample > 0 {
		out = append(out, ConsumerObserved)
	}
	return out
}
