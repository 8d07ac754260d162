package cacheops

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// pipelineBenchBatch is the batch size of BenchmarkApplyPipeline.
const pipelineBenchBatch = 2000

// BenchmarkApplyPipeline applies the same batches of 2000 ops (benchBatch:
// half namespace bumps, the rest set appends, adds and removes on existing
// sets) through the text transport (gomemcache) and the pipelined meta
// transport, side by side, and reports ops/s and memcached round trips
// per batch. The counters case, meta only, swaps a fifth of the bumps for
// counter deltas.
func BenchmarkApplyPipeline(b *testing.B) {
	addr := testsvc.Memcached(b)
	run := func(b *testing.B, apply func(ops []rules.Op, results []Result) error, roundTrips func() uint64, counters bool) {
		prefix := "cwbench:" + testsvc.Unique() + ":"
		mc := memcache.New(addr)
		defer mc.Close()
		// Create the sets and counters first: the benchmark measures the
		// steady state, not the first fill.
		for j := pipelineBenchBatch / 2; j < pipelineBenchBatch; j++ {
			if err := mc.Set(&memcache.Item{Key: prefix + "set:" + strconv.Itoa(j), Value: []byte("+x ")}); err != nil {
				b.Fatal(err)
			}
		}
		batches := make([][]rules.Op, 8)
		for i := range batches {
			batches[i] = benchBatch(prefix, pipelineBenchBatch, i)
			if !counters {
				continue
			}
			for j := 0; j < pipelineBenchBatch/2; j += 5 {
				key := prefix + "count:" + strconv.Itoa(j)
				if i == 0 {
					if err := mc.Set(&memcache.Item{Key: key, Value: []byte("1000000")}); err != nil {
						b.Fatal(err)
					}
				}
				delta := int64(1 - 2*(i%2)) // +1, -1, +1, ...
				batches[i][j] = rules.Op{Kind: rules.OpCount, Rule: plCountRule, Key: key, Delta: delta}
			}
		}
		results := make([]Result, pipelineBenchBatch)
		if err := apply(batches[0], results); err != nil {
			b.Fatal(err)
		}
		before := roundTrips()
		rounds := 0
		start := time.Now()
		for b.Loop() {
			if err := apply(batches[(rounds+1)%len(batches)], results); err != nil {
				b.Fatal(err)
			}
			rounds++
		}
		elapsed := time.Since(start)
		b.ReportMetric(float64(rounds*pipelineBenchBatch)/elapsed.Seconds(), "ops/s")
		b.ReportMetric(float64(roundTrips()-before)/float64(rounds), "roundtrips/batch")
	}

	b.Run("writer=gomemcache", func(b *testing.B) {
		mc := memcache.New(addr)
		mc.MaxIdleConns = DefaultMaxConcurrency
		mc.Timeout = 2 * time.Second
		defer mc.Close()
		w := NewTextApplier(mc, nil, nil, Config{}, nil)
		run(b, func(ops []rules.Op, results []Result) error {
			return w.Apply(context.Background(), ops, results)
		}, func() uint64 { return w.Stats().Commands }, false)
	})
	for _, counters := range []bool{false, true} {
		name := "writer=pipeline"
		if counters {
			name += "/with-counters"
		}
		b.Run(name, func(b *testing.B) {
			var servers memcache.ServerList
			if err := servers.SetServers(addr); err != nil {
				b.Fatal(err)
			}
			w := NewMetaApplier(&servers, nil, nil, Config{}, nil)
			defer w.Close()
			run(b, func(ops []rules.Op, results []Result) error {
				return w.Apply(context.Background(), ops, results)
			}, func() uint64 { return w.Stats().RoundTrips }, counters)
		})
	}
}
