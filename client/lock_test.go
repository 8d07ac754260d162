package client

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

func TestTryLockIsExclusive(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	r, key := e.c, e.prefix+"lock"

	const contenders = 20
	start := make(chan struct{})
	var winners atomic.Int32
	var held *Lock
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range contenders {
		wg.Go(func() {
			<-start
			l, ok, err := r.TryLock(t.Context(), key, 30*time.Second)
			if err != nil {
				t.Error(err)
				return
			}
			if ok {
				winners.Add(1)
				mu.Lock()
				held = l
				mu.Unlock()
			}
		})
	}
	close(start)
	wg.Wait()
	if n := winners.Load(); n != 1 {
		t.Fatalf("%d contenders got the lock, want exactly 1", n)
	}
	if _, ok, err := r.TryLock(t.Context(), key, time.Second); ok || err != nil {
		t.Fatalf("held lock taken again: ok=%v err=%v", ok, err)
	}
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := held.Unlock(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Errorf("second Unlock: %v, want ErrLockLost", err)
	}
	l, ok, err := r.TryLock(t.Context(), key, time.Second)
	if !ok || err != nil {
		t.Fatalf("released lock not available: ok=%v err=%v", ok, err)
	}
	if l.Key() != key {
		t.Errorf("Key() = %q", l.Key())
	}
	if _, _, err := r.TryLock(t.Context(), key+"2", 0); err == nil {
		t.Error("a lock without a TTL was accepted")
	}
}

func TestUnlockLeavesAnotherHoldersLock(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	r, mc, key := e.c, e.mc, e.prefix+"lock"
	l, ok, err := r.TryLock(t.Context(), key, 30*time.Second)
	if !ok || err != nil {
		t.Fatalf("TryLock: ok=%v err=%v", ok, err)
	}
	// The lock expires and another client takes it: its item now holds
	// the other client's token.
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("someone-else"), Expiration: 30}); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of a retaken lock: %v, want ErrLockLost", err)
	}
	if it, err := mc.Get(key); err != nil || string(it.Value) != "someone-else" {
		t.Fatalf("the other holder's lock was touched: %v, %v", it, err)
	}
}

func TestLockExpires(t *testing.T) {
	e := newTestEnv(t, nil, nil)
	r, key := e.c, e.prefix+"lock"
	first, ok, err := r.TryLock(t.Context(), key, time.Second)
	if !ok || err != nil {
		t.Fatalf("TryLock: ok=%v err=%v", ok, err)
	}
	if _, ok, _ := r.TryLock(t.Context(), key, time.Second); ok {
		t.Fatal("lock taken while held")
	}
	// The blocking form waits out the TTL (at most 3s on memcached's
	// clock); 20s only guards against a hang.
	second, ok, err := r.Lock(t.Context(), key, 30*time.Second, 20*time.Second)
	if !ok || err != nil {
		t.Fatalf("lock did not expire: ok=%v err=%v", ok, err)
	}
	if err := first.Unlock(t.Context()); !errors.Is(err, ErrLockLost) {
		t.Fatalf("Unlock of an expired lock: %v, want ErrLockLost", err)
	}
	if err := second.Unlock(t.Context()); err != nil {
		t.Fatalf("the new holder's lock was released by the old one: %v", err)
	}
}

func TestLockWaitsForRelease(t *testing.T) {
	e := newTestEnv(t, nil, func(c *Config) { c.LockPoll = 5 * time.Millisecond })
	r, key := e.c, e.prefix+"lock"
	held, ok, err := r.TryLock(t.Context(), key, time.Minute)
	if !ok || err != nil {
		t.Fatalf("TryLock: ok=%v err=%v", ok, err)
	}

	// Bounded wait on a lock held for a minute: gives up.
	if _, ok, err := r.Lock(t.Context(), key, time.Minute, 50*time.Millisecond); ok || err != nil {
		t.Fatalf("Lock on a held lock: ok=%v err=%v", ok, err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, ok, err := r.Lock(ctx, key, time.Minute, time.Minute); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock with a cancelled context: ok=%v err=%v", ok, err)
	}

	type result struct {
		l   *Lock
		ok  bool
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, ok, err := r.Lock(t.Context(), key, time.Minute, time.Minute)
		got <- result{l, ok, err}
	}()
	if err := held.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	res := <-got
	if !res.ok || res.err != nil {
		t.Fatalf("waiting Lock after release: ok=%v err=%v", res.ok, res.err)
	}
	if err := res.l.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
}
