package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/pipeline"
)

// Purged is what the daemon does when the position its checkpoint names
// is no longer in the source's binary log (purged by expire_logs or
// PURGE BINARY LOGS, or a failover to a server that never had it).
type Purged int

const (
	// PurgedFail stops reading (the default): the daemon reports not
	// ready and names the position until an operator decides
	// (docs/operations.md, "Binary log source").
	PurgedFail Purged = iota
	// PurgedCurrent bumps the fallback namespaces and generations of
	// every rule table, then reads on from the server's current position.
	PurgedCurrent
)

// Daemon defaults.
const (
	// DefaultRetryMin and DefaultRetryMax bound the wait before the
	// stream is opened again after an error.
	DefaultRetryMin = 100 * time.Millisecond
	DefaultRetryMax = 5 * time.Second
	// txnQueue is how many transactions (or parts) the reader keeps
	// ready for the next batch.
	txnQueue = 16
)

// DaemonConfig is what a Daemon reads and how.
type DaemonConfig struct {
	// Stream names the source server, the replica's server id and
	// flavor, and the position read from when no checkpoint exists (zero:
	// the server's current position, as a GTID set when it has one).
	// Its Skip is set by the daemon (the checkpoint table); its MaxEvents
	// defaults to MaxEvents.
	Stream Config
	// Lease elects the active instance (LeaseConfig.Name is required).
	Lease LeaseConfig
	// Checkpoint names where positions are kept (Database and Name
	// required).
	Checkpoint CheckpointConfig
	// MaxEvents bounds the row changes of one batch; default
	// pipeline.DefaultMaxEvents. A transaction larger than it is applied
	// in parts, checkpointed after its last.
	MaxEvents int
	// Purged is what happens when the checkpoint's position was purged
	// from the source's log; default PurgedFail.
	Purged Purged
}

// Deps are the daemon's collaborators.
type Deps struct {
	// Pipeline applies batches; required. Its Rebumper, if any, is run
	// while the daemon is active.
	Pipeline *pipeline.Pipeline
	// Health checks memcached (and MySQL) for readiness; required.
	Health *pipeline.Health
	// Source is a handle on the source server (DaemonConfig.Stream.DSN):
	// checks, information_schema, the lease and the checkpoint. Required.
	Source *sql.DB
	// Metrics are the binary log source's metrics; nil: unregistered.
	Metrics *Metrics
	// Logger receives the daemon's records; nil discards.
	Logger *slog.Logger
}

// Daemon reads a MySQL or MariaDB server's binary log as a replica and
// keeps memcached in step with it (docs/operations.md, "Binary log
// source"): of the instances sharing a lease one is active; it reads
// committed transactions in commit order from its checkpoint, applies
// them in batches through the pipeline, and saves the position after the
// last complete transaction of each applied batch. A frozen active writes
// nothing once its lease may have passed (the write guard), and a resumed
// one's checkpoint saves are fenced. Create it with NewDaemon, start it
// with Run.
type Daemon struct {
	cfg  DaemonConfig
	p    *pipeline.Pipeline
	h    *pipeline.Health
	db   *sql.DB
	m    *Metrics
	pm   *pipeline.Metrics
	log  *slog.Logger
	ckpt *Checkpoint

	lease *Lease
	// active is true while this instance holds the lease and reads.
	active atomic.Bool
	// problem is why reading stopped or fails, for /readyz ("" when it
	// reads); purged marks a stop that waits for an operator.
	problem atomic.Pointer[string]
	running atomic.Bool
	// noSnapshotPos is set once the source turned out not to report a
	// consistent snapshot's position (waitVisible).
	noSnapshotPos atomic.Bool
}

// NewDaemon checks cfg and deps and returns a Daemon. It connects to
// nothing.
func NewDaemon(cfg DaemonConfig, deps Deps) (*Daemon, error) {
	if deps.Pipeline == nil || deps.Health == nil || deps.Source == nil {
		return nil, errors.New("binlog: a Pipeline, a Health and a Source database are required")
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = pipeline.DefaultMaxEvents
	}
	if cfg.Stream.MaxEvents <= 0 || cfg.Stream.MaxEvents > cfg.MaxEvents {
		cfg.Stream.MaxEvents = cfg.MaxEvents
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	lease, err := NewLease(deps.Source, cfg.Lease, log.With("component", "binlog-lease"))
	if err != nil {
		return nil, err
	}
	if deps.Metrics == nil {
		deps.Metrics = NewMetrics(nil)
	}
	return &Daemon{cfg: cfg, p: deps.Pipeline, h: deps.Health, db: deps.Source, m: deps.Metrics,
		pm: deps.Pipeline.Metrics(), log: log, lease: lease}, nil
}

// Ready reports whether NotReady has no reason.
func (d *Daemon) Ready() bool { return len(d.NotReady()) == 0 }

// NotReady returns why the daemon is not ready, one reason per line of
// /readyz: memcached or MySQL unreachable, or the source unreadable. A
// standby that waits for the lease is ready. Safe for concurrent use.
func (d *Daemon) NotReady() []string {
	reasons := d.h.NotReady()
	if p := d.problem.Load(); p != nil && *p != "" {
		reasons = append(reasons, "binlog: "+*p)
	}
	return reasons
}

// setProblem records why reading fails ("" when it reads) and updates
// the readiness gauge.
func (d *Daemon) setProblem(p string) {
	d.problem.Store(&p)
	d.updateReady()
}

func (d *Daemon) updateReady() { d.pm.SetReady(d.Ready()) }

// Run reads until ctx ends, then stops and returns nil: as a standby it
// waits for the lease; as the active instance it reads and applies until
// the lease is lost (then it stands by again) or ctx ends (then it
// finishes the batch being applied, saves its position, applies the
// pending delayed bumps and releases the lease). It returns an error
// only when it cannot start. Run may be called once.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("binlog: Run called twice")
	}
	var background sync.WaitGroup
	bg, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer func() { stop(); background.Wait() }()
	background.Go(func() { d.h.Run(bg, d.updateReady) })
	if err := d.checkServer(ctx); err != nil || ctx.Err() != nil {
		return err
	}
	if d.openCheckpoint(ctx); ctx.Err() != nil {
		return nil
	}
	d.log.Info("binlog source starting", "lock", d.lease.LockName(), "server_id", d.cfg.Stream.ServerID)
	for ctx.Err() == nil {
		if err := d.lease.Acquire(ctx); err != nil {
			break // ctx ended
		}
		d.runActive(ctx)
	}
	d.log.Info("binlog source stopped")
	return nil
}

// checkServer inspects the source server until it answers: a setting,
// privilege or server id that keeps it from being read is an error that
// names each (they do not mend themselves); an unreachable server is
// retried, the daemon not ready meanwhile. It learns the server's flavor.
func (d *Daemon) checkServer(ctx context.Context) error {
	var report *ServerReport
	d.untilDone(ctx, "cannot reach the source server", func() (err error) {
		qctx, cancel := context.WithTimeout(ctx, DefaultQueryTimeout)
		defer cancel()
		report, err = Inspect(qctx, d.db, d.cfg.Stream.ServerID)
		return err
	})
	if report == nil {
		return nil // ctx ended
	}
	for _, n := range report.Notes {
		d.log.Info("binlog source: " + n)
	}
	if len(report.Problems) > 0 {
		return fmt.Errorf("binlog: the source cannot be read: %w", errors.Join(report.Problems...))
	}
	if d.cfg.Stream.Flavor == "" {
		d.cfg.Stream.Flavor = report.Flavor
	}
	d.log.Info("binlog source checked", "flavor", report.Flavor, "version", report.Version, "row_metadata", report.RowMetadata)
	return nil
}

// openCheckpoint opens the checkpoint table, retrying until it can or
// ctx ends (the source may be down at start-up).
func (d *Daemon) openCheckpoint(ctx context.Context) {
	d.untilDone(ctx, "cannot open the checkpoint table", func() (err error) {
		d.ckpt, err = OpenCheckpoint(ctx, d.db, d.cfg.Checkpoint, d.log.With("component", "binlog-checkpoint"))
		return err
	})
}

// untilDone calls try until it returns nil or ctx ends, the daemon not
// ready meanwhile with what and the error, the attempts logged and
// spaced by the backoff.
func (d *Daemon) untilDone(ctx context.Context, what string, try func() error) {
	for attempt := 0; ; attempt++ {
		err := try()
		if err == nil || ctx.Err() != nil {
			return
		}
		d.setProblem(what + ": " + err.Error())
		if retry.Logged(attempt) {
			d.log.Error("binlog: "+what+"; retrying", "attempt", attempt+1, "error", err.Error())
		}
		if retry.Sleep(ctx, retry.Backoff(attempt, DefaultRetryMin, DefaultRetryMax)) != nil {
			return
		}
	}
}

// runActive is one term as the active instance: it keeps the lease
// alive beside reading, and returns when the lease is lost, the
// checkpoint fenced, or ctx ends.
func (d *Daemon) runActive(ctx context.Context) {
	term, endTerm := context.WithCancelCause(ctx)
	defer endTerm(nil)
	// The lease is kept until the pending delayed bumps are flushed, which
	// the write guard refuses once it is released.
	keep, stopKeep := context.WithCancel(context.WithoutCancel(ctx))
	defer stopKeep()
	kept := make(chan error, 1)
	go func() {
		err := d.lease.Keep(keep)
		endTerm(err) // a lost lease ends reading, even while the log is idle
		kept <- err
	}()
	d.active.Store(true)
	d.m.active.Set(1)
	d.log.Info("binlog source active: this instance holds the lease", "lock", d.lease.LockName())

	stopRebump := d.runRebumper(term)
	err := d.readWhileActive(term)
	endTerm(err)
	stopRebump()
	stopKeep()
	if kerr := <-kept; kerr != nil && !errors.Is(kerr, ErrNotHeld) {
		err = kerr
	}
	d.active.Store(false)
	d.m.active.Set(0)
	if ctx.Err() != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.lease.Duration())
		d.lease.Release(rctx)
		cancel()
		return
	}
	d.log.Warn("binlog source no longer active; standing by", "error", errText(err))
}

// runRebumper runs the pipeline's delayed second bumps while active and
// returns the function that stops them and applies the pending ones.
func (d *Daemon) runRebumper(ctx context.Context) func() {
	rb := d.p.Rebumper()
	if rb == nil {
		return func() {}
	}
	bg, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); rb.Run(bg) }()
	return func() {
		cancel()
		<-done
		fctx, cancelFlush := context.WithTimeout(cacheops.WithGuard(context.Background(), d.writeGuard), pipeline.DefaultFlushTimeout)
		rb.Flush(fctx)
		cancelFlush()
	}
}

// writeGuard refuses writes once the lease may have passed
// (cacheops.WithGuard): a frozen active that resumes sends nothing more.
func (d *Daemon) writeGuard() error {
	if ok, age := d.lease.Held(); !ok {
		return fmt.Errorf("%w: the lease %s was last confirmed %s ago", ErrNotHeld, d.lease.LockName(), age.Round(time.Millisecond))
	}
	return nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
