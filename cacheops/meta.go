package cacheops

import (
	"log/slog"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
)

// NewMetaApplier returns an Applier that speaks memcached's meta protocol,
// pipelined, sending each key to the server servers picks for it; give it
// the memcache.ServerList (or other selector) of the gomemcache clients
// that read the same items. loader and recounter may be nil: then missing
// sets are never loaded and counters that need a recount stay missing or
// are deleted. A nil logger discards logs. Close it to close its
// connections (cfg.Meta).
//
// # Why pipelined, and why its own client
//
// gomemcache makes one round trip per request, so a writer on it is
// bounded by round trips (on the order of 10^5 requests/s on a small
// machine) however many goroutines it runs. A batch of the daemon holds
// thousands of independent ops, so the meta transport writes all the
// commands for one server in one buffer, reads the replies in bulk, and needs a
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
// So the Applier speaks the protocol itself (internal/metaproto), a
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
func NewMetaApplier(servers memcache.ServerSelector, loader SetLoader, recounter Recounter, cfg Config, logger *slog.Logger) *Applier {
	cfg = cfg.withDefaults()
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	tr := &metaTransport{
		pool:               metaproto.NewPool(servers, cfg.Meta),
		minCommandsPerConn: cfg.MinCommandsPerConn,
		observe:            cfg.ObserveRoundTrip,
		log:                logger,
	}
	return newApplier(tr, loader, recounter, cfg, logger)
}

// ErrNoMetaProtocol marks a server that does not answer the meta commands
// the meta transport needs (memcached older than 1.6, or a proxy that does
// not route them); memcached.protocol text serves such servers.
var ErrNoMetaProtocol = metaproto.ErrNoMetaProtocol
