package client

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/itemformat"
)

// Reading from a replica (docs/formats.md, "Source positions"). A fill (a
// GetOrComputeFrom lease won, the keys a GetOrComputeMultiFrom look won,
// a set or counter to rebuild) that reads a replica first reads the position item of the replica's source, which
// the daemon moves forward before it sends a batch's bumps, and waits on
// the connection the fill will use until the replica has applied that
// position. A replica that lags behind the changes whose bumps the reader
// saw can then no longer put their old values in the cache.

// ReplicaConfig makes fills read a replica of the source database, fenced
// by the daemon's source positions. The zero values of the optional
// fields give the documented defaults.
type ReplicaConfig struct {
	// DB is the replica: one server (a pool over several replicas would
	// wait on one and fill from another). Required. The client takes one
	// connection per fill, waits on it and hands it to the fill.
	DB *sql.DB
	// SourceServerID is the server_id of the server the replica
	// replicates from, the server_id in the daemon's change events
	// (Debezium's source.server_id). 0 (the default): the client asks
	// the replica (SHOW SLAVE STATUS, or SHOW REPLICA STATUS: its
	// Master_Server_Id or Source_Server_Id) and asks again every 10s, so
	// that readers follow a failover of the primary that the replica
	// follows.
	SourceServerID uint32
	// Primary, when set, is read by fills for which the replica has not
	// applied the position within MaxWait. nil: such fills read the
	// replica and their result is stored with ShortLifetime.
	Primary *sql.DB
	// MaxWait bounds the wait for the replica, per fill. Default 1s. The
	// turnstile's ComputeTime must exceed it (by default it is MaxWait
	// plus 2s, rounded up): the wait is part of the computation.
	MaxWait time.Duration
	// ShortLifetime is how long a value, set or counter filled from a
	// replica that had not caught up lives (Primary nil). Default 1s.
	ShortLifetime time.Duration
}

// Replica defaults (ReplicaConfig).
const (
	defaultReplicaMaxWait       = time.Second
	defaultReplicaShortLifetime = time.Second
	// replicaWarnEvery spaces the warnings of fills that could not be
	// fenced.
	replicaWarnEvery = 10 * time.Second
	// sourceRefresh is how long a source server_id read from the replica
	// is used before it is read again.
	sourceRefresh = 10 * time.Second
)

func (rc *ReplicaConfig) withDefaults() (*ReplicaConfig, error) {
	if rc == nil {
		return nil, nil
	}
	out := *rc
	if out.DB == nil {
		return nil, errors.New("client: Config.Replica.DB is nil: name the replica the fills read")
	}
	if out.MaxWait <= 0 {
		out.MaxWait = defaultReplicaMaxWait
	}
	if out.ShortLifetime <= 0 {
		out.ShortLifetime = defaultReplicaShortLifetime
	}
	return &out, nil
}

// ReplicaStats counts what fills from the replica did since the client
// was made. Every fill counts once in exactly one of Reached, TimedOut or
// Unfenced; PrimaryReads and ShortLived split TimedOut.
type ReplicaStats struct {
	// Reached: the replica had applied the position (at once or after a
	// wait); the fill read it.
	Reached uint64
	// TimedOut: MaxWait passed first, or the replica could not wait
	// (WaitFailed).
	TimedOut uint64
	// WaitFailed: timed-out fills whose wait answered NULL (not a
	// replica of that source, or its SQL thread stopped) or failed:
	// nothing says the replica has the change, so they are handled as
	// time-outs, with a warning.
	WaitFailed uint64
	// PrimaryReads: timed-out fills that read the primary.
	PrimaryReads uint64
	// ShortLived: timed-out fills that read the replica and stored their
	// result with ShortLifetime.
	ShortLived uint64
	// Unfenced: fills that read the replica without a fence, as without
	// a ReplicaConfig, with a warning: no position item (no change with
	// a position applied yet, or evicted), or one without a usable
	// position.
	Unfenced uint64
	// Waited is the total time fills spent waiting for the replica.
	Waited time.Duration
}

// replicaCounters are the atomic counters behind ReplicaStats.
type replicaCounters struct {
	reached, timedOut, primary, short, unfenced, waitFailed atomic.Uint64
	waitedNs                                                atomic.Int64
	lastWarn                                                atomic.Int64 // Unix ns
}

// ReplicaStats returns the counts of fills from the replica; zero without
// Config.Replica. Safe for concurrent use.
func (c *Client) ReplicaStats() ReplicaStats {
	r := &c.replicaStats
	return ReplicaStats{
		Reached: r.reached.Load(), TimedOut: r.timedOut.Load(), PrimaryReads: r.primary.Load(),
		ShortLived: r.short.Load(), Unfenced: r.unfenced.Load(), WaitFailed: r.waitFailed.Load(), Waited: time.Duration(r.waitedNs.Load()),
	}
}

// fillSource is the database a fill reads and how long its result may
// live.
type fillSource struct {
	db Querier
	// conn is the connection to release after the fill; nil without a
	// replica.
	conn *sql.Conn
	// short: store the result for ShortLifetime at most.
	short bool
}

func (f *fillSource) release() {
	if f.conn != nil {
		f.conn.Close()
	}
}

// lifetime returns the lifetime to store a fill's result with, for a
// result that would live for want (0: no expiry).
func (f *fillSource) lifetime(c *Client, want time.Duration) time.Duration {
	if !f.short {
		return want
	}
	if want <= 0 {
		return c.replica.ShortLifetime
	}
	return min(want, c.replica.ShortLifetime)
}

// canFill reports whether missing sets and counters can be rebuilt: there
// is a database to read.
func (c *Client) canFill() bool { return c.db != nil || c.replica != nil }

// fillFrom returns the database a fill reads, which the caller must
// release. Without Config.Replica it is Config.DB. With it, the fill
// reads a connection to the replica once the replica has applied the
// source position read now (after whatever told the caller to fill); when
// MaxWait passes first, a connection to the primary, or the replica's
// with short set. what names the fill in warnings.
func (c *Client) fillFrom(ctx context.Context, what string) (fillSource, error) {
	rc := c.replica
	if rc == nil {
		return fillSource{db: c.db}, nil
	}
	// The position first: it must be read after the read that decided
	// to fill, and the wait must run on the connection the fill uses.
	wait, why := c.sourceWait(ctx, rc)
	conn, err := rc.DB.Conn(ctx)
	if err != nil {
		return fillSource{}, fmt.Errorf("client: %s: replica connection: %w", what, err)
	}
	if why != "" {
		c.replicaStats.unfenced.Add(1)
		c.warnReplica(what, why, nil)
		return fillSource{db: conn, conn: conn}, nil
	}
	outcome, err := c.waitReplica(ctx, conn, wait, rc.MaxWait)
	switch {
	case err != nil && ctx.Err() != nil:
		conn.Close()
		return fillSource{}, fmt.Errorf("client: %s: waiting for the replica: %w", what, ctx.Err())
	case err == nil && outcome == itemformat.WaitReached:
		c.replicaStats.reached.Add(1)
		return fillSource{db: conn, conn: conn}, nil
	case err != nil || outcome == itemformat.WaitUnusable:
		// Nothing says the replica has the change: as behind as a
		// time-out.
		c.replicaStats.waitFailed.Add(1)
		why := wait.Function + " answered NULL: not a replica of that source, or its SQL thread is stopped"
		if err != nil {
			why = wait.Function + " failed"
		}
		c.warnReplica(what, why, err)
	}
	c.replicaStats.timedOut.Add(1)
	if rc.Primary == nil {
		c.replicaStats.short.Add(1)
		c.log.Debug("replica behind the source position; storing the fill with the short lifetime", "fill", what, "max_wait", rc.MaxWait)
		return fillSource{db: conn, conn: conn, short: true}, nil
	}
	conn.Close()
	c.replicaStats.primary.Add(1)
	pconn, err := rc.Primary.Conn(ctx)
	if err != nil {
		return fillSource{}, fmt.Errorf("client: %s: primary connection: %w", what, err)
	}
	return fillSource{db: pconn, conn: pconn}, nil
}

// sourceWait reads the position item of the replica's source and returns
// the statement that waits for it, or why there is none.
func (c *Client) sourceWait(ctx context.Context, rc *ReplicaConfig) (itemformat.ReplicaWait, string) {
	serverID := rc.SourceServerID
	if serverID == 0 {
		var err error
		if serverID, err = c.replicaSource(ctx, rc.DB); err != nil {
			return itemformat.ReplicaWait{}, err.Error()
		}
	}
	key := itemformat.PositionKey(serverID)
	it, err := c.mc.Get(key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return itemformat.ReplicaWait{}, "no position item " + strconv.Quote(key) + " (no change with this server_id and a position applied yet, or evicted)"
	case err != nil:
		return itemformat.ReplicaWait{}, "cannot read position item " + strconv.Quote(key) + ": " + err.Error()
	}
	pos, err := itemformat.DecodePosition(it.Value)
	if err != nil {
		return itemformat.ReplicaWait{}, err.Error()
	}
	w, ok := pos.Wait(rc.MaxWait.Seconds())
	if !ok {
		return itemformat.ReplicaWait{}, "position item " + strconv.Quote(key) + " holds no usable position: " + strconv.Quote(string(it.Value))
	}
	return w, ""
}

// sourceCache is the replica's source server_id as last read, and when.
type sourceCache struct {
	mu   sync.Mutex
	id   uint32
	read time.Time
}

// replicaSource returns the server_id of the server db replicates from,
// read at most every sourceRefresh.
func (c *Client) replicaSource(ctx context.Context, db *sql.DB) (uint32, error) {
	sc := &c.source
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.id != 0 && time.Since(sc.read) < sourceRefresh {
		return sc.id, nil
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout+time.Second)
	defer cancel()
	id, err := querySourceID(ctx, db)
	if err != nil {
		return 0, fmt.Errorf("cannot read the replica's source server_id: %w", err)
	}
	sc.id, sc.read = id, time.Now()
	return id, nil
}

// waitReplica runs w on conn. The server bounds the wait by maxWait;
// the context by maxWait plus the client's Timeout, for a server that
// does not answer.
func (c *Client) waitReplica(ctx context.Context, conn *sql.Conn, w itemformat.ReplicaWait, maxWait time.Duration) (itemformat.WaitOutcome, error) {
	ctx, cancel := context.WithTimeout(ctx, maxWait+c.cfg.Timeout)
	defer cancel()
	start := time.Now()
	var result sql.NullString
	err := conn.QueryRowContext(ctx, w.Query, w.Args...).Scan(&result)
	c.replicaStats.waitedNs.Add(int64(time.Since(start)))
	if err != nil {
		return 0, err
	}
	return w.Outcome(result.String, !result.Valid), nil
}

// warnReplica warns of a fill that could not be fenced, at most every
// replicaWarnEvery.
func (c *Client) warnReplica(what, why string, err error) {
	now := time.Now().UnixNano()
	last := c.replicaStats.lastWarn.Load()
	if now-last < int64(replicaWarnEvery) || !c.replicaStats.lastWarn.CompareAndSwap(last, now) {
		return
	}
	attrs := []any{"fill", what, "reason", why}
	if err != nil {
		attrs = append(attrs, "err", err)
	}
	c.log.Warn("cannot wait for the source position on the replica (docs/formats.md, \"Source positions\")", attrs...)
}

// ReadFunc computes a value for GetOrComputeFrom from db: the replica
// once it has applied the source position, or the primary
// (Config.Replica); without Config.Replica, Config.DB.
type ReadFunc func(ctx context.Context, db *sql.Conn) ([]byte, error)

// MultiReadFunc computes the values of keys for GetOrComputeMultiFrom
// from db, as ReadFunc does. It returns exactly one value per key, in the
// order of keys.
type MultiReadFunc func(ctx context.Context, db *sql.Conn, keys []string) ([][]byte, error)

// GetOrComputeFrom is GetOrCompute for a value the application computes
// from the database: when this caller wins the right to compute it, the
// client reads the source position, waits until the replica
// (Config.Replica) has applied it, and calls compute with a connection to
// the replica (or, after ReplicaConfig.MaxWait, to the primary, or to the
// replica with the value stored for ShortLifetime). So a value cached
// under a namespace version the daemon moved was computed from a database
// state that holds the change that moved it. Without Config.Replica the
// connection is Config.DB's, which must then be a *sql.DB, unfenced.
// ComputeTime must cover the wait and the computation. Safe for
// concurrent use.
func (c *Client) GetOrComputeFrom(ctx context.Context, key string, expiration time.Duration, compute ReadFunc) ([]byte, error) {
	if compute == nil {
		return nil, fmt.Errorf("client: get or compute %q: need a compute function", key)
	}
	what := "get or compute " + strconv.Quote(key)
	return c.getOrCompute(ctx, key, expiration, func(ctx context.Context) ([]byte, time.Duration, error) {
		src, err := c.readConn(ctx, what, "GetOrComputeFrom")
		if err != nil {
			return nil, 0, err
		}
		defer src.release()
		v, err := compute(ctx, src.conn)
		return v, src.lifetime(c, expiration), err
	})
}

// GetOrComputeMultiFrom is GetOrComputeMulti for values the application
// computes from the database, fenced as GetOrComputeFrom is: each call of
// compute (one per look that won keys: the first, and one per later look
// that wins keys another client gave up) is preceded by one read of the
// source position and one wait on the connection compute is given, for
// all its keys. Values filled from a replica that had not caught up
// within MaxWait (Primary nil) are stored with at most ShortLifetime.
// Without Config.Replica the connection is Config.DB's, which must then
// be a *sql.DB, unfenced. ComputeTime must cover the wait and one compute
// call. Safe for concurrent use.
func (c *Client) GetOrComputeMultiFrom(ctx context.Context, keys []TurnstileKey, compute MultiReadFunc) (map[string][]byte, error) {
	if compute == nil {
		return nil, fmt.Errorf("client: get or compute %d keys: need a compute function", len(keys))
	}
	return c.getOrComputeMulti(ctx, keys, func(ctx context.Context, won []TurnstileKey) ([][]byte, error) {
		src, err := c.readConn(ctx, fmt.Sprintf("get or compute %d keys", len(won)), "GetOrComputeMultiFrom")
		if err != nil {
			return nil, err
		}
		defer src.release()
		for i := range won {
			won[i].Expiration = src.lifetime(c, won[i].Expiration)
		}
		return compute(ctx, src.conn, turnstileKeyNames(won))
	})
}

// readConn returns the connection the compute function of fn
// (GetOrComputeFrom, GetOrComputeMultiFrom) reads, which the caller must
// release: fillFrom's with Config.Replica; without it one of Config.DB,
// which must then be a *sql.DB. what names the fill.
func (c *Client) readConn(ctx context.Context, what, fn string) (fillSource, error) {
	if c.replica != nil {
		return c.fillFrom(ctx, what)
	}
	db, ok := c.db.(*sql.DB)
	if !ok {
		return fillSource{}, fmt.Errorf("client: %s: %s needs Config.Replica, or a *sql.DB in Config.DB", what, fn)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		return fillSource{}, fmt.Errorf("client: %s: connection: %w", what, err)
	}
	return fillSource{db: conn, conn: conn}, nil
}
