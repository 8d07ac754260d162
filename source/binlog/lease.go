package binlog

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// LockPrefix starts the name of every lease lock: the server-wide lock
// name is LockPrefix + LeaseConfig.Name.
const LockPrefix = "cachewarden:"

// maxLockName is the longest user-level lock name MySQL accepts, in bytes
// (GET_LOCK fails with ER_USER_LOCK_WRONG_NAME above it).
const maxLockName = 64

// DefaultLeaseDuration is LeaseConfig.Duration when it is zero.
const DefaultLeaseDuration = 10 * time.Second

// MinLeaseDuration is the shortest lease: the session wait_timeout that
// drops a frozen holder is whole seconds, and under 2 s a busy server's
// or client's pause would drop a live holder.
const MinLeaseDuration = 2 * time.Second

// heldMarginDivisor sets the safety margin of Held: the lease counts as
// held while less than Duration - Duration/heldMarginDivisor has passed
// since the last confirmation was sent. The margin, a quarter of the
// lease, is the time a write batch checked by Held may still take before
// it lands: the server drops a frozen holder's connection, and so lets a
// standby take over, no sooner than wait_timeout (>= Duration) after the
// last query it received, which was sent after the confirmation Held
// counts from. It must stay below Duration/3 (the other two thirds cover
// the confirmation interval and one confirmation's time), so that a live
// holder's lease never lapses between two confirmations.
const heldMarginDivisor = 4

// ErrLeaseLost wraps the error Keep returns when the instance stops being
// active: its connection failed, or the lock is no longer its own.
var ErrLeaseLost = errors.New("binlog: lease lost")

// ErrNotHeld wraps the error of an operation that needs the lease held.
var ErrNotHeld = errors.New("binlog: lease not held")

// LeaseConfig configures a Lease.
type LeaseConfig struct {
	// Name is the operator's name of the lease, shared by every instance
	// that must not be active at once; the lock is LockPrefix + Name, at
	// most 64 bytes in all. Required.
	Name string
	// Duration is how long a holder that stops answering (frozen,
	// partitioned) may keep the lease: the server drops its connection,
	// and the lock, after about one Duration without a query, and Held
	// says false before that. Default DefaultLeaseDuration; at least
	// MinLeaseDuration.
	Duration time.Duration
}

// Lease elects one active instance among several: the active holds the
// server-wide lock GET_LOCK(LockPrefix+Name) on one dedicated connection
// of the server its *sql.DB names (by default the source's). That
// connection's session wait_timeout and interactive_timeout are set to
// Duration rounded up to whole seconds, so a frozen holder's connection,
// and the lock with it, are dropped by the server after about one lease.
//
// The active confirms the lock every Duration/3 (Keep) with
// IS_USED_LOCK(name) = CONNECTION_ID(); Held tells the writer whether the
// last confirmation is recent enough that the lock is surely still its
// own, and the writer checks it before each memcached write batch. A
// standby polls GET_LOCK every Duration/3 (Acquire), so it takes over
// within about Duration/3 of the active's connection closing, and within
// 2 x Duration of a frozen active's last query. On gaining the lease, the
// caller fences the checkpoint with Checkpoint.Acquire before it writes.
//
// A lock freed by an administrator (KILL of the connection) frees the
// standby at once, while the old active learns of it only at its next
// confirmation, up to Duration/3 later: Held covers a frozen or
// partitioned holder, not that case; Checkpoint's epoch fences its saves
// in every case.
//
// Held is safe for concurrent use with everything; Acquire, TryAcquire,
// Keep and Release serialize on the connection.
type Lease struct {
	db     *sql.DB
	log    *slog.Logger
	lock   string
	dur    time.Duration
	waitTO int // session wait_timeout, seconds

	// beforeConfirm, when set (by tests), runs before each confirmation
	// of Keep, outside any lock: a hook to freeze the holder.
	beforeConfirm func()

	connMu sync.Mutex // serializes use of conn
	conn   *sql.Conn  // the dedicated connection; nil between failures
	connID int64

	mu        sync.Mutex
	active    bool
	confirmed time.Time // when the last successful confirmation was sent
}

// NewLease returns a Lease on the lock LockPrefix+cfg.Name of db's server.
// It does not connect: Acquire and TryAcquire do. A nil log discards.
func NewLease(db *sql.DB, cfg LeaseConfig, log *slog.Logger) (*Lease, error) {
	if db == nil {
		return nil, errors.New("binlog: lease: no database handle")
	}
	if cfg.Name == "" {
		return nil, errors.New("binlog: lease: name is empty: name the lease the instances share")
	}
	lock := LockPrefix + cfg.Name
	if len(lock) > maxLockName {
		return nil, fmt.Errorf("binlog: lease name %q: the lock name %q is %d bytes, MySQL allows at most %d (%d for the name after the %q prefix)",
			cfg.Name, lock, len(lock), maxLockName, maxLockName-len(LockPrefix), LockPrefix)
	}
	if cfg.Duration == 0 {
		cfg.Duration = DefaultLeaseDuration
	}
	if cfg.Duration < MinLeaseDuration {
		return nil, fmt.Errorf("binlog: lease %q: duration %v is below the minimum %v", cfg.Name, cfg.Duration, MinLeaseDuration)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Lease{
		db:     db,
		log:    log.With("lock", lock),
		lock:   lock,
		dur:    cfg.Duration,
		waitTO: int(math.Ceil(cfg.Duration.Seconds())),
	}, nil
}

// LockName returns the server-wide lock name, LockPrefix + the lease name.
func (l *Lease) LockName() string { return l.lock }

// Duration returns the lease duration.
func (l *Lease) Duration() time.Duration { return l.dur }

// interval is the time between confirmations, and between a standby's
// polls.
func (l *Lease) interval() time.Duration { return l.dur / 3 }

// valid is how long after a confirmation was sent Held still says true.
func (l *Lease) valid() time.Duration { return l.dur - l.dur/heldMarginDivisor }

// Held reports whether this instance holds the lease surely enough to
// write: it is active and its last successful confirmation was sent less
// than Duration minus the safety margin (a quarter of Duration) ago, on
// the monotonic clock. age is the time since that confirmation (0 when
// there was none). Safe for concurrent use.
func (l *Lease) Held() (ok bool, age time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.confirmed.IsZero() {
		return false, 0
	}
	age = time.Since(l.confirmed)
	return l.active && age < l.valid(), age
}

// Acquire waits as a standby until it holds the lease, polling GET_LOCK
// every Duration/3, and returns nil once it does (after a first
// confirmation, so Held says true). It returns ctx's error, wrapped, when
// ctx ends first. Errors of a poll are logged and retried on a new
// connection. Call Keep next, and Checkpoint.Acquire before writing.
func (l *Lease) Acquire(ctx context.Context) error {
	tick := time.NewTicker(l.interval())
	defer tick.Stop()
	for {
		ok, err := l.TryAcquire(ctx)
		if ok {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("binlog: lease %s: stop waiting: %w", l.lock, ctx.Err())
			}
			l.log.Warn("lease poll failed; retrying", "err", err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("binlog: lease %s: stop waiting: %w", l.lock, ctx.Err())
		case <-tick.C:
		}
	}
}

// TryAcquire polls once: it asks GET_LOCK for the lock, waiting on the
// server at most Duration/6, and reports whether this instance now holds
// it. It returns true at once when it already does.
func (l *Lease) TryAcquire(ctx context.Context) (bool, error) {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	l.mu.Lock()
	active := l.active
	l.mu.Unlock()
	if active {
		return true, nil
	}
	if err := l.dial(ctx); err != nil {
		return false, err
	}
	wait := l.dur / 6
	qctx, cancel := context.WithTimeout(ctx, wait+l.interval())
	defer cancel()
	var got sql.NullInt64
	err := l.conn.QueryRowContext(qctx, "SELECT GET_LOCK(?, ?)", l.lock, wait.Seconds()).Scan(&got)
	if err != nil {
		l.drop()
		return false, fmt.Errorf("binlog: lease %s: GET_LOCK: %w", l.lock, err)
	}
	if !got.Valid || got.Int64 != 1 {
		l.log.Debug("lease held by another instance", "conn_id", l.connID)
		return false, nil
	}
	if err := l.confirm(ctx); err != nil {
		l.drop()
		return false, fmt.Errorf("binlog: lease %s: confirm after GET_LOCK: %w", l.lock, err)
	}
	l.log.Info("lease acquired: this instance is active", "conn_id", l.connID, "duration", l.dur)
	return true, nil
}

// dial opens the dedicated connection, when there is none, and sets its
// session timeouts. Called with connMu held.
func (l *Lease) dial(ctx context.Context) error {
	if l.conn != nil {
		return nil
	}
	qctx, cancel := context.WithTimeout(ctx, l.interval())
	defer cancel()
	conn, err := l.db.Conn(qctx)
	if err != nil {
		return fmt.Errorf("binlog: lease %s: connect: %w", l.lock, err)
	}
	l.conn = conn
	if _, err := conn.ExecContext(qctx, "SET SESSION wait_timeout = ?, SESSION interactive_timeout = ?", l.waitTO, l.waitTO); err != nil {
		l.drop()
		return fmt.Errorf("binlog: lease %s: set session wait_timeout to %d s: %w", l.lock, l.waitTO, err)
	}
	if err := conn.QueryRowContext(qctx, "SELECT CONNECTION_ID()").Scan(&l.connID); err != nil {
		l.drop()
		return fmt.Errorf("binlog: lease %s: read CONNECTION_ID(): %w", l.lock, err)
	}
	return nil
}

// confirm asks the server whether the lock is this connection's, and
// records the time the question was sent when it is. Called with connMu
// held and conn open.
func (l *Lease) confirm(ctx context.Context) error {
	qctx, cancel := context.WithTimeout(ctx, l.interval())
	defer cancel()
	sent := time.Now()
	var ours sql.NullBool
	if err := l.conn.QueryRowContext(qctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", l.lock).Scan(&ours); err != nil {
		return fmt.Errorf("connection %d: %w", l.connID, err)
	}
	if !ours.Valid || !ours.Bool {
		return fmt.Errorf("connection %d: the lock is no longer held by this connection", l.connID)
	}
	l.mu.Lock()
	l.active, l.confirmed = true, sent
	l.mu.Unlock()
	return nil
}

// drop discards the dedicated connection (closing it rather than handing
// it back to db's pool, where its lock and session timeouts would stay)
// and marks the instance inactive. Called with connMu held.
func (l *Lease) drop() {
	l.mu.Lock()
	l.active = false
	l.mu.Unlock()
	if l.conn == nil {
		return
	}
	_ = l.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = l.conn.Close()
	l.conn, l.connID = nil, 0
}

// Keep confirms the lease every Duration/3 until it is lost or ctx ends.
// When the lease is lost (a confirmation fails, or the lock is no longer
// this connection's) it logs the lock and the cause, discards the
// connection and returns an error wrapping ErrLeaseLost; from then on
// Held says false. When ctx ends it releases the lock and returns nil. It
// returns an error wrapping ErrNotHeld when the lease is not held.
func (l *Lease) Keep(ctx context.Context) error {
	l.mu.Lock()
	active := l.active
	l.mu.Unlock()
	if !active {
		return fmt.Errorf("%w: lock %s: Keep needs Acquire first", ErrNotHeld, l.lock)
	}
	tick := time.NewTicker(l.interval())
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.interval())
			defer cancel()
			return l.Release(rctx)
		case <-tick.C:
		}
		if l.beforeConfirm != nil {
			l.beforeConfirm()
		}
		if err := l.keepOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return nil // ended during the confirmation, which dropped the connection
			}
			return err
		}
	}
}

// keepOnce runs one confirmation of Keep.
func (l *Lease) keepOnce(ctx context.Context) error {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	if l.conn == nil {
		return fmt.Errorf("%w: lock %s: the connection was released", ErrLeaseLost, l.lock)
	}
	err := l.confirm(ctx)
	if err == nil {
		return nil
	}
	id := l.connID
	l.drop()
	if ctx.Err() != nil {
		return err
	}
	l.log.Error("lease lost: this instance is no longer active", "conn_id", id, "err", err)
	return fmt.Errorf("%w: lock %s: %w", ErrLeaseLost, l.lock, err)
}

// Release gives the lock up (RELEASE_LOCK) and discards the connection,
// so a standby can take over at once. It does nothing when there is no
// connection. The instance is inactive afterwards even when it returns
// an error: closing the connection frees the lock anyway.
func (l *Lease) Release(ctx context.Context) error {
	l.connMu.Lock()
	defer l.connMu.Unlock()
	if l.conn == nil {
		return nil
	}
	l.mu.Lock()
	l.active = false
	l.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, l.interval())
	defer cancel()
	_, err := l.conn.ExecContext(qctx, "DO RELEASE_LOCK(?)", l.lock)
	l.drop()
	if err != nil {
		return fmt.Errorf("binlog: lease %s: RELEASE_LOCK: %w (the connection is closed, which frees it)", l.lock, err)
	}
	l.log.Info("lease released")
	return nil
}
