package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/wiring"
)

// daemonBatches is how many batches of daemonBatchSize messages the
// daemon benchmarks cycle through.
const (
	daemonBatches   = 20
	daemonBatchSize = 2000
)

// BenchmarkDaemonBatch is the daemon's own work per event on the
// benchmark's workloads, in process and without Kafka: one op is one batch
// of 2,000 messages as a partition's batcher hands them over, through the
// pipeline `cachewarden run` builds from a config with the benchmark
// rules. "plan" decodes, plans and coalesces; "process" also applies the
// ops to a private memcached through the pipelined writer, as the daemon
// does. It reports ns/event and allocs/event; run it under
// `valgrind --tool=callgrind` for instruction counts that other load on
// the machine does not disturb (docs/benchmarks.md).
//
// The counter workload is the uniform stream with the comment counter's
// recount query and fenced recounts (counters.fencing: required), as
// `make bench` runs it: it needs a MariaDB/MySQL server with the binary
// log on (CACHEWARDEN_TEST_MYSQL_BINLOG_DSN, see internal/testsvc), where
// it creates and drops a database of its own. A tenth of the comment
// counters are missing from the seeded cache, so their first deltas
// recount; later cycles over the same batches find them.
func BenchmarkDaemonBatch(b *testing.B) {
	for _, dist := range []Distribution{Uniform, Zipf, Counter} {
		b.Run(string(dist), func(b *testing.B) {
			w := Workload{Dist: dist, Keys: daemonKeys, ZipfS: 1.1, Seed: 1}
			setup := daemonSetup{}
			missEvery := 0
			if dist == Counter {
				setup = daemonCounterSetup(b)
				w.Source = &setup.counters.Source
				missEvery = 10
			}
			batches := daemonMessages(b, w)
			b.Run("plan", func(b *testing.B) {
				stack := daemonStack(b, "127.0.0.1:1", setup) // Plan contacts nothing
				runDaemonBatches(b, batches, func(batch *pipeline.Batch, msgs []pipeline.Message) {
					stack.Pipeline.Plan(batch, msgs, pipeline.CoalesceOptions{})
				})
			})
			// "process-observer" is "process" with the consistency
			// observer on at its default 1% sample.
			for _, variant := range []struct {
				name    string
				observe float64
			}{{"process", 0}, {"process-observer", 0.01}} {
				b.Run(variant.name, func(b *testing.B) {
					addr := daemonMemcached(b)
					if err := SeedKeysMissing(addr, daemonKeys, missEvery); err != nil {
						b.Fatal(err)
					}
					setup := setup
					setup.observe = variant.observe
					stack := daemonStack(b, addr, setup)
					ctx := context.Background()
					runDaemonBatches(b, batches, func(batch *pipeline.Batch, msgs []pipeline.Message) {
						if err := stack.Pipeline.Process(ctx, batch, msgs, pipeline.CoalesceOptions{}); err != nil {
							b.Fatal(err)
						}
					})
				})
			}
		})
	}
}

// daemonKeys is the number of entities of each table in the daemon
// benchmarks' workloads.
const daemonKeys = 100_000

// daemonMemcached is the memcached the process benchmarks write to: the
// one CACHEWARDEN_TEST_MEMCACHED names when set (its items are
// overwritten), else a private one the benchmark starts. Under callgrind
// name one: starting a child process there can abort callgrind on the
// child's signal.
func daemonMemcached(b *testing.B) string {
	if addr := os.Getenv("CACHEWARDEN_TEST_MEMCACHED"); addr != "" {
		return addr
	}
	return privateMemcached(b).Addr
}

// daemonCounterSetup creates the counter workload's database (dropped
// when b ends) and returns the daemon setup with fenced recounts.
func daemonCounterSetup(b *testing.B) daemonSetup {
	dsn := testsvc.MySQLBinlogDSN(b)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	db, err := SetupCounterDB(ctx, dsn, "cwbench_daemon_"+testsvc.Unique(), daemonKeys)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := db.Close(); err != nil {
			b.Error(err)
		}
	})
	return daemonSetup{counters: db, fencing: "required"}
}

func runDaemonBatches(b *testing.B, batches [][]pipeline.Message, fn func(*pipeline.Batch, []pipeline.Message)) {
	var batch pipeline.Batch
	for _, msgs := range batches { // warm the buffers up
		fn(&batch, msgs)
	}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	n := 0
	for i := 0; b.Loop(); i++ {
		msgs := batches[i%len(batches)]
		fn(&batch, msgs)
		n += len(msgs)
	}
	if batch.Stats.Poison != 0 || batch.Stats.Unmatched != 0 {
		b.Fatalf("batch stats %+v: every event should plan one op", batch.Stats)
	}
	cpu := processCPU(b) - cpu0
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/event")
	// All of the process's threads (the writer's connections, the GC),
	// not the wall clock: a round trip to memcached costs no CPU here.
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/event")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the user+system CPU time the process has used so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// daemonMessages generates the events of w as the daemon's messages, in
// batches.
func daemonMessages(b *testing.B, w Workload) [][]pipeline.Message {
	g, err := NewGenerator(w)
	if err != nil {
		b.Fatal(err)
	}
	batches := make([][]pipeline.Message, daemonBatches)
	for i := range batches {
		for j := range daemonBatchSize {
			k, v, _ := g.Next(nil, nil)
			batches[i] = append(batches[i], pipeline.Message{Key: k, Value: v,
				Pos: rules.Position{Topic: "bench", Partition: 0, Offset: int64(i*daemonBatchSize + j)}})
		}
	}
	return batches
}

// daemonStack builds the daemon's stack from a config with the benchmark
// rules and memcached at addr, plus setup (the counter workload's MySQL
// DSN, recount query and fencing; the observer's sample), everything else
// at its default.
func daemonStack(b *testing.B, addr string, setup daemonSetup) *wiring.Stack {
	dir := b.TempDir()
	rulesYAML := RulesYAML
	if setup.counters != nil {
		var err error
		if rulesYAML, err = CounterRulesYAML(setup.counters.RecountQuery()); err != nil {
			b.Fatal(err)
		}
	}
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, rulesYAML, 0o644); err != nil {
		b.Fatal(err)
	}
	yaml := fmt.Sprintf("kafka:\n  brokers: [\"127.0.0.1:1\"]\n  group: bench\n  topics: [bench]\nmemcached:\n  servers: [%q]\nrules: [%q]\n", addr, rulesPath)
	if setup.counters != nil {
		yaml += fmt.Sprintf("mysql:\n  dsn: %q\ncounters:\n  fencing: %s\n", setup.counters.DSN, setup.fencing)
	}
	if setup.observe > 0 {
		yaml += fmt.Sprintf("observer:\n  enabled: true\n  sample: %g\n", setup.observe)
	}
	path := filepath.Join(dir, "cachewarden.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	stack, err := wiring.NewStack(cfg, nil, wiring.StackOptions{MemoryRebumps: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stack.Close() })
	return stack
}
