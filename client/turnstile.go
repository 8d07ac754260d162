package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/internal/metaproto"
)

// Thundering-herd protection in the manner of Cache::Memcached::Turnstile,
// on memcached's own leases (the meta protocol's mg flags, memcached 1.6):
//
//   - a miss: mg with N creates an empty placeholder living at least
//     ComputeTime and hands the first reader the win (reply flag W); the
//     others find the placeholder with flag Z and wait for the value;
//   - expiry: values are stored for their lifetime plus ComputeTime, and mg
//     with R hands the win to the first reader that finds less than
//     ComputeTime left; the others (Z) keep serving the value meanwhile;
//   - invalidation: Invalidate marks an item stale (md with I); readers get
//     it with flag X, the first of them with W, and serve the stale value
//     while that one recomputes.
//
// A win is a lease on one item: the one whose cas id the winner's mg
// returned. The winner stores its value with a compare-and-swap on that
// cas id and never otherwise: not with add when the item is gone, not
// with set. memcached gives every new item and every change of an item
// (md with I included) a cas id it never gave before, so once the leased
// item changed (invalidated again, stored by another winner) or ended
// (its time ran out, it was evicted, Invalidate or a plain delete removed
// it), no item will ever carry that cas id again and the value, computed
// from data that may predate the change, is returned to its caller but
// not stored. An Invalidate that finds nothing needs no marker: whatever
// lease was out on the key is already void. A winner that dies leaves a
// placeholder that expires after ComputeTime, after which the next reader
// wins. No clock of any client is involved: memcached's item lifetimes
// decide, so any meta-protocol client (docs/formats.md) shares these
// items.
//
// memcached's clock ticks in whole seconds and drops an item once it
// reaches the item's deadline, so an exptime of n seconds lasts between
// n-1 and n seconds. Every lifetime here is sent as its whole seconds
// plus one (atLeast): a placeholder lives at least ComputeTime, a stale
// item at least StaleFor, a value at least its lifetime plus ComputeTime,
// and each less than one second longer.

// ErrStillComputing is returned when a value is missing, another client is
// computing it, and it was still missing after the bounded wait.
var ErrStillComputing = errors.New("client: value is being computed by another client")

// ComputeFunc computes the value of one key for GetOrCompute.
type ComputeFunc func(ctx context.Context) ([]byte, error)

// MultiComputeFunc computes the values of keys for GetOrComputeMulti. It
// returns exactly one value per key, in the order of keys.
type MultiComputeFunc func(ctx context.Context, keys []string) ([][]byte, error)

// TurnstileKey is one key of GetOrComputeMulti with the lifetime to give
// its value when computed (0: never expires).
type TurnstileKey struct {
	Key        string
	Expiration time.Duration
}

// TurnstileOptions tune GetOrCompute and GetOrComputeMulti. The zero value
// gives the documented defaults.
type TurnstileOptions struct {
	// ComputeTime is a generous upper bound on one computation (one call
	// of the compute function, which for GetOrComputeMulti covers all its
	// keys). It is how long a placeholder lives at least (a winner that
	// dies is replaced less than a second after it), how long a value
	// outlives its lifetime, and how early before that end the first
	// reader recomputes it. A value whose computation outlasts its
	// placeholder is returned but not stored. Rounded up to whole
	// seconds. Default 2s.
	ComputeTime time.Duration

	// Wait is the pause between two looks of a reader that finds no
	// value while another client computes it. Default 50ms.
	Wait time.Duration

	// MaxWait bounds how long such a reader waits in all before it gets
	// ErrStillComputing. Default ComputeTime; negative: never wait.
	MaxWait time.Duration

	// WaitHook, when set, replaces that waiting in GetOrCompute: it is
	// called instead and its results are returned. retry makes one more
	// attempt without waiting (it returns ErrStillComputing when the value
	// is still being computed elsewhere); the hook may call it, repeatedly
	// if it likes, or not at all. It must be safe for concurrent use.
	WaitHook func(ctx context.Context, key string, retry func(context.Context) ([]byte, error)) ([]byte, error)

	// MultiWaitHook is WaitHook for GetOrComputeMulti: keys are those that
	// had no value and were being computed elsewhere; the values it
	// returns are merged into the result. retry makes one more attempt for
	// those keys (its error matches ErrStillComputing for keys still
	// missing).
	MultiWaitHook func(ctx context.Context, keys []string, retry func(context.Context) (map[string][]byte, error)) (map[string][]byte, error)

	// StaleFor is how long an item marked stale by Invalidate keeps being
	// served while it is recomputed: at least StaleFor and less than one
	// second longer, unless a recomputed value replaces it sooner.
	// Rounded up to whole seconds. Default twice ComputeTime.
	StaleFor time.Duration
}

const (
	defaultComputeTime = 2 * time.Second
	defaultWait        = 50 * time.Millisecond
)

func (o TurnstileOptions) withDefaults() TurnstileOptions {
	if o.ComputeTime <= 0 {
		o.ComputeTime = defaultComputeTime
	}
	o.ComputeTime = (o.ComputeTime + time.Second - 1).Truncate(time.Second)
	if o.Wait <= 0 {
		o.Wait = defaultWait
	}
	if o.MaxWait == 0 {
		o.MaxWait = o.ComputeTime
	}
	if o.StaleFor <= 0 {
		o.StaleFor = 2 * o.ComputeTime
	}
	o.StaleFor = (o.StaleFor + time.Second - 1).Truncate(time.Second)
	return o
}

// turnstileVerdict is what one look at a key decided.
type turnstileVerdict uint8

const (
	verdictValue   turnstileVerdict = iota + 1 // the value to serve
	verdictCompute                             // this reader won: compute
	verdictWait                                // no value; another reader computes it
)

// look decides what to do with the answer to an mg with N and R.
func look(it *metaproto.Item) turnstileVerdict {
	switch {
	case it.Won:
		return verdictCompute
	case !it.Found:
		// Only when vivifying failed (memcached out of memory): another
		// look may succeed.
		return verdictWait
	case len(it.Value) == 0 && it.WinSent:
		// The placeholder of a miss (or an empty value being
		// recomputed, which is waited for alike).
		return verdictWait
	}
	// Fresh, or stale or due while another reader recomputes it.
	return verdictValue
}

// leaseGet is the mg of a GetOrCompute look.
func (c *Client) leaseGet(key string) metaproto.Get {
	ct := c.cfg.Turnstile.ComputeTime
	return metaproto.Get{Key: key, Vivify: atLeast(ct), Recache: ct}
}

// storeComputed stores a value computed by the winner of the look that
// returned it, with a compare-and-swap on the cas id of the item that look
// leased, and never otherwise. A value computed before the item changed
// (invalidated again, stored by another winner) or ended (expired,
// evicted, deleted) is not stored: its caller still has it. Failures are
// logged.
func (c *Client) storeComputed(ctx context.Context, keys []TurnstileKey, items []metaproto.Item, values [][]byte) {
	sets := make([]metaproto.Set, 0, len(keys))
	stored := make([]int, 0, len(keys)) // sets[j] stores keys[stored[j]]
	for i, k := range keys {
		if items[i].CAS == 0 {
			// memcached without cas ids (-C): a MetaSet with CAS 0
			// would be a plain set, over whatever the key holds now.
			c.log.Warn("computed value not stored: memcached returned no cas id (started with -C?); GetOrCompute needs cas ids", "key", k.Key)
			continue
		}
		sets = append(sets, metaproto.Set{Key: k.Key, Value: values[i], CAS: items[i].CAS, TTL: c.storedTTL(k.Expiration)})
		stored = append(stored, i)
	}
	for j, err := range c.meta.Set(ctx, sets) {
		i := stored[j]
		switch {
		case err == nil:
		case errors.Is(err, memcache.ErrCacheMiss):
			// Never add instead: the item this lease was on is gone, and
			// whatever ended it (an Invalidate or a delete after a write)
			// may postdate the data the value was computed from.
			c.log.Debug("computed value not stored: the item ended during the computation (expired, evicted or deleted)",
				"key", keys[i].Key, "compute_time", c.cfg.Turnstile.ComputeTime)
		case errors.Is(err, memcache.ErrCASConflict):
			c.log.Debug("computed value not stored: the item changed meanwhile", "key", keys[i].Key)
		default:
			c.log.Warn("cannot store computed value", "key", keys[i].Key, "bytes", len(values[i]), "err", err)
		}
	}
}

// storedTTL is the memcached lifetime of a value whose own lifetime is
// expiration: one compute time more, the window in which the first reader
// recomputes it while the others serve it (atLeast: memcached's clock).
// expiration 0: the value never expires (no T flag).
func (c *Client) storedTTL(expiration time.Duration) time.Duration {
	if expiration <= 0 {
		return 0
	}
	return atLeast(expiration + c.cfg.Turnstile.ComputeTime)
}

// abandon removes the placeholder of a computation that failed, so that
// the next reader computes at once rather than after ComputeTime. Only
// the placeholder this reader won is removed: a stale value keeps being
// served.
func (c *Client) abandon(ctx context.Context, key string, it *metaproto.Item) {
	if len(it.Value) != 0 {
		return
	}
	if err := c.meta.DeleteIf(ctx, key, it.CAS); err != nil && !errors.Is(err, memcache.ErrCASConflict) {
		c.log.Debug("cannot remove the placeholder of a failed computation", "key", key, "err", err)
	}
}

// GetOrCompute returns the value cached at key, computing and storing it
// with compute when it is missing, due or invalidated, while making sure
// that, across all clients, one caller at a time computes it:
//
//   - a fresh value is returned after one round trip;
//   - a value within ComputeTime of its end, or marked stale by
//     Invalidate, is recomputed by the first caller; the others return it
//     at once meanwhile;
//   - with no value at all, the first caller computes it and the others
//     look again every TurnstileOptions.Wait for at most MaxWait (or call
//     WaitHook), and return an error matching ErrStillComputing if it is
//     still missing.
//
// expiration is the value's lifetime (0: it never expires, and only
// Invalidate or a delete makes it recomputed); memcached keeps the item
// for at least expiration plus ComputeTime, less than a second more.
// compute's error is returned wrapped. A value computed but not stored
// (memcached refused it, or the item changed or ended meanwhile) is still
// returned: after an Invalidate or a delete of the key, no value computed
// before it is ever stored. A compute that reads a replica should use
// GetOrComputeFrom, which waits for the replica to have the changes the
// daemon invalidated (Config.Replica). Safe for concurrent use.
func (c *Client) GetOrCompute(ctx context.Context, key string, expiration time.Duration, compute ComputeFunc) ([]byte, error) {
	if compute == nil {
		return nil, fmt.Errorf("client: get or compute %q: need a compute function and a non-negative expiration", key)
	}
	return c.getOrCompute(ctx, key, expiration, func(ctx context.Context) ([]byte, time.Duration, error) {
		v, err := compute(ctx)
		return v, expiration, err
	})
}

// fillFunc computes a value for getOrCompute and says how long it may be
// stored (0: no expiry).
type fillFunc func(ctx context.Context) (value []byte, lifetime time.Duration, err error)

// getOrCompute is GetOrCompute with fill, which may shorten the value's
// lifetime (GetOrComputeFrom).
func (c *Client) getOrCompute(ctx context.Context, key string, expiration time.Duration, fill fillFunc) ([]byte, error) {
	if expiration < 0 {
		return nil, fmt.Errorf("client: get or compute %q: need a compute function and a non-negative expiration", key)
	}
	v, wait, err := c.getOrComputeOnce(ctx, key, fill)
	if err != nil || !wait {
		return v, err
	}
	retry := func(ctx context.Context) ([]byte, error) {
		v, wait, err := c.getOrComputeOnce(ctx, key, fill)
		if err == nil && wait {
			return nil, fmt.Errorf("client: get or compute %q: %w", key, ErrStillComputing)
		}
		return v, err
	}
	opts := c.cfg.Turnstile
	if opts.WaitHook != nil {
		return opts.WaitHook(ctx, key, retry)
	}
	deadline := time.Now().Add(opts.MaxWait)
	for {
		if time.Until(deadline) <= 0 {
			return nil, fmt.Errorf("client: get or compute %q: %w", key, ErrStillComputing)
		}
		if err := sleepContext(ctx, min(opts.Wait, time.Until(deadline))); err != nil {
			return nil, fmt.Errorf("client: get or compute %q: %w", key, err)
		}
		v, wait, err := c.getOrComputeOnce(ctx, key, fill)
		if err != nil || !wait {
			return v, err
		}
	}
}

// getOrComputeOnce makes one attempt; wait is true when another client is
// computing a value that does not exist yet.
func (c *Client) getOrComputeOnce(ctx context.Context, key string, fill fillFunc) (value []byte, wait bool, err error) {
	items, err := c.meta.Get(ctx, []metaproto.Get{c.leaseGet(key)})
	if err != nil {
		return nil, false, fmt.Errorf("client: get or compute %q: %w", key, err)
	}
	it := &items[0]
	switch look(it) {
	case verdictValue:
		return it.Value, false, nil
	case verdictWait:
		return nil, true, nil
	}
	v, lifetime, err := fill(ctx)
	if err != nil {
		c.abandon(ctx, key, it)
		return nil, false, fmt.Errorf("client: get or compute %q: compute: %w", key, err)
	}
	c.storeComputed(ctx, []TurnstileKey{{Key: key, Expiration: lifetime}}, items, [][]byte{v})
	return v, false, nil
}

// GetOrComputeMulti is GetOrCompute for many keys with as few round trips
// as possible: one pipelined mg per server reads every key, compute is
// called once with all the keys this caller won, and their values are
// stored with one pipelined ms per server. Keys that have no value and
// are being computed elsewhere are waited for together (or passed to
// MultiWaitHook).
//
// ComputeTime must bound one compute call for all the keys it may
// receive; be generous. Repeated keys are read once; a key's first
// Expiration wins. The map holds every value obtained, even when the
// error is not nil: keys still missing after the wait are named in an
// error matching ErrStillComputing, and a compute error leaves out the
// keys it was to compute. A compute that reads a replica should use
// GetOrComputeMultiFrom (Config.Replica). Safe for concurrent use.
func (c *Client) GetOrComputeMulti(ctx context.Context, keys []TurnstileKey, compute MultiComputeFunc) (map[string][]byte, error) {
	if compute == nil {
		return nil, fmt.Errorf("client: get or compute %d keys: need a compute function", len(keys))
	}
	return c.getOrComputeMulti(ctx, keys, func(ctx context.Context, won []TurnstileKey) ([][]byte, error) {
		return compute(ctx, turnstileKeyNames(won))
	})
}

// multiFillFunc computes the values of keys (the keys a look won) for
// getOrComputeMulti, one per key in order. It may shorten the keys'
// Expiration (GetOrComputeMultiFrom): they are stored with it.
type multiFillFunc func(ctx context.Context, keys []TurnstileKey) ([][]byte, error)

// getOrComputeMulti is GetOrComputeMulti with fill.
func (c *Client) getOrComputeMulti(ctx context.Context, keys []TurnstileKey, compute multiFillFunc) (map[string][]byte, error) {
	uniq := make([]TurnstileKey, 0, len(keys))
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if k.Expiration < 0 {
			return nil, fmt.Errorf("client: get or compute %q: negative expiration %v", k.Key, k.Expiration)
		}
		if _, dup := seen[k.Key]; !dup {
			seen[k.Key] = struct{}{}
			uniq = append(uniq, k)
		}
	}
	out := make(map[string][]byte, len(uniq))
	waiting, err := c.getOrComputeMultiOnce(ctx, uniq, compute, out)
	if err != nil || len(waiting) == 0 {
		return out, err
	}
	opts := c.cfg.Turnstile
	if opts.MultiWaitHook != nil {
		retry := func(ctx context.Context) (map[string][]byte, error) {
			got := make(map[string][]byte, len(waiting))
			still, err := c.getOrComputeMultiOnce(ctx, waiting, compute, got)
			if err == nil && len(still) > 0 {
				err = stillComputingError(still)
			}
			return got, err
		}
		got, err := opts.MultiWaitHook(ctx, turnstileKeyNames(waiting), retry)
		for k, v := range got {
			out[k] = v
		}
		return out, err
	}
	deadline := time.Now().Add(opts.MaxWait)
	for len(waiting) > 0 {
		if time.Until(deadline) <= 0 {
			return out, stillComputingError(waiting)
		}
		if err := sleepContext(ctx, min(opts.Wait, time.Until(deadline))); err != nil {
			return out, fmt.Errorf("client: get or compute %d keys: %w", len(waiting), err)
		}
		if waiting, err = c.getOrComputeMultiOnce(ctx, waiting, compute, out); err != nil {
			return out, err
		}
	}
	return out, nil
}

// getOrComputeMultiOnce makes one attempt for keys (distinct), putting
// the values it obtains into out. It returns the keys that another client
// is computing and that have no value yet.
func (c *Client) getOrComputeMultiOnce(ctx context.Context, keys []TurnstileKey, compute multiFillFunc, out map[string][]byte) (waiting []TurnstileKey, err error) {
	if len(keys) == 0 {
		return nil, nil
	}
	gets := make([]metaproto.Get, len(keys))
	for i, k := range keys {
		gets[i] = c.leaseGet(k.Key)
	}
	items, err := c.meta.Get(ctx, gets)
	if err != nil {
		return nil, fmt.Errorf("client: get or compute %d keys: %w", len(keys), err)
	}
	var won []TurnstileKey
	var wonItems []metaproto.Item
	for i, k := range keys {
		switch look(&items[i]) {
		case verdictValue:
			out[k.Key] = items[i].Value
		case verdictWait:
			waiting = append(waiting, k)
		case verdictCompute:
			won = append(won, k)
			wonItems = append(wonItems, items[i])
		}
	}
	if len(won) == 0 {
		return waiting, nil
	}
	values, err := compute(ctx, won)
	if err == nil && len(values) != len(won) {
		err = fmt.Errorf("compute returned %d values for %d keys", len(values), len(won))
	}
	if err != nil {
		for i, k := range won {
			c.abandon(ctx, k.Key, &wonItems[i])
		}
		return nil, fmt.Errorf("client: get or compute %d keys: compute: %w", len(won), err)
	}
	c.storeComputed(ctx, won, wonItems, values)
	for i, k := range won {
		out[k.Key] = values[i]
	}
	return waiting, nil
}

// Invalidate marks the items at keys stale (md with I): they keep being
// served for TurnstileOptions.StaleFor (less than a second more), while
// the first GetOrCompute caller to read each recomputes it; no value
// computed before the call is stored afterwards. Use it for values the
// application caches under keys of its own, after the change the values
// derive from is committed; missing items are fine. A plain delete of the
// key is honoured the same way, without the stale period.
func (c *Client) Invalidate(ctx context.Context, keys ...string) error {
	return errors.Join(c.meta.Invalidate(ctx, keys, atLeast(c.cfg.Turnstile.StaleFor))...)
}

func turnstileKeyNames(keys []TurnstileKey) []string {
	names := make([]string, len(keys))
	for i, k := range keys {
		names[i] = k.Key
	}
	return names
}

// stillComputingError names (up to a few of) the keys still missing.
func stillComputingError(keys []TurnstileKey) error {
	const shown = 5
	names := turnstileKeyNames(keys)
	if len(names) > shown {
		return fmt.Errorf("client: get or compute %q and %d more: %w", names[:shown], len(names)-shown, ErrStillComputing)
	}
	return fmt.Errorf("client: get or compute %q: %w", names, ErrStillComputing)
}
