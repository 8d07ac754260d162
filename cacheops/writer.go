package cacheops

import (
	"log/slog"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/itemformat"
)

// WriterConfig tunes a Writer. The zero value gives the documented
// defaults.
type WriterConfig struct {
	// MaxConcurrency bounds the memcached calls one Apply has in flight
	// (ops of different keys run concurrently). Default 32. The
	// memcache.Client's MaxIdleConns should be at least this, or
	// connections are opened and closed all the time.
	MaxConcurrency int
	// CompactRatio: a set is dirty, and compacted, when the tokens that
	// compaction drops (removals, superseded and duplicate adds) make up at
	// least this share of its tokens. Default 0.5; values above 1 never
	// compact on a sample.
	CompactRatio float64
	// CompactSample is the share of successful appends followed by a
	// dirtiness check (a gets, and a cas when dirty). Default 0.01; a
	// negative value disables the check, 1 checks after every append.
	CompactSample float64
	// LoadTimeout bounds one SetLoader call. Default 5s.
	LoadTimeout time.Duration
	// Now is the clock that gives a new namespace its initial value (unix
	// milliseconds) and turns TTLs longer than 30 days into memcached's
	// absolute expiry times. Default time.Now.
	Now func() time.Time
	// ObserveRoundTrip, when set, receives the duration of every
	// memcached round trip (one command with Writer, one pipelined
	// exchange with PipelineWriter); it must be safe for concurrent use.
	ObserveRoundTrip RoundTripObserver
}

// Defaults of the memcached settings the writers and counters share
// (config's memcached section refers to them).
const (
	// DefaultMaxConcurrency bounds the memcached calls one Apply has in
	// flight (memcached.max_concurrency).
	DefaultMaxConcurrency = 32
	// DefaultCompactSample is the share of appends followed by a
	// dirtiness check (memcached.compact_sample).
	DefaultCompactSample = 0.01
)

const writerDefaultLoadTimeout = 5 * time.Second

// Writer applies planned and coalesced cache ops to memcached over its
// text protocol, through a gomemcache client: namespace bumps, set
// appends, rebuilds and deletes, with the miss, race and size handling of
// each. It is the Applier over the text transport without counter ops
// (the counters package applies those; NewTextApplier takes them too):
// Apply refuses OpCount and OpRecount. It is safe for concurrent use.
//
// Failure policy (see Applier): memcached errors fail the op (see
// Retryable), so that the batch is retried and not committed. A failed set
// load (MySQL down, slow beyond LoadTimeout, or a bad query) does not: the
// set is deleted and the op reports OutcomeDeleted, because a missing set
// is always correct and readers load it themselves later, while a guessed
// set never is. The batch therefore never waits for MySQL; failed loads
// are logged and counted in WriterStats.LoadErrors.
type Writer struct {
	*Applier
}

// WriterStats are cumulative counts since the Writer was created.
type WriterStats struct {
	// Calls is the number of memcached requests (round trips) made.
	Calls uint64
	// Loads counts SetLoader calls, LoadErrors those that failed.
	Loads, LoadErrors uint64
	// Compactions counts sets rewritten compactly; CASConflicts the
	// compactions abandoned because the set changed after the gets.
	Compactions, CASConflicts uint64
	// Deletes counts items deleted because they could not be kept correct.
	Deletes uint64
}

// NewWriter returns a Writer over mc. loader may be nil: then missing sets
// are never loaded, whatever their rule says. A nil logger discards logs.
func NewWriter(mc *memcache.Client, loader SetLoader, cfg WriterConfig, logger *slog.Logger) *Writer {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	warnIdleConns(mc, cfg.MaxConcurrency, logger)
	tr := newTextTransport(mc, cfg.MaxConcurrency, cfg.ObserveRoundTrip)
	return &Writer{Applier: newApplier(tr, loader, nil, applierConfig{WriterConfig: cfg, noCounters: true}, logger)}
}

// Stats returns the Writer's counters.
func (w *Writer) Stats() WriterStats {
	s := w.Applier.Stats()
	return WriterStats{
		Calls:        s.Commands,
		Loads:        s.Loads,
		LoadErrors:   s.LoadErrors,
		Compactions:  s.Compactions,
		CASConflicts: s.CASConflicts,
		Deletes:      s.Deletes,
	}
}

// withDefaults returns cfg with the documented defaults filled in.
func (cfg WriterConfig) withDefaults() WriterConfig {
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
		cfg.LoadTimeout = writerDefaultLoadTimeout
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}
