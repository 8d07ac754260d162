package cacheops

// Read side: the helpers applications import to read what cachewarden
// maintains (namespace versions, sets) and to cache their own values with
// thundering-herd protection. Everything here goes through a Reader.

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/rules"
)

// ReadClient is the part of a memcached client the read side uses.
// *memcache.Client implements it; a wrapper (for instrumentation, say) may
// stand in for it. Implementations must be safe for concurrent use.
type ReadClient interface {
	Get(key string) (*memcache.Item, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	Add(item *memcache.Item) error
	Set(item *memcache.Item) error
	CompareAndSwap(item *memcache.Item) error
}

// ReaderOptions tune a Reader. The zero value gives the documented
// defaults.
type ReaderOptions struct {
	// CompactRatio is the share of a set's tokens that compaction would
	// drop (removals and the additions they cancel, repeated additions) at
	// or above which Members rewrites the set in compact form. Default 0.5
	// when zero; a value above 1 turns compaction on read off.
	CompactRatio float64

	// SetTTL is the memcached lifetime given to a set that Members loads
	// and adds, and to a set it compacts (a rewrite replaces the item's
	// lifetime). Use the TTL of the rule that maintains the set. Default 0:
	// no expiry.
	SetTTL time.Duration

	// NamespaceTTL is the memcached lifetime given to a namespace version
	// that Namespace creates. Default 0: no expiry.
	NamespaceTTL time.Duration

	// LockPoll is the mean interval between attempts of the blocking Lock;
	// each sleep is jittered by ±50%. Default 20ms.
	LockPoll time.Duration

	// Turnstile tunes GetOrCompute and GetOrComputeMulti.
	Turnstile TurnstileOptions
}

// Reader reads and fills the cache items cachewarden maintains, over one
// memcached client. It holds no mutable state and is safe for concurrent
// use by any number of goroutines.
type Reader struct {
	mc   ReadClient
	log  *slog.Logger
	opts ReaderOptions
}

const (
	defaultCompactRatio = 0.5
	defaultLockPoll     = 20 * time.Millisecond
)

// NewReader returns a Reader over mc (usually a *memcache.Client). A nil
// log discards log output. Options left zero take their defaults.
func NewReader(mc ReadClient, log *slog.Logger, opts ReaderOptions) *Reader {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.CompactRatio <= 0 {
		opts.CompactRatio = defaultCompactRatio
	}
	if opts.LockPoll <= 0 {
		opts.LockPoll = defaultLockPoll
	}
	opts.Turnstile = opts.Turnstile.withDefaults()
	return &Reader{mc: mc, log: log, opts: opts}
}

// Key returns the memcached key cachewarden writes for a key prefix and
// template (such as "user:{id}") given the row's values as text: integers
// as decimal digits, strings as their bytes, booleans as "1"/"0". Each
// value is escaped and long keys are hashed exactly as the daemon does, so
// an application that builds its keys here reads the daemon's items. It
// fails when the template is malformed or names a column missing from
// values.
func Key(prefix, template string, values map[string]string) (string, error) {
	return rules.Key(prefix, template, values)
}

// KeyTemplate is a parsed key template for building many keys with one
// parse. It is immutable and safe for concurrent use.
type KeyTemplate struct {
	prefix   string
	template *rules.Template
}

// ParseKeyTemplate parses template (see Key) once for repeated use with
// prefix.
func ParseKeyTemplate(prefix, template string) (*KeyTemplate, error) {
	t, err := rules.ParseTemplate(template)
	if err != nil {
		return nil, err
	}
	return &KeyTemplate{prefix: prefix, template: t}, nil
}

// Key renders the template with values; the result equals
// Key(prefix, template, values).
func (k *KeyTemplate) Key(values map[string]string) (string, error) {
	buf := append(make([]byte, 0, len(k.prefix)+64), k.prefix...)
	buf, missing, ok := k.template.AppendRendered(buf, func(column string) (string, bool) {
		v, ok := values[column]
		return v, ok
	})
	if !ok {
		return "", fmt.Errorf("key template %q: no value for column %q", k.template.String(), missing)
	}
	return rules.FinishKey(buf), nil
}

// EscapeKeyPart escapes s as the daemon escapes every value it places in a
// key or set member: each byte <= 0x20, 0x7f and '%' becomes "%XX".
func EscapeKeyPart(s string) string { return rules.Escape(s) }

// readExpiration converts a lifetime into memcached's expiration field.
// memcached counts whole seconds on its own clock and drops an item once
// that clock reaches the deadline, so a relative expiration of n seconds
// lasts between n-1 and n seconds; one second is therefore added to
// Expiration's rounding up, so the item lives at least d and less than
// d+2s. d <= 0 means no expiry (0).
func readExpiration(d time.Duration, now time.Time) int32 {
	if d <= 0 {
		return 0
	}
	return Expiration(d+time.Second, now)
}
