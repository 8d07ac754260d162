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
	"github.com/cachewarden/cachewarden/consumer"
	"github.com/cachewarden/cachewarden/rules"
)

// daemonBatches is how many batches of daemonBatchSize messages the
// daemon benchmarks cycle through.
const (
	daemonBatches   = 20
	daemonBatchSize = 2000
)

// BenchmarkDaemonBatch is the daemon's own work per event on the
// benchmark's workload, in process and without Kafka: one op is one batch
// of 2,000 messages as a partition's batcher hands them over, through the
// pipeline `cachewarden run` builds from a config with the benchmark
// rules. "plan" decodes, plans and coalesces; "process" also applies the
// ops to a private memcached through the pipelined writer, as the daemon
// does. It reports ns/event and allocs/event; run it under
// `valgrind --tool=callgrind` for instruction counts that other load on
// the machine does not disturb (docs/benchmarks.md).
func BenchmarkDaemonBatch(b *testing.B) {
	for _, dist := range []Distribution{Uniform, Zipf} {
		batches := daemonMessages(b, dist)
		b.Run(string(dist)+"/plan", func(b *testing.B) {
			stack := daemonStack(b, "127.0.0.1:1", "") // Plan contacts nothing
			runDaemonBatches(b, batches, func(batch *consumer.Batch, msgs []consumer.Message) {
				stack.Pipeline.Plan(batch, msgs, consumer.CoalesceOptions{})
			})
		})
		// "process-observer" is "process" with the consistency observer
		// on at its default 1% sample.
		for _, variant := range []struct{ name, extra string }{{"process", ""}, {"process-observer", "observer:\n  enabled: true\n  sample: 0.01\n"}} {
			b.Run(string(dist)+"/"+variant.name, func(b *testing.B) {
				m := privateMemcached(b)
				if err := SeedKeys(m.Addr, 100_000); err != nil {
					b.Fatal(err)
				}
				stack := daemonStack(b, m.Addr, variant.extra)
				ctx := context.Background()
				runDaemonBatches(b, batches, func(batch *consumer.Batch, msgs []consumer.Message) {
					if err := stack.Pipeline.Process(ctx, batch, msgs, consumer.CoalesceOptions{}); err != nil {
						b.Fatal(err)
					}
				})
			})
		}
	}
}

func runDaemonBatches(b *testing.B, batches [][]consumer.Message, fn func(*consumer.Batch, []consumer.Message)) {
	var batch consumer.Batch
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

// daemonMessages generates the benchmark's events as the daemon's
// messages, in batches.
func daemonMessages(b *testing.B, dist Distribution) [][]consumer.Message {
	g, err := NewGenerator(Workload{Dist: dist, Keys: 100_000, ZipfS: 1.1, Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	batches := make([][]consumer.Message, daemonBatches)
	for i := range batches {
		for j := range daemonBatchSize {
			k, v, _ := g.Next(nil, nil)
			batches[i] = append(batches[i], consumer.Message{Key: k, Value: v,
				Pos: rules.Position{Topic: "bench", Partition: 0, Offset: int64(i*daemonBatchSize + j)}})
		}
	}
	return batches
}

// daemonStack builds the daemon's stack from a config with the benchmark
// rules and memcached at addr, plus extra (YAML), everything else at its
// default.
func daemonStack(b *testing.B, addr, extra string) *consumer.Stack {
	dir := b.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, RulesYAML, 0o644); err != nil {
		b.Fatal(err)
	}
	yaml := fmt.Sprintf("kafka:\n  brokers: [\"127.0.0.1:1\"]\n  group: bench\n  topics: [bench]\nmemcached:\n  servers: [%q]\nrules: [%q]\n", addr, rulesPath) + extra
	path := filepath.Join(dir, "cachewarden.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		b.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		b.Fatal(err)
	}
	stack, err := consumer.NewStack(cfg, nil, consumer.StackOptions{MemoryRebumps: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stack.Close() })
	return stack
}
