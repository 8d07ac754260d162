// Command cwbench is cachewarden's end-to-end throughput benchmark (see
// docs/benchmarks.md). It starts a Kafka-protocol broker (bin/cwbroker, or
// uses KAFKA_BROKERS) and memcached, loads generated Debezium change
// events, and measures on the same data a naive consumer, a competent one
// and `cachewarden run`: events/s, CPU per event, memcached commands per
// event, peak RSS; the daemon on a counter workload with a MySQL DSN,
// fences on and off; and cachewarden's event-to-applied latency at a
// fixed offered rate. `make bench` runs it.
//
// Usage:
//
//	cwbench [flags]              run the benchmark
//	cwbench -rss-events 5000000  memory-flatness run only
//	cwbench naive -brokers B -topic T -group G -memcached ADDR
//	cwbench competent -brokers B -topic T -group G -memcached ADDR [-workers N]
//	                             the baselines (started by cwbench)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cachewarden/cachewarden/bench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == bench.ConsumerNaive:
		err = baseline(ctx, bench.ConsumerNaive, os.Args[2:])
	case len(os.Args) > 1 && os.Args[1] == bench.ConsumerCompetent:
		err = baseline(ctx, bench.ConsumerCompetent, os.Args[2:])
	default:
		err = benchmark(ctx, os.Args[1:])
	}
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "cwbench:", err)
		os.Exit(1)
	}
}

func benchmark(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("cwbench", flag.ContinueOnError)
	var o bench.Options
	fs.IntVar(&o.Events, "events", 1_000_000, "events per workload topic")
	fs.IntVar(&o.Runs, "runs", 3, "repetitions of every measurement (results are medians)")
	fs.IntVar(&o.Partitions, "partitions", 4, "partitions of every topic")
	fs.IntVar(&o.Keys, "keys", 100_000, "distinct users and posts the events touch")
	fs.Float64Var(&o.ZipfS, "zipf-s", 1.1, "exponent s (> 1) of the Zipf workload")
	fs.Uint64Var(&o.Seed, "seed", 1, "seed of the generated events")
	workloads := fs.String("workloads", "", "workloads to measure (uniform, zipf, counter); default uniform,zipf and counter when a MySQL DSN is given")
	fs.BoolVar(&o.SkipBaselines, "skip-baselines", false, "measure cachewarden only")
	fs.BoolVar(&o.SkipNaive, "skip-naive", false, "leave the naive baseline out (the competent one runs)")
	fs.StringVar(&o.MySQLDSN, "mysql-dsn", os.Getenv("CACHEWARDEN_TEST_MYSQL_BINLOG_DSN"), "MySQL/MariaDB with the binary log on for the counter workload (default $CACHEWARDEN_TEST_MYSQL_BINLOG_DSN)")
	fs.IntVar(&o.CounterMissEvery, "counter-miss-every", 10, "counter workload: leave every n-th comment counter out of the seeded cache")
	fs.IntVar(&o.LatencyRate, "latency-rate", 50_000, "offered events/s of the latency measurement; -1 skips it")
	fs.DurationVar(&o.LatencyDuration, "latency-duration", 10*time.Second, "how long latency is measured (after the warm-up)")
	fs.DurationVar(&o.LatencyWarmup, "latency-warmup", 2*time.Second, "paced production before latency samples count")
	fs.IntVar(&o.LatencySamplesPerSec, "latency-samples", 500, "latency sample events per second")
	fs.IntVar(&o.RSSEvents, "rss-events", 0, "run only the memory-flatness measurement over this many events (e.g. 5000000)")
	fs.DurationVar(&o.RSSInterval, "rss-interval", time.Second, "RSS sampling period of the memory-flatness run")
	fs.StringVar(&o.CachewardenBin, "cachewarden", "bin/cachewarden", "cachewarden binary")
	fs.StringVar(&o.BrokerBin, "broker", "bin/cwbroker", "cwbroker binary (unused when KAFKA_BROKERS is set)")
	fs.StringVar(&o.MemcachedBin, "memcached", "/usr/bin/memcached", "memcached binary")
	fs.DurationVar(&o.RunTimeout, "run-timeout", 15*time.Minute, "limit of one consumer run")
	fs.StringVar(&o.Doc, "doc", "", "Markdown file whose results section is rewritten (docs/benchmarks.md)")
	fs.StringVar(&o.DaemonBatch, "daemon-batch", "", "the daemon's batch section as YAML flow, e.g. '{max_events: 500, max_wait: 2ms}' (default: the daemon's defaults)")
	fs.StringVar(&o.ProfileDir, "profile", "", "directory for CPU profiles of the daemon's throughput runs (http.pprof on)")
	fs.Float64Var(&o.ObserverSample, "observer", 0, "also measure the daemon with its consistency observer on at this sample (e.g. 0.01), beside the daemon without it (uniform and zipf)")
	verbose := fs.Bool("v", false, "log diagnostics to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	for _, w := range strings.Split(*workloads, ",") {
		if w = strings.TrimSpace(w); w != "" {
			o.Workloads = append(o.Workloads, bench.Distribution(w))
		}
	}
	for _, w := range o.Workloads {
		if w != bench.Uniform && w != bench.Zipf && w != bench.Counter {
			return fmt.Errorf("-workloads: unknown workload %q", w)
		}
	}
	o.KafkaBrokers = os.Getenv("KAFKA_BROKERS")
	o.Command = commandLine(args)
	if *verbose {
		o.Log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	_, err := bench.Run(ctx, o)
	return err
}

// commandLine is how the run is shown in the report (Markdown).
func commandLine(args []string) string {
	parts := []string{"bin/cwbench"}
	for _, a := range args {
		if strings.ContainsAny(a, " \t'\"") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	cwbench := "`" + strings.Join(parts, " ") + "`"
	if os.Getenv("MAKELEVEL") == "" {
		return cwbench
	}
	// Run by `make bench`; make passes command-line variables on to its
	// recipes' environment.
	mk := "make bench"
	if f := os.Getenv("BENCH_FLAGS"); f != "" {
		mk += ` BENCH_FLAGS="` + f + `"`
	}
	return "`" + mk + "`, which runs " + cwbench
}

func baseline(ctx context.Context, name string, args []string) error {
	fs := flag.NewFlagSet("cwbench "+name, flag.ContinueOnError)
	brokers := fs.String("brokers", "", "bootstrap brokers, comma-separated")
	topic := fs.String("topic", "", "topic to consume")
	group := fs.String("group", "", "consumer group")
	memcached := fs.String("memcached", "", "memcached address")
	workers := fs.Int("workers", bench.DefaultCompetentWorkers, "competent: goroutines issuing memcached commands")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *brokers == "" || *topic == "" || *group == "" || *memcached == "" {
		return fmt.Errorf("%s: -brokers, -topic, -group and -memcached are required", name)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if name == bench.ConsumerCompetent {
		return bench.RunCompetent(ctx, bench.CompetentConfig{Brokers: strings.Split(*brokers, ","), Topic: *topic, Group: *group,
			Memcached: *memcached, Workers: *workers, Log: log})
	}
	return bench.RunBaseline(ctx, bench.BaselineConfig{Brokers: strings.Split(*brokers, ","), Topic: *topic, Group: *group,
		Memcached: *memcached, Log: log})
}
