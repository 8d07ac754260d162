package client

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/internal/metaproto"
)

const herd = 50

// herdResult is what one caller of a herd got.
type herdResult struct {
	value string
	err   error
}

// TestGetOrComputeMissOneRecomputer: 50 callers find a key missing at
// once. memcached's vivify-on-miss hands the computation to exactly one;
// the other 49 find its placeholder and wait (here in a WaitHook, which
// tells the test they are waiting) until the value is there.
func TestGetOrComputeMissOneRecomputer(t *testing.T) {
	waiting := make(chan struct{}, herd)
	var hooks atomic.Int32
	e := newTestEnv(t, nil, func(c *Config) {
		c.Turnstile.WaitHook = func(ctx context.Context, key string, retry func(context.Context) ([]byte, error)) ([]byte, error) {
			hooks.Add(1)
			waiting <- struct{}{}
			for {
				v, err := retry(ctx)
				if !errors.Is(err, ErrStillComputing) {
					return v, err
				}
				if err := sleepContext(ctx, time.Millisecond); err != nil {
					return nil, err
				}
			}
		}
	})
	key := e.prefix + "page"
	var computes atomic.Int32
	compute := func(ctx context.Context) ([]byte, error) {
		computes.Add(1)
		// Every other caller is waiting before the value is computed.
		for range herd - 1 {
			<-waiting
		}
		return []byte("computed"), nil
	}
	results := runHerd(t, func(ctx context.Context) ([]byte, error) {
		return e.c.GetOrCompute(ctx, key, time.Minute, compute)
	})
	for i, r := range results {
		if r.err != nil || r.value != "computed" {
			t.Errorf("caller %d: %q, %v", i, r.value, r.err)
		}
	}
	if n := computes.Load(); n != 1 {
		t.Errorf("%d computations, want 1", n)
	}
	if n := hooks.Load(); n != herd-1 {
		t.Errorf("%d callers waited, want %d", n, herd-1)
	}
	if v, _ := e.value(t, key); v != "computed" {
		t.Errorf("stored %q", v)
	}
	// Stored for at least its lifetime plus the compute time: 63 seconds
	// of memcached's clock, which end 62 to 63 seconds later.
	items, err := e.c.meta.Get(t.Context(), []metaproto.Get{{Key: key}})
	if err != nil || items[0].TTL < 62 || items[0].TTL > 63 {
		t.Errorf("TTL %d (%v), want 60s + 2s of compute time + 1s for memcached's clock", items[0].TTL, err)
	}
}

// TestGetOrComputeExpiryServesStale: a value within ComputeTime of its end
// is recomputed by one of 50 callers; the other 49 are served the old
// value meanwhile (the computation does not end before they all have it).
func TestGetOrComputeExpiryServesStale(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) { c.Turnstile.ComputeTime = 20 * time.Second })
	key := e.prefix + "page"
	// Stored 19s ago with a lifetime of 20s (plus 20s of compute time):
	// 21s left, which is within ComputeTime of the end.
	if err := e.mc.Set(&memcache.Item{Key: key, Value: []byte("old"), Expiration: 19}); err != nil {
		t.Fatal(err)
	}
	testStaleHerd(t, e, key)
}

// TestGetOrComputeInvalidatedServesStale: Invalidate marks a value stale;
// one of 50 callers recomputes it, the others are served the stale value
// meanwhile.
func TestGetOrComputeInvalidatedServesStale(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	key := e.prefix + "page"
	if v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("old")); err != nil || string(v) != "old" {
		t.Fatalf("first GetOrCompute = %q, %v", v, err)
	}
	if err := e.c.Invalidate(t.Context(), key, e.prefix+"missing"); err != nil {
		t.Fatal(err)
	}
	testStaleHerd(t, e, key)
}

// testStaleHerd runs 50 callers on key, whose value "old" is due: one
// computes "new" and returns it, only after the 49 others got "old".
func testStaleHerd(t *testing.T, e *testEnv, key string) {
	t.Helper()
	served := make(chan struct{}, herd)
	var computes atomic.Int32
	compute := func(ctx context.Context) ([]byte, error) {
		computes.Add(1)
		for range herd - 1 {
			<-served
		}
		return []byte("new"), nil
	}
	results := runHerd(t, func(ctx context.Context) ([]byte, error) {
		v, err := e.c.GetOrCompute(ctx, key, time.Minute, compute)
		if string(v) == "old" {
			served <- struct{}{}
		}
		return v, err
	})
	var old, fresh int
	for i, r := range results {
		switch {
		case r.err != nil:
			t.Errorf("caller %d: %v", i, r.err)
		case r.value == "old":
			old++
		case r.value == "new":
			fresh++
		}
	}
	if n := computes.Load(); n != 1 || old != herd-1 || fresh != 1 {
		t.Errorf("%d computations, %d callers served the stale value, %d the new one; want 1, %d, 1", n, old, fresh, herd-1)
	}
	// The new value is stored: the next reader gets it without computing.
	v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) {
		return nil, errors.New("computed again")
	})
	if err != nil || string(v) != "new" {
		t.Errorf("after the herd: %q, %v", v, err)
	}
}

// runHerd runs get in 50 goroutines released together.
func runHerd(t *testing.T, get func(context.Context) ([]byte, error)) []herdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	start := make(chan struct{})
	results := make([]herdResult, herd)
	var wg sync.WaitGroup
	for i := range herd {
		wg.Go(func() {
			<-start
			v, err := get(ctx)
			results[i] = herdResult{string(v), err}
		})
	}
	close(start)
	wg.Wait()
	return results
}

func constant(v string) ComputeFunc {
	return func(context.Context) ([]byte, error) { return []byte(v), nil }
}

// TestGetOrComputeKeepsNewerValues: a value computed before the item was
// invalidated again is returned to its caller but not stored; the next
// reader recomputes.
func TestGetOrComputeKeepsNewerValues(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	key := e.prefix + "page"
	v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(ctx context.Context) ([]byte, error) {
		// The row changes while this computation reads it.
		if err := e.c.Invalidate(ctx, key); err != nil {
			return nil, err
		}
		return []byte("outdated"), nil
	})
	if err != nil || string(v) != "outdated" {
		t.Fatalf("GetOrCompute = %q, %v", v, err)
	}
	v, err = e.c.GetOrCompute(t.Context(), key, time.Minute, constant("current"))
	if err != nil || string(v) != "current" {
		t.Fatalf("after the invalidation: %q, %v; want a recomputation", v, err)
	}
}

// TestGetOrComputeFailedComputation: a failed computation removes its
// placeholder, so the next caller computes at once instead of waiting.
func TestGetOrComputeFailedComputation(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) { c.Turnstile.MaxWait = -1 })
	key := e.prefix + "page"
	boom := errors.New("database down")
	if _, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Fatalf("err = %v, want the computation's", err)
	}
	if v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("v")); err != nil || string(v) != "v" {
		t.Fatalf("after a failed computation: %q, %v", v, err)
	}
}

// TestGetOrComputeWaits: a caller that finds a value being computed waits
// for it within MaxWait, or gives up with ErrStillComputing.
func TestGetOrComputeWaits(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) { c.Turnstile.Wait = time.Millisecond; c.Turnstile.MaxWait = time.Minute })
	impatient := newTestEnv(t, nil, func(c *Config) { c.Turnstile.MaxWait = -1 })
	key := e.prefix + "page"
	computing, release := make(chan struct{}), make(chan struct{})
	first := make(chan herdResult, 1)
	go func() {
		v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) {
			close(computing)
			<-release
			return []byte("v"), nil
		})
		first <- herdResult{string(v), err}
	}()
	<-computing
	if _, err := impatient.c.GetOrCompute(t.Context(), key, time.Minute, constant("x")); !errors.Is(err, ErrStillComputing) {
		t.Fatalf("without waiting: %v, want ErrStillComputing", err)
	}
	second := make(chan herdResult, 1)
	go func() {
		v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("x"))
		second <- herdResult{string(v), err}
	}()
	close(release)
	for _, ch := range []chan herdResult{first, second} {
		if r := <-ch; r.err != nil || r.value != "v" {
			t.Errorf("got %q, %v; want the computed value", r.value, r.err)
		}
	}
}

func TestGetOrComputeMulti(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) { c.Turnstile.Wait = time.Millisecond })
	k := func(i int) string { return fmt.Sprintf("%sitem:%d", e.prefix, i) }
	e.set(t, k(0), "present")
	keys := []TurnstileKey{{k(0), time.Minute}, {k(1), time.Minute}, {k(2), 0}, {k(1), time.Hour}}
	var calls [][]string
	compute := func(ctx context.Context, keys []string) ([][]byte, error) {
		calls = append(calls, keys)
		out := make([][]byte, len(keys))
		for i, key := range keys {
			out[i] = []byte("computed " + key)
		}
		return out, nil
	}
	got, err := e.c.GetOrComputeMulti(t.Context(), keys, compute)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || string(got[k(0)]) != "present" || string(got[k(1)]) != "computed "+k(1) || string(got[k(2)]) != "computed "+k(2) {
		t.Fatalf("GetOrComputeMulti = %q", got)
	}
	if len(calls) != 1 || !slices.Equal(calls[0], []string{k(1), k(2)}) {
		t.Fatalf("compute calls %q, want one with the two missing keys", calls)
	}
	if again, err := e.c.GetOrComputeMulti(t.Context(), keys, compute); err != nil || len(again) != 3 || len(calls) != 1 {
		t.Fatalf("second call: %q, %v, %d compute calls", again, err, len(calls))
	}

	// A herd of multi-key readers: each key is computed once.
	var perKey sync.Map
	herdKeys := []TurnstileKey{{k(10), time.Minute}, {k(11), time.Minute}, {k(12), time.Minute}}
	results := runHerd(t, func(ctx context.Context) ([]byte, error) {
		vs, err := e.c.GetOrComputeMulti(ctx, herdKeys, func(ctx context.Context, keys []string) ([][]byte, error) {
			out := make([][]byte, len(keys))
			for i, key := range keys {
				n, _ := perKey.LoadOrStore(key, new(atomic.Int32))
				n.(*atomic.Int32).Add(1)
				out[i] = []byte("v")
			}
			return out, nil
		})
		if err == nil && len(vs) != len(herdKeys) {
			err = fmt.Errorf("%d values", len(vs))
		}
		return nil, err
	})
	for i, r := range results {
		if r.err != nil {
			t.Errorf("caller %d: %v", i, r.err)
		}
	}
	for _, hk := range herdKeys {
		if n, _ := perKey.Load(hk.Key); n == nil || n.(*atomic.Int32).Load() != 1 {
			t.Errorf("%s computed %v times, want 1", hk.Key, n)
		}
	}
}
