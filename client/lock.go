package client

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Advisory locks. A lock is an item added with memcached's add, so exactly
// one client can create it; it holds a random token naming its owner and
// expires after its TTL, so a crashed owner cannot hold it forever.
// memcached may also evict it early under memory pressure: use these locks
// to avoid duplicate work, never for correctness.

// ErrLockLost is returned by Unlock when the lock is no longer held by the
// caller: it expired (and perhaps another client took it) or was evicted.
var ErrLockLost = errors.New("client: lock lost")

// Lock is a held advisory lock. Its methods are safe for concurrent use.
type Lock struct {
	mc    readClient
	key   string
	token string
}

// Key returns the memcached key of the lock.
func (l *Lock) Key() string { return l.key }

// TryLock takes the lock named key for ttl (rounded up to whole seconds;
// memcached may keep it up to two seconds longer) with one add. It returns
// ok false, and no error, when another client holds the lock. Use a key
// dedicated to the lock, never the key of a cached value. ttl must be
// positive.
func (c *Client) TryLock(ctx context.Context, key string, ttl time.Duration) (*Lock, bool, error) {
	if ttl <= 0 {
		return nil, false, fmt.Errorf("client: lock %q: ttl %v is not positive", key, ttl)
	}
	if err := checkContext(ctx, "lock "+strconv.Quote(key)); err != nil {
		return nil, false, err
	}
	token := rand.Text()
	err := c.mc.Add(&memcache.Item{Key: key, Value: []byte(token), Expiration: readExpiration(ttl, time.Now())})
	switch {
	case err == nil:
		return &Lock{mc: c.mc, key: key, token: token}, true, nil
	case errors.Is(err, memcache.ErrNotStored):
		return nil, false, nil
	}
	return nil, false, fmt.Errorf("client: lock %q: add: %w", key, err)
}

// Lock takes the lock named key for ttl as TryLock does, retrying every
// Config.LockPoll (jittered) while another client holds it, for at
// most maxWait. It returns ok false when maxWait passed without getting the
// lock, and ctx's error when ctx ends first. maxWait <= 0 makes one attempt.
func (c *Client) Lock(ctx context.Context, key string, ttl, maxWait time.Duration) (*Lock, bool, error) {
	deadline := time.Now().Add(maxWait)
	for {
		l, ok, err := c.TryLock(ctx, key, ttl)
		if err != nil || ok {
			return l, ok, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return nil, false, nil
		}
		pause := c.cfg.LockPoll/2 + mrand.N(c.cfg.LockPoll+1)
		if err := sleepContext(ctx, min(pause, left)); err != nil {
			return nil, false, fmt.Errorf("client: lock %q: %w", key, err)
		}
	}
}

// Unlock releases the lock if this holder still owns it, and returns
// ErrLockLost otherwise. It reads the lock's token and CAS id, then, when
// the token is ours, rewrites the item with a negative expiration, which
// memcached treats as already expired: the compare-and-swap makes the
// release atomic, so a lock that expired and was taken by another client
// after the read is never released by mistake. Two round trips; ctx is
// checked before each.
func (l *Lock) Unlock(ctx context.Context) error {
	if err := checkContext(ctx, "unlock "+strconv.Quote(l.key)); err != nil {
		return err
	}
	it, err := l.mc.Get(l.key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return fmt.Errorf("client: unlock %q: %w", l.key, ErrLockLost)
	case err != nil:
		return fmt.Errorf("client: unlock %q: %w", l.key, err)
	case string(it.Value) != l.token:
		return fmt.Errorf("client: unlock %q: %w", l.key, ErrLockLost)
	}
	err = l.mc.CompareAndSwap(&memcache.Item{Key: l.key, Value: it.Value, Flags: it.Flags, Expiration: -1, CasID: it.CasID})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
		return fmt.Errorf("client: unlock %q: %w", l.key, ErrLockLost)
	}
	return fmt.Errorf("client: unlock %q: %w", l.key, err)
}
