package cacheops

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Thundering-herd protection in the manner of Cache::Memcached::Turnstile.
//
// Every value is stored as a tuple that carries, besides the value, its
// soft expiry: the time the caller asked the value to be recomputed after.
// The item itself lives in memcached for the soft lifetime plus the compute
// time, so it outlives its soft expiry by about one computation.
//
// The first reader to find the soft expiry passed claims the recompute with
// a compare-and-swap that rewrites the tuple as "being recomputed" with the
// same stale value and a soft expiry pushed one compute time ahead. Readers
// that come after see a tuple that is not yet due and keep serving the
// stale value, so the back end sees one computation, not one per reader. If
// the recomputing reader dies, the pushed soft expiry passes and the next
// reader takes over the claim the same way.
//
// With no value at all (first use, or an item that expired completely),
// the first reader adds a placeholder tuple with no value, which claims the
// computation; other readers find the placeholder, wait a bounded time
// (TurnstileOptions.Wait) and try once more, or call a custom hook.
//
// Soft expiries use the clients' wall clocks: clients whose clocks differ
// by more than a compute time may recompute a value twice.

// ErrStillComputing is returned when a value is missing, another client is
// computing it, and it was still missing after the wait and retry.
var ErrStillComputing = errors.New("cacheops: value is being computed by another client")

// ComputeFunc computes the value of one key for GetOrCompute.
type ComputeFunc func(ctx context.Context) ([]byte, error)

// MultiComputeFunc computes the values of keys for GetOrComputeMulti. It
// returns exactly one value per key, in the order of keys.
type MultiComputeFunc func(ctx context.Context, keys []string) ([][]byte, error)

// TurnstileKey is one key of GetOrComputeMulti with the soft lifetime to
// give its value when computed (0: never stale).
type TurnstileKey struct {
	Key        string
	Expiration time.Duration
}

// TurnstileOptions tune GetOrCompute and GetOrComputeMulti. The zero value
// gives the documented defaults.
type TurnstileOptions struct {
	// ComputeTime is a generous upper bound on the duration of one
	// computation (one call of the compute function, which for
	// GetOrComputeMulti covers all its keys). It is how long a claim to
	// recompute lasts and how long an item outlives its soft expiry.
	// Rounded up to whole seconds in memcached. Default 2s.
	ComputeTime time.Duration

	// Wait is how long a reader that finds no value, while another client
	// computes it, waits before trying once more. Default: ComputeTime
	// when ComputeTime is set, else 100ms. A negative Wait never waits:
	// such readers get ErrStillComputing at once.
	Wait time.Duration

	// WaitHook, when set, replaces the wait and retry of GetOrCompute: it
	// is called instead of waiting and its results are returned. retry
	// makes one more attempt without waiting (it returns ErrStillComputing
	// when the value is still being computed elsewhere); the hook may call
	// it, repeatedly if it likes, or not at all. It must be safe for
	// concurrent use.
	WaitHook func(ctx context.Context, key string, retry func(context.Context) ([]byte, error)) ([]byte, error)

	// MultiWaitHook is WaitHook for GetOrComputeMulti: keys are those that
	// had no value and could not be claimed; the values it returns are
	// merged into the result. retry makes one more attempt for those keys
	// (its error matches ErrStillComputing for keys still missing).
	MultiWaitHook func(ctx context.Context, keys []string, retry func(context.Context) (map[string][]byte, error)) (map[string][]byte, error)
}

const (
	defaultComputeTime = 2 * time.Second
	defaultWait        = 100 * time.Millisecond
)

func (o TurnstileOptions) withDefaults() TurnstileOptions {
	if o.Wait == 0 {
		o.Wait = defaultWait
		if o.ComputeTime > 0 {
			o.Wait = o.ComputeTime
		}
	}
	if o.ComputeTime <= 0 {
		o.ComputeTime = defaultComputeTime
	}
	return o
}

// Tuple encoding, version 1:
//
//	byte 0     format version (1)
//	byte 1     state bits: tupleRecomputing, tupleNoValue
//	bytes 2-9  soft expiry, Unix milliseconds, big-endian; 0 = never stale
//	bytes 10-  the value (empty for a placeholder)
//
// A placeholder (tupleNoValue) always has tupleRecomputing set and a
// non-zero soft expiry, which is when its claim lapses.
const (
	tupleFormatV1    byte = 1
	tupleHeaderLen        = 10
	tupleRecomputing byte = 1 << 0
	tupleNoValue     byte = 1 << 1
	tupleKnownStates      = tupleRecomputing | tupleNoValue
)

// turnstileTuple is a decoded stored tuple.
type turnstileTuple struct {
	state      byte
	softExpiry int64 // Unix ms; 0 = never stale
	value      []byte
}

func (t turnstileTuple) hasValue() bool { return t.state&tupleNoValue == 0 }

// due reports whether the soft expiry has passed at nowMs.
func (t turnstileTuple) due(nowMs int64) bool { return t.softExpiry != 0 && nowMs >= t.softExpiry }

func appendTuple(dst []byte, t turnstileTuple) []byte {
	dst = append(dst, tupleFormatV1, t.state)
	dst = binary.BigEndian.AppendUint64(dst, uint64(t.softExpiry))
	return append(dst, t.value...)
}

// decodeTuple parses a stored tuple. The value aliases b.
func decodeTuple(b []byte) (turnstileTuple, error) {
	if len(b) < tupleHeaderLen {
		return turnstileTuple{}, fmt.Errorf("tuple of %d bytes is shorter than its header", len(b))
	}
	if b[0] != tupleFormatV1 {
		return turnstileTuple{}, fmt.Errorf("unknown tuple format %d", b[0])
	}
	t := turnstileTuple{state: b[1], value: b[tupleHeaderLen:]}
	if t.state&^tupleKnownStates != 0 {
		return turnstileTuple{}, fmt.Errorf("unknown tuple state bits %#02x", t.state)
	}
	soft := binary.BigEndian.Uint64(b[2:tupleHeaderLen])
	if soft > math.MaxInt64 {
		return turnstileTuple{}, fmt.Errorf("tuple soft expiry %d out of range", soft)
	}
	t.softExpiry = int64(soft)
	if !t.hasValue() && (t.state&tupleRecomputing == 0 || t.softExpiry == 0 || len(t.value) != 0) {
		return turnstileTuple{}, fmt.Errorf("malformed placeholder tuple")
	}
	return t, nil
}

// turnstileVerdict is what one look at a key decided.
type turnstileVerdict uint8

const (
	verdictValue   turnstileVerdict = iota + 1 // value holds the answer
	verdictCompute                             // the caller claimed the computation
	verdictWait                                // another client is computing; no value
)

// turnstileLook examines the item read for key (nil when missing) and
// claims the computation when it is due: it returns the value to serve,
// or that the caller now computes, or that it must wait.
func (r *Reader) turnstileLook(key string, it *memcache.Item) (turnstileVerdict, []byte, error) {
	ct := r.opts.Turnstile.ComputeTime
	now := time.Now()
	nowMs := now.UnixMilli()
	claimUntil := now.Add(ct).UnixMilli()
	placeholder := appendTuple(nil, turnstileTuple{state: tupleRecomputing | tupleNoValue, softExpiry: claimUntil})

	if it == nil {
		err := r.mc.Add(&memcache.Item{Key: key, Value: placeholder, Expiration: readExpiration(ct, now)})
		switch {
		case err == nil:
			return verdictCompute, nil, nil
		case errors.Is(err, memcache.ErrNotStored):
			return verdictWait, nil, nil
		}
		return 0, nil, fmt.Errorf("cacheops: get or compute %q: add placeholder: %w", key, err)
	}

	t, err := decodeTuple(it.Value)
	if err != nil {
		// Not ours, or from a newer format: claim it like an expired
		// placeholder and replace it with a fresh value.
		r.log.Warn("replacing undecodable turnstile item", "key", key, "err", err)
	} else if !t.due(nowMs) {
		if t.hasValue() {
			return verdictValue, t.value, nil // fresh, or stale while another recomputes
		}
		return verdictWait, nil, nil
	}

	claim := &memcache.Item{Key: key, Flags: it.Flags, CasID: it.CasID}
	stale := err == nil && t.hasValue()
	if stale {
		claim.Value = appendTuple(nil, turnstileTuple{state: tupleRecomputing, softExpiry: claimUntil, value: t.value})
		claim.Expiration = readExpiration(2*ct, now)
	} else {
		claim.Value = placeholder
		claim.Expiration = readExpiration(ct, now)
	}
	err = r.mc.CompareAndSwap(claim)
	switch {
	case err == nil:
		return verdictCompute, nil, nil
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored):
		// Another reader claimed it (or it changed or vanished) since
		// the read.
		if stale {
			return verdictValue, t.value, nil
		}
		return verdictWait, nil, nil
	}
	if stale {
		r.log.Warn("cannot claim recompute; serving stale value", "key", key, "err", err)
		return verdictValue, t.value, nil
	}
	return 0, nil, fmt.Errorf("cacheops: get or compute %q: claim: %w", key, err)
}

// storeComputed stores a freshly computed value with soft lifetime
// expiration. A failure is logged: the caller has its value, and the claim
// lapses after the compute time.
func (r *Reader) storeComputed(key string, expiration time.Duration, value []byte) {
	now := time.Now()
	t := turnstileTuple{value: value}
	var ttl time.Duration
	if expiration > 0 {
		t.softExpiry = now.Add(expiration).UnixMilli()
		ttl = expiration + r.opts.Turnstile.ComputeTime
	}
	err := r.mc.Set(&memcache.Item{Key: key, Value: appendTuple(nil, t), Expiration: readExpiration(ttl, now)})
	if err != nil {
		r.log.Warn("cannot store computed value", "key", key, "bytes", len(value), "err", err)
	}
}

// GetOrCompute returns the value cached at key, computing and storing it
// with compute when it is missing or its soft lifetime expiration has
// passed, while making sure that, across all clients, one caller at a time
// computes it:
//
//   - a fresh value is returned with one round trip;
//   - a value past its soft expiry is recomputed by the first caller that
//     claims it; the others return the stale value at once;
//   - with no value at all, the first caller computes it and the others
//     wait TurnstileOptions.Wait and look once more (or call WaitHook),
//     returning an error matching ErrStillComputing if it is still missing.
//
// expiration is the soft lifetime (0: never stale); memcached keeps the
// item for expiration plus ComputeTime. compute's error is returned
// wrapped. A value computed but not stored (memcached refused it) is still
// returned; the failure is logged. Safe for concurrent use.
func (r *Reader) GetOrCompute(ctx context.Context, key string, expiration time.Duration, compute ComputeFunc) ([]byte, error) {
	if compute == nil || expiration < 0 {
		return nil, fmt.Errorf("cacheops: get or compute %q: need a compute function and a non-negative expiration", key)
	}
	v, wait, err := r.getOrComputeOnce(ctx, key, expiration, compute)
	if err != nil || !wait {
		return v, err
	}
	retry := func(ctx context.Context) ([]byte, error) {
		v, wait, err := r.getOrComputeOnce(ctx, key, expiration, compute)
		if err == nil && wait {
			return nil, fmt.Errorf("cacheops: get or compute %q: %w", key, ErrStillComputing)
		}
		return v, err
	}
	opts := r.opts.Turnstile
	if opts.WaitHook != nil {
		return opts.WaitHook(ctx, key, retry)
	}
	if opts.Wait < 0 {
		return nil, fmt.Errorf("cacheops: get or compute %q: %w", key, ErrStillComputing)
	}
	if err := sleepContext(ctx, opts.Wait); err != nil {
		return nil, fmt.Errorf("cacheops: get or compute %q: %w", key, err)
	}
	return retry(ctx)
}

// getOrComputeOnce makes one attempt; wait is true when another client is
// computing a value that does not exist yet.
func (r *Reader) getOrComputeOnce(ctx context.Context, key string, expiration time.Duration, compute ComputeFunc) (value []byte, wait bool, err error) {
	if err := ctx.Err(); err != nil {
		return nil, false, fmt.Errorf("cacheops: get or compute %q: %w", key, err)
	}
	it, err := r.mc.Get(key)
	if errors.Is(err, memcache.ErrCacheMiss) {
		it, err = nil, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("cacheops: get or compute %q: %w", key, err)
	}
	verdict, v, err := r.turnstileLook(key, it)
	switch {
	case err != nil:
		return nil, false, err
	case verdict == verdictValue:
		return v, false, nil
	case verdict == verdictWait:
		return nil, true, nil
	}
	v, err = compute(ctx)
	if err != nil {
		// The claim lapses after ComputeTime; until then others serve
		// the stale value or wait.
		return nil, false, fmt.Errorf("cacheops: get or compute %q: compute: %w", key, err)
	}
	r.storeComputed(key, expiration, v)
	return v, false, nil
}

// GetOrComputeMulti is GetOrCompute for many keys with as few round trips
// as possible: one GetMulti reads every key, each key that needs computing
// is claimed (one add or compare-and-swap per such key), compute is called
// once with all claimed keys, and each computed value is stored (one set
// per key). Keys that have no value and are being computed elsewhere are
// waited for once together (or passed to MultiWaitHook).
//
// ComputeTime must bound one compute call for all the keys it may receive;
// be generous. Repeated keys are read once; a key's first Expiration wins.
// The map holds every value obtained, even when the error is not nil:
// keys still missing after the retry are named in an error matching
// ErrStillComputing, and a compute error leaves out the keys it was to
// compute. Safe for concurrent use.
func (r *Reader) GetOrComputeMulti(ctx context.Context, keys []TurnstileKey, compute MultiComputeFunc) (map[string][]byte, error) {
	if compute == nil {
		return nil, fmt.Errorf("cacheops: get or compute %d keys: need a compute function", len(keys))
	}
	uniq := make([]TurnstileKey, 0, len(keys))
	seen := make(map[string]struct{}, len(keys))
	for _, k := range keys {
		if k.Expiration < 0 {
			return nil, fmt.Errorf("cacheops: get or compute %q: negative expiration %v", k.Key, k.Expiration)
		}
		if _, dup := seen[k.Key]; !dup {
			seen[k.Key] = struct{}{}
			uniq = append(uniq, k)
		}
	}
	out := make(map[string][]byte, len(uniq))
	waiting, err := r.getOrComputeMultiOnce(ctx, uniq, compute, out)
	if err != nil || len(waiting) == 0 {
		return out, err
	}
	retry := func(ctx context.Context) (map[string][]byte, error) {
		got := make(map[string][]byte, len(waiting))
		still, err := r.getOrComputeMultiOnce(ctx, waiting, compute, got)
		if err == nil && len(still) > 0 {
			err = stillComputingError(still)
		}
		return got, err
	}
	opts := r.opts.Turnstile
	var got map[string][]byte
	switch {
	case opts.MultiWaitHook != nil:
		got, err = opts.MultiWaitHook(ctx, turnstileKeyNames(waiting), retry)
	case opts.Wait < 0:
		err = stillComputingError(waiting)
	default:
		if err = sleepContext(ctx, opts.Wait); err != nil {
			err = fmt.Errorf("cacheops: get or compute %d keys: %w", len(waiting), err)
			break
		}
		got, err = retry(ctx)
	}
	for k, v := range got {
		out[k] = v
	}
	return out, err
}

// getOrComputeMultiOnce makes one attempt for keys (distinct), putting the
// values it obtains into out. It returns the keys that another client is
// computing and that have no value yet.
func (r *Reader) getOrComputeMultiOnce(ctx context.Context, keys []TurnstileKey, compute MultiComputeFunc, out map[string][]byte) (waiting []TurnstileKey, err error) {
	if len(keys) == 0 {
		return nil, nil
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("cacheops: get or compute %d keys: %w", len(keys), err)
	}
	items, err := r.mc.GetMulti(turnstileKeyNames(keys))
	if err != nil {
		return nil, fmt.Errorf("cacheops: get or compute %d keys: %w", len(keys), err)
	}
	var claimed []TurnstileKey
	for _, k := range keys {
		verdict, v, err := r.turnstileLook(k.Key, items[k.Key])
		if err != nil {
			return nil, err
		}
		switch verdict {
		case verdictValue:
			out[k.Key] = v
		case verdictWait:
			waiting = append(waiting, k)
		case verdictCompute:
			claimed = append(claimed, k)
		}
	}
	if len(claimed) == 0 {
		return waiting, nil
	}
	names := turnstileKeyNames(claimed)
	values, err := compute(ctx, names)
	if err != nil {
		return nil, fmt.Errorf("cacheops: get or compute %d keys: compute: %w", len(claimed), err)
	}
	if len(values) != len(claimed) {
		return nil, fmt.Errorf("cacheops: get or compute %d keys: compute returned %d values", len(claimed), len(values))
	}
	for i, k := range claimed {
		r.storeComputed(k.Key, k.Expiration, values[i])
		out[k.Key] = values[i]
	}
	return waiting, nil
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
		return fmt.Errorf("cacheops: get or compute %q and %d more: %w", names[:shown], len(names)-shown, ErrStillComputing)
	}
	return fmt.Errorf("cacheops: get or compute %q: %w", names, ErrStillComputing)
}
