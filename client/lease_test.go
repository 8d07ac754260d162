package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/internal/metaproto"
)

// Leases against invalidation: whatever ends the leased item while its
// winner computes (its stale time, its placeholder's time, an eviction,
// a delete), a value computed before an invalidation is never stored.

// waitGone polls key until memcached no longer has it.
func waitGone(ctx context.Context, t *testing.T, mc *memcache.Client, key string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if _, err := mc.Get(key); errors.Is(err, memcache.ErrCacheMiss) {
			return nil
		} else if err != nil {
			return err
		}
		if err := sleepContext(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return fmt.Errorf("%s still there after %v", key, within)
}

// assertRecomputed checks that the next reader of key does not get the
// value computed before the invalidation: it computes "current".
func assertRecomputed(t *testing.T, e *testEnv, key string) {
	t.Helper()
	if v, ok := e.value(t, key); ok && v == "outdated" {
		t.Errorf("memcached holds the value computed before the invalidation")
	}
	v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("current"))
	if err != nil || string(v) != "current" {
		t.Errorf("after the invalidation: %q, %v; want a recomputation", v, err)
	}
}

// TestLeaseStaleItemEndsDuringCompute: a stale item whose stale time ends
// while its winner computes, then an Invalidate (which finds nothing),
// then the winner's store: the value must not be stored.
func TestLeaseStaleItemEndsDuringCompute(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) {
		c.Turnstile.ComputeTime = 2 * time.Second
		c.Turnstile.StaleFor = 4 * time.Second
	})
	key := e.prefix + "page"
	if _, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("first")); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Invalidate(t.Context(), key); err != nil {
		t.Fatal(err)
	}
	// The row is read, then the stale item ends, then the row changes and
	// is invalidated: all before the store.
	computeThroughInvalidation(t, e, key, 7*time.Second)
	assertRecomputed(t, e, key)
}

// computeThroughInvalidation runs GetOrCompute at key (which its caller
// made due) with a computation that, once the leased item has ended
// (within the given time), invalidates key and returns "outdated".
func computeThroughInvalidation(t *testing.T, e *testEnv, key string, within time.Duration) {
	t.Helper()
	v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(ctx context.Context) ([]byte, error) {
		if err := waitGone(ctx, t, e.mc, key, within); err != nil {
			return nil, err
		}
		if err := e.c.Invalidate(ctx, key); err != nil {
			return nil, err
		}
		return []byte("outdated"), nil
	})
	if err != nil || string(v) != "outdated" {
		t.Fatalf("GetOrCompute = %q, %v", v, err)
	}
}

// TestLeasePlaceholderEndsDuringCompute: the placeholder of a miss ends
// while its winner computes, then an Invalidate, then the store.
func TestLeasePlaceholderEndsDuringCompute(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) { c.Turnstile.ComputeTime = time.Second })
	key := e.prefix + "page"
	computeThroughInvalidation(t, e, key, 4*time.Second)
	assertRecomputed(t, e, key)
}

// TestLeaseDeleteDuringCompute: a plain delete (what other tools do)
// while the winner computes is honoured: the value is not stored, and a
// value another reader computed after the delete is not overwritten.
func TestLeaseDeleteDuringCompute(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	for _, tc := range []struct {
		name    string
		present bool // the key held a value that became due
		another bool // another reader computes after the delete
	}{{"miss", false, false}, {"miss-then-another-reader", false, true}, {"invalidated-value", true, false}} {
		t.Run(tc.name, func(t *testing.T) {
			key := e.prefix + tc.name
			if tc.present {
				if _, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("first")); err != nil {
					t.Fatal(err)
				}
				if err := e.c.Invalidate(t.Context(), key); err != nil {
					t.Fatal(err)
				}
			}
			v, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(ctx context.Context) ([]byte, error) {
				if err := e.mc.Delete(key); err != nil {
					return nil, err
				}
				if tc.another {
					v, err := e.c.GetOrCompute(ctx, key, time.Minute, constant("current"))
					if err != nil || string(v) != "current" {
						return nil, fmt.Errorf("the reader after the delete got %q, %v", v, err)
					}
				}
				return []byte("outdated"), nil
			})
			if err != nil || string(v) != "outdated" {
				t.Fatalf("GetOrCompute = %q, %v", v, err)
			}
			assertRecomputed(t, e, key)
		})
	}
}

// TestLeaseLifetimesHold: memcached's clock ticks in whole seconds; a
// placeholder still holds ComputeTime after it was made, and a stale item
// StaleFor after the Invalidate, and both end less than a second (plus
// the polling) later. Three of each start a third of a second apart, so
// that they meet memcached's tick at different phases.
func TestLeaseLifetimesHold(t *testing.T) {
	const ct, staleFor, phases = time.Second, 2 * time.Second, 3
	e := newTestEnv(t, nil, func(c *Config) {
		c.Turnstile.ComputeTime = ct
		c.Turnstile.StaleFor = staleFor
		c.Turnstile.MaxWait = -1
	})
	var wg sync.WaitGroup
	errs := make(chan error, 2*phases)
	for phase := range phases {
		offset := time.Duration(phase) * time.Second / phases
		// The placeholder: while the winner computes, another reader
		// keeps waiting for ComputeTime; from then on it wins within a
		// second.
		wg.Go(func() {
			time.Sleep(offset)
			key := e.prefix + "placeholder:" + strconv.Itoa(phase)
			computing, release := make(chan [2]time.Time, 1), make(chan struct{})
			done := make(chan error, 1)
			go func() {
				before := time.Now()
				_, err := e.c.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) {
					// The placeholder was made between before and now.
					computing <- [2]time.Time{before, time.Now()}
					<-release
					return []byte("slow"), nil
				})
				done <- err
			}()
			made := <-computing
			won, err := pollUntil(made[0], made[1], ct, 1500*time.Millisecond, func() (bool, error) {
				_, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("second"))
				if errors.Is(err, ErrStillComputing) {
					return false, nil
				}
				return err == nil, err
			})
			close(release)
			errs <- errors.Join(err, <-done)
			t.Logf("placeholder of ComputeTime %v: another reader won %v after it was made", ct, won)
		})
		// The stale item: served (flag X) for StaleFor after the
		// Invalidate.
		wg.Go(func() {
			time.Sleep(offset)
			key := e.prefix + "stale:" + strconv.Itoa(phase)
			if _, err := e.c.GetOrCompute(t.Context(), key, time.Minute, constant("v")); err != nil {
				errs <- err
				return
			}
			before := time.Now()
			if err := e.c.Invalidate(t.Context(), key); err != nil {
				errs <- err
				return
			}
			gone, err := pollUntil(before, time.Now(), staleFor, 1500*time.Millisecond, func() (bool, error) {
				items, err := e.c.meta.Get(t.Context(), []metaproto.Get{{Key: key}})
				return err == nil && !items[0].Found, err
			})
			errs <- err
			t.Logf("stale item of StaleFor %v: gone %v after the Invalidate", staleFor, gone)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// pollUntil calls ended every 25ms: what it watches began between
// start and began (the call that made it), and ended must report false
// until at least min has passed, and true before min+slack. It returns
// how long after start it first reported true. A look takes effect at
// some moment during the call, which a loaded machine can stretch, as it
// can the call that made the item: an end is early only if it was seen
// before min had passed since start by the time the look returned, late
// only if it was not seen though min+slack had passed since began when
// the look began.
func pollUntil(start, began time.Time, min, slack time.Duration, ended func() (bool, error)) (time.Duration, error) {
	for {
		probe := time.Now()
		done, err := ended()
		returned := time.Now().Sub(start)
		switch age := probe.Sub(start); {
		case err != nil:
			return age, err
		case done && returned < min:
			return returned, fmt.Errorf("ended %v after it began, before the %v it must last", returned, min)
		case done:
			return age, nil
		case probe.Sub(began) > min+slack:
			return age, fmt.Errorf("still there %v after it began, want it gone by %v", probe.Sub(began), min+slack)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// TestLeaseRaceWithDatabase: 32 readers over 16 hot rows of MariaDB, each
// updated every ~10ms and then invalidated (half of the time with
// Invalidate, half with a plain delete); each computation takes 5-20ms.
// After the writer stops and the readers settle, no GetOrCompute item
// holds a fresh value other than the row's. A naive read-through (get,
// select, set; invalidated by delete) runs beside it over keys of its own
// and must leave some stale, or the scenario is not sensitive.
func TestLeaseRaceWithDatabase(t *testing.T) {
	const (
		rows      = 16
		readers   = 32
		writeFor  = 2 * time.Second
		maxRounds = 6
		settle    = 500 * time.Millisecond
	)
	db := testDB(t)
	if _, err := db.Exec("CREATE TABLE hot (id INT PRIMARY KEY, v BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	for id := range rows {
		if _, err := db.Exec("INSERT INTO hot VALUES (?, 0)", id); err != nil {
			t.Fatal(err)
		}
	}
	e := newTestEnv(t, db, func(c *Config) { c.Turnstile.Wait = 2 * time.Millisecond })
	leaseKey := func(id int) string { return e.prefix + "lease:" + strconv.Itoa(id) }
	naiveKey := func(id int) string { return e.prefix + "naive:" + strconv.Itoa(id) }
	read := func(ctx context.Context, id int) ([]byte, error) {
		var v int64
		if err := db.QueryRowContext(ctx, "SELECT v FROM hot WHERE id = ?", id).Scan(&v); err != nil {
			return nil, err
		}
		time.Sleep(time.Duration(5+rand.IntN(16)) * time.Millisecond)
		return strconv.AppendInt(nil, v, 10), nil
	}

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var wg sync.WaitGroup
	var readErrs atomic.Int64
	for range readers {
		wg.Go(func() {
			for ctx.Err() == nil {
				id := rand.IntN(rows)
				if _, err := e.c.GetOrCompute(ctx, leaseKey(id), time.Minute, func(ctx context.Context) ([]byte, error) {
					return read(ctx, id)
				}); err != nil && ctx.Err() == nil {
					readErrs.Add(1)
				}
			}
		})
		// The naive read-through, as many readers beside them.
		wg.Go(func() {
			for ctx.Err() == nil {
				id := rand.IntN(rows)
				if _, err := e.mc.Get(naiveKey(id)); errors.Is(err, memcache.ErrCacheMiss) {
					if v, err := read(ctx, id); err == nil {
						_ = e.mc.Set(&memcache.Item{Key: naiveKey(id), Value: v, Expiration: 60})
					}
				}
			}
		})
	}
	// Rounds of writing then settling, the readers running throughout,
	// until the naive read-through shows the race (at most maxRounds).
	naiveSeen := false
	for round := 1; round <= maxRounds && !naiveSeen && !t.Failed(); round++ {
		writes := writeRound(t, ctx, rows, writeFor, func(id, n int) error {
			if _, err := db.Exec("UPDATE hot SET v = v + 1 WHERE id = ?", id); err != nil {
				return err
			}
			var err error
			if n%2 == 0 {
				err = e.c.Invalidate(ctx, leaseKey(id))
			} else if err = e.mc.Delete(leaseKey(id)); errors.Is(err, memcache.ErrCacheMiss) {
				err = nil
			}
			if err2 := e.mc.Delete(naiveKey(id)); err == nil && !errors.Is(err2, memcache.ErrCacheMiss) {
				err = err2
			}
			return err
		})
		time.Sleep(settle)
		var leaseStale, naiveStale int
		for id := range rows {
			var want int64
			if err := db.QueryRow("SELECT v FROM hot WHERE id = ?", id).Scan(&want); err != nil {
				t.Fatal(err)
			}
			items, err := e.c.meta.Get(t.Context(), []metaproto.Get{{Key: leaseKey(id)}, {Key: naiveKey(id)}})
			if err != nil {
				t.Fatal(err)
			}
			if l := items[0]; l.Found && !l.Stale && len(l.Value) > 0 && string(l.Value) != strconv.FormatInt(want, 10) {
				leaseStale++
				t.Errorf("round %d: row %d is %d; GetOrCompute's item holds %q as fresh", round, id, want, l.Value)
			}
			if n := items[1]; n.Found && string(n.Value) != strconv.FormatInt(want, 10) {
				naiveStale++
			}
		}
		t.Logf("round %d: %d writes, %d GetOrCompute errors; stale after settling: GetOrCompute %d of %d rows, naive read-through %d of %d",
			round, writes, readErrs.Load(), leaseStale, rows, naiveStale, rows)
		naiveSeen = naiveStale > 0
	}
	cancel()
	wg.Wait()
	if !naiveSeen && !t.Failed() {
		t.Errorf("the naive read-through left no stale value in %d rounds: the scenario is not sensitive", maxRounds)
	}
}

// writeRound runs one writer per row for d, each calling write(id, n) for
// its n-th change of row id every 5-15ms, and returns the number of
// changes.
func writeRound(t *testing.T, ctx context.Context, rows int, d time.Duration, write func(id, n int) error) int64 {
	t.Helper()
	var writes atomic.Int64
	var writers sync.WaitGroup
	errs := make(chan error, rows)
	for id := range rows {
		writers.Go(func() {
			for n, start := 0, time.Now(); time.Since(start) < d && ctx.Err() == nil; n++ {
				if err := write(id, n); err != nil {
					errs <- err
					return
				}
				writes.Add(1)
				time.Sleep(time.Duration(5+rand.IntN(11)) * time.Millisecond)
			}
		})
	}
	writers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return writes.Load()
}

// TestLeaseWithoutCASStoresNothing: a memcached started with -C (no cas
// ids) answers a winning mg with c0, and refuses every C store. A lease
// with cas 0 must not become a store without C (a plain set): that would
// overwrite whatever the key holds now, a value computed after an
// invalidation included.
func TestLeaseWithoutCASStoresNothing(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	key := e.prefix + "page"
	e.set(t, key, "current")
	won := []metaproto.Item{{Found: true, Won: true, CAS: 0}}
	e.c.storeComputed(t.Context(), []TurnstileKey{{Key: key, Expiration: time.Minute}}, won, [][]byte{[]byte("outdated")})
	if v, ok := e.value(t, key); !ok || v != "current" {
		t.Fatalf("after a store on a lease with cas 0 the key holds %q (present %v), want %q", v, ok, "current")
	}
}

// TestPollUntilSlowLooks: pollUntil's verdicts hold when a look is slow
// (a loaded machine): an end seen by a look that returned after min is
// not early, whenever the look began; an end seen before min is.
func TestPollUntilSlowLooks(t *testing.T) {
	slowEnd := func(d time.Duration) func() (bool, error) {
		return func() (bool, error) { time.Sleep(d); return true, nil }
	}
	if _, err := pollUntil(time.Now(), time.Now(), 100*time.Millisecond, time.Second, slowEnd(300*time.Millisecond)); err != nil {
		t.Errorf("an end seen by a look that returned after min: %v", err)
	}
	if _, err := pollUntil(time.Now(), time.Now(), time.Second, time.Second, slowEnd(0)); err == nil {
		t.Errorf("an end seen at once passed for one after a second")
	}
	// Made by a call that took 2s: still there 2s after the call began,
	// but not min+slack after it returned.
	looks := 0
	secondLook := func() (bool, error) { looks++; return looks > 1, nil }
	if _, err := pollUntil(time.Now().Add(-2*time.Second), time.Now(), time.Second, 500*time.Millisecond, secondLook); err != nil {
		t.Errorf("an item made by a slow call: %v", err)
	}
}
