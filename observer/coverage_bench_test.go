package observer

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/rules"
)

// emptyCache is a Cache holding nothing, answering at once.
type emptyCache struct{}

func (emptyCache) GetMulti([]string) (map[string]*memcache.Item, error) {
	return map[string]*memcache.Item{}, nil
}

// BenchmarkObserverCoverage measures what share of lost invalidations the
// observer catches, and how soon the first is reported, as a function of
// a rule's change rate and the share of its bumps lost, at the default
// max_per_second (10), memcached budget and first window (1s), for the
// samples 1% (the default) and 10%.
//
// Each iteration is one trial: a stream of bumps of one rule, arriving as
// a Poisson process at the rate on a simulated clock, each lost with the
// given probability, goes through the observer's own sampling
// (BeforeApply: the per-event draw, the per-rule allowance and the
// memcached budget of the read before the bump) until a lost bump is
// sampled. A sampled lost bump is reported at its first window (every
// one is: TestObserverBumps, and the fault-injection tests), so the time
// to report is the time to that sampled loss plus the window. A trial
// that catches nothing within a simulated week counts as not reported.
// It reports:
//
//   - caught-%: the share of lost bumps that were sampled, so reported;
//   - p50-s, p99-s: the time from the start of the losses to the first
//     report, median and 99th percentile over the trials, in seconds.
//
// Run it with a fixed number of trials:
//
//	go test ./observer -run '^$' -bench ObserverCoverage -benchtime 200x
func BenchmarkObserverCoverage(b *testing.B) {
	for _, sample := range []float64{0.01, 0.1} {
		for _, rate := range []float64{1, 10, 100, 1000, 10000} {
			for _, lost := range []float64{0.001, 0.01, 0.1} {
				name := fmt.Sprintf("sample=%g/rate=%g/lost=%g%%", sample, rate, lost*100)
				b.Run(name, func(b *testing.B) { benchCoverage(b, sample, rate, lost) })
			}
		}
	}
}

const coverageHorizon = 7 * 24 * time.Hour

func benchCoverage(b *testing.B, sample, rate, lost float64) {
	var clock atomic.Int64
	clock.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	o, err := New(Config{Sample: sample}, Deps{Cache: emptyCache{}, Now: now})
	if err != nil {
		b.Fatal(err)
	}
	defer o.Close()
	window := o.cfg.Windows[0]
	rule := &rules.Rule{Name: "bench", Kind: rules.BumpRule}
	rng := rand.New(rand.NewPCG(uint64(rate*1e6+lost*1e3), uint64(sample*1e4)))
	ops := make([]rules.Op, 1)
	var losses, caught int
	var offset int64
	times := make([]float64, 0, b.N)
	for range b.N {
		start := clock.Load()
		report := math.Inf(1)
		for {
			clock.Add(int64(rng.ExpFloat64() / rate * 1e9))
			elapsed := time.Duration(clock.Load() - start)
			if elapsed > coverageHorizon {
				break
			}
			offset++
			ops[0] = rules.Op{Kind: rules.OpBump, Rule: rule, Key: "k" + strconv.FormatInt(offset, 10), Source: rules.Position{Topic: "t", Offset: offset}}
			// Sampled: its read before the bump is taken (the budget,
			// 500 reads a second, exceeds the rule's allowance).
			sampled := o.BeforeApply(context.Background(), ops) != nil
			if rng.Float64() >= lost {
				continue
			}
			losses++
			if sampled {
				caught++
				report = (elapsed + window).Seconds()
				break
			}
		}
		times = append(times, report)
	}
	slices.Sort(times)
	q := func(p float64) float64 { return times[min(len(times)-1, int(p*float64(len(times))))] }
	b.ReportMetric(100*float64(caught)/float64(max(losses, 1)), "caught-%")
	b.ReportMetric(q(0.5), "p50-s")
	b.ReportMetric(q(0.99), "p99-s")
}
