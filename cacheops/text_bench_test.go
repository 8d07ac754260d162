package cacheops

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// benchBatch returns a typical coalesced batch of n ops for round i: 50%
// namespace bumps, 30% set appends of two tokens, 20% single set adds and
// removes. Members come and go, so sets get dirty and sampled compaction
// keeps them small.
func benchBatch(prefix string, n, round int) []rules.Op {
	ops := make([]rules.Op, 0, n)
	for j := range n {
		switch {
		case j < n/2:
			ops = append(ops, bumpOp(prefix+"ns:"+strconv.Itoa(j)))
		case j < n*8/10:
			tokens := fmt.Sprintf("+m%d -m%d ", round%8, (round+4)%8)
			ops = append(ops, setAppendOp(wtSetRule, prefix+"set:"+strconv.Itoa(j), tokens))
		case round%2 == 0:
			ops = append(ops, setAddOp(wtSetRule, prefix+"set:"+strconv.Itoa(j), "x"))
		default:
			ops = append(ops, setRemoveOp(wtSetRule, prefix+"set:"+strconv.Itoa(j), "x"))
		}
	}
	return ops
}

// BenchmarkApply applies batches of 1000 ops against the real memcached
// at several concurrency bounds and reports ops/s and memcached round
// trips per batch.
func BenchmarkApply(b *testing.B) {
	const batch = 1000
	addr := testsvc.Memcached(b)
	for _, concurrency := range []int{1, 8, 64} {
		b.Run("concurrency="+strconv.Itoa(concurrency), func(b *testing.B) {
			mc := memcache.New(addr)
			mc.MaxIdleConns = concurrency
			mc.Timeout = 2 * time.Second
			defer mc.Close()
			w := NewTextApplier(mc, nil, nil, Config{MaxConcurrency: concurrency}, nil)
			prefix := "cwbench:" + testsvc.Unique() + ":"
			// Create the sets and namespaces first: the benchmark measures
			// the steady state, not the first fill.
			for j := batch / 2; j < batch; j++ {
				if err := mc.Set(&memcache.Item{Key: prefix + "set:" + strconv.Itoa(j), Value: []byte("+x ")}); err != nil {
					b.Fatal(err)
				}
			}
			batches := make([][]rules.Op, 8)
			for i := range batches {
				batches[i] = benchBatch(prefix, batch, i)
			}
			results := make([]Result, batch)
			if err := w.Apply(context.Background(), batches[0], results); err != nil {
				b.Fatal(err)
			}
			calls := w.Stats().Commands
			rounds := 0
			start := time.Now()
			for b.Loop() {
				if err := w.Apply(context.Background(), batches[rounds%len(batches)], results); err != nil {
					b.Fatal(err)
				}
				rounds++
			}
			elapsed := time.Since(start)
			b.ReportMetric(float64(rounds*batch)/elapsed.Seconds(), "ops/s")
			b.ReportMetric(float64(w.Stats().Commands-calls)/float64(rounds), "calls/batch")
		})
	}
}
