package cacheops

import (
	"context"
	"log/slog"
	"net"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
)

// PipelineConfig tunes a PipelineWriter. The zero value gives the
// documented defaults.
type PipelineConfig struct {
	// WriterConfig's fields mean what they mean for Writer, except
	// MaxConcurrency, which bounds the set loads and recounts (MySQL
	// queries) run at once between rounds (default 32), and LoadTimeout,
	// which bounds a recount too (default 5s).
	WriterConfig
	// ConnsPerServer is the number of persistent connections to each
	// memcached server: the most connections one server's share of a
	// round is spread over, and the most that exist at once (concurrent
	// Apply calls wait for a free one). Default 8: the daemon applies
	// the batches of several partitions at once, and with 2 each batch
	// of a round took both while the others waited for a connection.
	ConnsPerServer int
	// MinCommandsPerConn: one server's commands of a round are spread
	// over one more connection for every this many. Default 256.
	MinCommandsPerConn int
	// Timeout bounds dialing and each exchange (writing one connection's
	// share of a round and reading its replies). Default 1s.
	Timeout time.Duration
	// Dial opens a connection to a server; default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// RecountElsewhere leaves every counter recount to the caller: a
	// delta whose counter must be recounted (missing while its rule has a
	// recount query, a decr clamped at zero, a value that is not a
	// number) finishes with OutcomeRecountNeeded instead, and so does an
	// OpRecount, without any request. The daemon sets
	// it when the counters package fences recounts
	// (docs/exact-counters.md): deltas go through the pipeline, recounts
	// through the counters package.
	RecountElsewhere bool
}

const (
	pipelineDefaultConnsPerServer = metaproto.DefaultConnsPerServer
	pipelineDefaultMinCommands    = 256
	pipelineDefaultTimeout        = time.Second
)

// PipelineWriter applies planned and coalesced cache ops to memcached over
// its meta protocol, pipelined: bumps, set appends and counter deltas, with
// the miss, race and size handling of Writer and of the counters package
// (docs/formats.md). It is safe for concurrent use.
//
// # Why a pipeline, and why its own client
//
// gomemcache makes one round trip per request, so a writer on it is
// bounded by round trips (on the order of 10^5 requests/s on a small
// machine) however many goroutines it runs. A batch of the daemon holds
// thousands of independent ops, so PipelineWriter writes all the commands
// for one server in one buffer, reads the replies in bulk, and needs a
// second round only for the few ops that missed.
//
// The Go meta-protocol clients that exist were weighed against what the
// daemon needs: the same server for a key as gomemcache (the read side
// uses gomemcache: crc32-IEEE of the key modulo the server count, as in
// memcache.ServerList.PickServer), append mode, arithmetic with
// autovivify, quiet mode with opaque tokens, and active maintenance.
// github.com/QuangTung97/go-memcache, maintained, pipelines mg, ms and md
// but has no arithmetic command at all (neither bumps nor counters), no ms
// mode (so no append), no quiet mode (replies are matched by position),
// and talks to one address per client, so routing would have to be
// rebuilt around it. github.com/jsp-lqk/metapipe-memcached offers
// get/set/add/replace/delete and touch, no append mode and no arithmetic,
// routes keys with an FNV-1a jump hash, so its server for a key differs
// from gomemcache's, and calls itself experimental. Either would need
// most of what follows added to it.
//
// So PipelineWriter speaks the protocol itself (internal/metaproto), a
// few hundred lines: server selection is delegated to a memcache.ServerSelector — pass
// the itemformat.Selector (or memcache.ServerList) the gomemcache clients use and routing is
// identical by construction — and each server has a small pool of
// persistent connections. It needs memcached 1.6 with ma autovivify and
// opaque tokens on every reply, EN included (tested with 1.6.18).
//
// The commands each op kind sends, and what their replies mean, are the
// Applier's (see Applier). The meta transport sends bumps and set appends
// quiet: they are the bulk of a batch, and sending one again is harmless
// (an extra bump, tokens that leave the set as it is). memcached answers
// errors without the opaque token, so an error is placed by its position
// among the replies and by its kind (only an ma answers "non-numeric
// value", only an ms "object too large"). When several quiet commands
// could have sent it, they are all sent again, loud. Every other command,
// the counter deltas above all, is answered individually and is never
// repeated blindly.
//
// A connection whose exchange fails (I/O error, timeout, cancelled ctx,
// replies that do not fit the commands) is closed. Its ops without a reply
// fail with the cause, retryable unless ctx was cancelled; the caller
// applies the batch again, which is safe for bumps and set tokens
// (README, "How it works"). A counter delta without a reply may or may
// not have been applied: its op fails with ErrUnknownOutcome, and the
// caller must turn it into a recount rather than apply the delta again.
//
// A batch takes one round per step of its slowest op: one round trip per
// connection when nothing misses.
type PipelineWriter = Applier

// PipelineStats are a PipelineWriter's counts (ApplierStats).
type PipelineStats = ApplierStats

// NewPipelineWriter returns a PipelineWriter that sends each key to the
// server servers picks for it; give it the memcache.ServerList (or other
// selector) of the gomemcache clients that read the same items. loader and
// recounter may be nil: then missing sets are never loaded and counters
// that need a recount stay missing or are deleted. A nil logger discards
// logs. Close it to close its connections.
func NewPipelineWriter(servers memcache.ServerSelector, loader SetLoader, recounter Recounter, cfg PipelineConfig, logger *slog.Logger) *PipelineWriter {
	cfg.WriterConfig = cfg.WriterConfig.withDefaults()
	if cfg.ConnsPerServer <= 0 {
		cfg.ConnsPerServer = pipelineDefaultConnsPerServer
	}
	if cfg.MinCommandsPerConn <= 0 {
		cfg.MinCommandsPerConn = pipelineDefaultMinCommands
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = pipelineDefaultTimeout
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tr := &metaTransport{
		pool:               metaproto.NewPool(servers, metaproto.PoolConfig{ConnsPerServer: cfg.ConnsPerServer, Timeout: cfg.Timeout, Dial: cfg.Dial}),
		connsPerServer:     cfg.ConnsPerServer,
		minCommandsPerConn: cfg.MinCommandsPerConn,
		timeout:            cfg.Timeout,
		observe:            cfg.ObserveRoundTrip,
		log:                logger,
	}
	return newApplier(tr, loader, recounter, applierConfig{WriterConfig: cfg.WriterConfig, recountElsewhere: cfg.RecountElsewhere}, logger)
}

// ErrNoMetaProtocol marks a server that does not answer the meta commands
// the PipelineWriter needs (memcached older than 1.6, or a proxy that does
// not route them); memcached.protocol text serves such servers.
var ErrNoMetaProtocol = metaproto.ErrNoMetaProtocol
