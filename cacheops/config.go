package cacheops

import (
	"time"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
)

// Config tunes an Applier, over either transport (NewMetaApplier,
// NewTextApplier). The zero value gives the documented defaults.
type Config struct {
	// MaxConcurrency bounds the set loads and recounts (MySQL queries) an
	// Apply runs at once between rounds and, over the text transport, the
	// memcached requests it has in flight (ops of different keys run
	// concurrently). Default DefaultMaxConcurrency. With the text
	// transport the memcache.Client's MaxIdleConns should be at least
	// this, or connections are opened and closed all the time.
	MaxConcurrency int
	// CompactRatio: a set is dirty, and compacted, when the tokens that
	// compaction drops (removals, superseded and duplicate adds) make up at
	// least this share of its tokens. Default
	// itemformat.DefaultCompactRatio; values above 1 never compact on a
	// sample.
	CompactRatio float64
	// CompactSample is the share of successful appends followed by a
	// dirtiness check (a gets, and a cas when dirty). Default
	// DefaultCompactSample; a negative value disables the check, 1 checks
	// after every append.
	CompactSample float64
	// LoadTimeout bounds one SetLoader call and one recount. Default 5s.
	LoadTimeout time.Duration
	// Now is the clock that gives a new namespace its initial value (unix
	// milliseconds) and turns TTLs longer than 30 days into memcached's
	// absolute expiry times. Default time.Now.
	Now func() time.Time
	// ObserveRoundTrip, when set, receives the duration of every
	// memcached round trip (one pipelined exchange over the meta
	// transport, one request over the text one); it must be safe for
	// concurrent use.
	ObserveRoundTrip RoundTripObserver
	// RecountElsewhere leaves every counter recount to the caller: a
	// delta whose counter must be recounted (missing while its rule has a
	// recount query, a decr clamped at zero, a value that is not a
	// number) finishes with OutcomeRecountNeeded instead, and so does an
	// OpRecount, without any request. The daemon sets it when the
	// counters package fences recounts (docs/exact-counters.md): deltas
	// go through the Applier, recounts through the counters package.
	RecountElsewhere bool
	// CountersOnly fails every op but OpCount and OpRecount, sending
	// nothing for it (ErrInvalidOp): the counters package's Applier.
	CountersOnly bool

	// Meta sets the meta transport's connections to each server (their
	// number, the bound on dialing and on each exchange, the dialer); the
	// zero value gives metaproto's defaults (metaproto.DefaultTimeout,
	// metaproto.DefaultConnsPerServer). The text transport's connections
	// are its memcache.Client's.
	Meta metaproto.PoolConfig
	// MinCommandsPerConn (meta transport): one server's commands of a
	// round are spread over one more connection for every this many, up
	// to Meta.ConnsPerServer. Default 256.
	MinCommandsPerConn int
}

// Defaults of Config. config's memcached section refers to those the
// daemon's settings share.
const (
	// DefaultMaxConcurrency bounds the MySQL queries (and, over the text
	// transport, memcached requests) one Apply has in flight
	// (memcached.max_concurrency).
	DefaultMaxConcurrency = 32
	// DefaultCompactSample is the share of appends followed by a
	// dirtiness check (memcached.compact_sample).
	DefaultCompactSample = 0.01
)

const (
	defaultLoadTimeout        = 5 * time.Second
	defaultMinCommandsPerConn = 256
)

// withDefaults returns cfg with the documented defaults filled in (Meta's
// are metaproto.NewPool's to fill).
func (cfg Config) withDefaults() Config {
	if cfg.MaxConcurrency <= 0 {
		cfg.MaxConcurrency = DefaultMaxConcurrency
	}
	if cfg.CompactRatio <= 0 {
		cfg.CompactRatio = itemformat.DefaultCompactRatio
	}
	if cfg.CompactSample == 0 {
		cfg.CompactSample = DefaultCompactSample
	}
	if cfg.LoadTimeout <= 0 {
		cfg.LoadTimeout = defaultLoadTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MinCommandsPerConn <= 0 {
		cfg.MinCommandsPerConn = defaultMinCommandsPerConn
	}
	return cfg
}
