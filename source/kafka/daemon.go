package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cachewarden/cachewarden/internal/promx"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Daemon defaults.
const (
	DefaultHandoffTimeout = 10 * time.Second
	// firstBatchWait is how long the first batch after an assignment
	// that follows a crash stays open at least (see Config.MaxWait).
	firstBatchWait = 2 * time.Second
)

// StartOffset is where a partition without a committed offset starts.
type StartOffset int

const (
	// StartEarliest starts at the oldest record the partition holds
	// (the default).
	StartEarliest StartOffset = iota
	// StartLatest starts at the partition's end: only new records.
	StartLatest
)

// OffsetReset is what happens when a partition's committed offset is no
// longer in its log: records removed by retention before they were read,
// or a committed offset beyond the partition's end (a topic recreated or
// truncated).
type OffsetReset int

const (
	// ResetFail stops the partition (the default): it is not consumed,
	// the daemon reports not ready and names the partition, until an
	// operator decides (docs/operations.md, "Offsets out of range").
	ResetFail OffsetReset = iota
	// ResetEarliest continues at the oldest record still there.
	ResetEarliest
	// ResetLatest continues at the partition's end.
	ResetLatest
)

// Config is the daemon's Kafka and batching configuration.
type Config struct {
	Kafka KafkaConn
	// Group is the consumer group ID; required.
	Group string
	// Topics are the topics to consume; required.
	Topics []string
	// MaxEvents is the most messages in one batch; default 2000.
	MaxEvents int
	// MaxWait is how long a batch stays open after its first message;
	// default 5ms. After a crash, the first batch of a partition's next
	// owner stays open until it reaches MaxEvents, reaches the end of the
	// partition, or 2s (at least MaxWait) pass: it must cover every
	// message the crashed owner may have applied without committing,
	// whose counter deltas it turns into recounts. This assumes every
	// member of the group uses the same MaxEvents. After a clean handoff
	// the first batch is like any other.
	MaxWait time.Duration
	// StartOffset is where a partition without a committed offset starts;
	// default StartEarliest.
	StartOffset StartOffset
	// OffsetReset is what happens when a committed offset is no longer in
	// the log; default ResetFail.
	OffsetReset OffsetReset
	// Balancers are the partition assignors the member offers, in order
	// of preference; default cooperative-sticky (partitions that stay
	// with a member keep being consumed during a rebalance). Every member
	// of a group must offer a common one.
	Balancers []kgo.GroupBalancer
	// ShutdownTimeout bounds applying the pending delayed bumps at
	// shutdown; default 10s.
	ShutdownTimeout time.Duration
	// HandoffTimeout bounds how long a partition being released (a
	// rebalance or shutdown) may take to finish the batch it is applying
	// before that batch is abandoned; default 10s. It should stay below
	// RebalanceTimeout.
	HandoffTimeout time.Duration
	// StallTimeout is how long a partition may make no progress while
	// messages wait for it before it counts as stalled (a metric, and
	// /readyz); default 1m.
	StallTimeout time.Duration
	// Group protocol timing; zero means the client's defaults (heartbeat
	// 3s, session timeout 45s, rebalance timeout 60s).
	HeartbeatInterval, SessionTimeout, RebalanceTimeout time.Duration
}

// Deps are the daemon's collaborators.
type Deps struct {
	// Pipeline applies batches; required. Its Rebumper, if any, is run by
	// the daemon and flushed at shutdown.
	Pipeline *pipeline.Pipeline
	// Health checks memcached (and MySQL) for readiness; required. The
	// daemon runs it.
	Health *pipeline.Health
	// Logger receives the daemon's records; nil discards.
	Logger *slog.Logger
	// Metrics are the Kafka source's metrics; nil means unregistered ones.
	Metrics *Metrics
}

// Daemon consumes CDC topics as a member of a Kafka consumer group and
// keeps memcached in step with them (docs/operations.md): every assigned
// partition is read in order by its own goroutine, in batches that are
// planned, coalesced and applied, and whose offsets are committed only
// after every op succeeded. Create it with New and start it with Run.
type Daemon struct {
	cfg    Config
	p      *pipeline.Pipeline
	health *pipeline.Health
	m      *Metrics
	// pm are the pipeline's metrics (cachewarden_ready).
	pm  *pipeline.Metrics
	log *slog.Logger

	running     atomic.Bool
	stopped     atomic.Bool
	probingAuth atomic.Bool

	// cl and committer exist once Run has started.
	cl        atomic.Pointer[kgo.Client]
	committer *groupCommitter
	// workCtx is the context partition workers run under: it ends only
	// after the group is left, so that a shutdown hands partitions over
	// like a rebalance does.
	workCtx context.Context

	// lease tells whether the membership is surely live (lease.go);
	// pokeLease asks for a heartbeat of it at once.
	lease     *memberLease
	pokeLease chan struct{}

	mu    sync.RWMutex
	parts map[topicPartition]*partitionWorker
	// committed are the offsets found at the last assignment.
	committed map[topicPartition]committedOffset
}

// New checks cfg and deps and returns a Daemon. It does not connect to
// anything.
func New(cfg Config, deps Deps) (*Daemon, error) {
	if len(cfg.Kafka.Brokers) == 0 {
		return nil, errors.New("kafka: no Kafka brokers")
	}
	if cfg.Group == "" {
		return nil, errors.New("kafka: no consumer group")
	}
	if len(cfg.Topics) == 0 {
		return nil, errors.New("kafka: no topics")
	}
	if deps.Pipeline == nil || deps.Health == nil {
		return nil, errors.New("kafka: a Pipeline and a Health are required")
	}
	if deps.Metrics == nil {
		deps.Metrics = NewMetrics(nil)
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = pipeline.DefaultMaxEvents
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = pipeline.DefaultMaxWait
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = pipeline.DefaultFlushTimeout
	}
	if cfg.HandoffTimeout <= 0 {
		cfg.HandoffTimeout = DefaultHandoffTimeout
	}
	if cfg.StallTimeout <= 0 {
		cfg.StallTimeout = DefaultStallTimeout
	}
	if len(cfg.Balancers) == 0 {
		cfg.Balancers = []kgo.GroupBalancer{kgo.CooperativeStickyBalancer()}
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Daemon{
		cfg: cfg, p: deps.Pipeline, health: deps.Health, m: deps.Metrics, pm: deps.Pipeline.Metrics(), log: log,
		lease: newMemberLease(cfg.sessionTimeout()), pokeLease: make(chan struct{}, 1),
		parts: make(map[topicPartition]*partitionWorker), committed: make(map[topicPartition]committedOffset),
	}, nil
}

// sessionTimeout returns the group session timeout the client uses.
func (c Config) sessionTimeout() time.Duration {
	if c.SessionTimeout > 0 {
		return c.SessionTimeout
	}
	return defaultSessionTimeout
}

// heartbeatInterval returns the heartbeat interval the client uses.
func (c Config) heartbeatInterval() time.Duration {
	if c.HeartbeatInterval > 0 {
		return c.HeartbeatInterval
	}
	return defaultHeartbeatInterval
}

// Ready reports whether the daemon is doing its job: memcached (and
// MySQL, when Deps.MySQL is set) answered the last health check, the
// daemon is a member of the group, no
// assigned partition is stalled, and no batch waits for the schema
// registry. It is safe to call from any goroutine (the /readyz handler
// does).
func (d *Daemon) Ready() bool { return len(d.NotReady()) == 0 }

// NotReady returns why the daemon is not ready, one reason per line of
// /readyz; none when it is ready. It is safe for concurrent use.
func (d *Daemon) NotReady() []string {
	reasons := d.health.NotReady()
	if cl := d.cl.Load(); cl != nil {
		if f := authFailure(cl); f != "" {
			reasons = append(reasons, "kafka: "+f)
		}
	}
	if !d.joined() {
		reasons = append(reasons, "kafka: not a member of consumer group "+d.cfg.Group)
	}
	if d.p.WaitingForSchemas() {
		reasons = append(reasons, "schema registry: a batch waits for a schema it cannot fetch (see the log)")
	}
	if a, ok := d.p.Schemas().(interface{ AuthFailure() string }); ok {
		if f := a.AuthFailure(); f != "" {
			reasons = append(reasons, "schema registry: "+f)
		}
	}
	for _, s := range d.Stalled() {
		reasons = append(reasons, "partition "+s.String())
	}
	return reasons
}

// joined reports whether the member is in a group generation.
func (d *Daemon) joined() bool {
	cl := d.cl.Load()
	if cl == nil || d.stopped.Load() {
		return false
	}
	_, gen := cl.GroupMetadata()
	return gen >= 0
}

// clientOpts are the group consumer's options.
func (d *Daemon) clientOpts() []kgo.Opt {
	start := kgo.NewOffset().AtStart()
	if d.cfg.StartOffset == StartLatest {
		start = kgo.NewOffset().AtEnd()
	}
	reset := kgo.NoResetOffset()
	switch d.cfg.OffsetReset {
	case ResetEarliest:
		reset = kgo.NewOffset().AtStart()
	case ResetLatest:
		reset = kgo.NewOffset().AtEnd()
	}
	opts := []kgo.Opt{
		kgo.ConsumerGroup(d.cfg.Group),
		kgo.ConsumeTopics(d.cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.ConsumeStartOffset(start),
		kgo.ConsumeResetOffset(reset),
		kgo.Balancers(d.cfg.Balancers...),
		kgo.OnPartitionsAssigned(d.assigned),
		kgo.OnPartitionsRevoked(d.revoked),
		kgo.OnPartitionsLost(d.lost),
		kgo.OnOffsetsFetched(d.offsetsFetched),
		// pollLoop hands every record over as a Message and recycles it.
		kgo.WithPools(newRecordPool()),
	}
	if d.cfg.HeartbeatInterval > 0 {
		opts = append(opts, kgo.HeartbeatInterval(d.cfg.HeartbeatInterval))
	}
	if d.cfg.SessionTimeout > 0 {
		opts = append(opts, kgo.SessionTimeout(d.cfg.SessionTimeout))
	}
	if d.cfg.RebalanceTimeout > 0 {
		opts = append(opts, kgo.RebalanceTimeout(d.cfg.RebalanceTimeout))
	}
	return opts
}

// Run consumes until ctx ends, then shuts down gracefully and returns nil:
// it stops fetching, lets each partition finish the batch it is applying
// (up to HandoffTimeout), commits exactly what was applied marked as a
// clean handoff, leaves the group, and applies the pending delayed bumps.
// Errors joining the group or reading partitions are logged and retried;
// Run returns an error only when it cannot start. Run may be called once.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("kafka: Run called twice")
	}
	// Partition work outlives ctx until the group is left.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	d.workCtx = work
	cl, err := d.cfg.Kafka.NewClient(d.log, d.clientOpts()...)
	if err != nil {
		return fmt.Errorf("kafka: group %s: %w", d.cfg.Group, err)
	}
	d.committer = newGroupCommitter(cl, d.m)
	d.cl.Store(cl)
	d.log.Info("consumer starting", "group", d.cfg.Group, "topics", d.cfg.Topics, "brokers", d.cfg.Kafka.Brokers,
		"max_events", d.cfg.MaxEvents, "max_wait", d.cfg.MaxWait)

	// Background work outlives ctx until the partitions have stopped.
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	var background sync.WaitGroup
	background.Go(func() { d.health.Run(bg, d.updateReady) })
	background.Go(func() { pipeline.Every(bg, d.health.Interval(), d.checkGroup, d.updateReady) })
	background.Go(func() { d.committer.run(bg) })
	background.Go(func() {
		d.lease.heartbeatLoop(bg, cl, d.cfg.Group, d.cfg.heartbeatInterval(), d.cfg.sessionTimeout(), d.pokeLease, d.log)
	})
	if rebump := d.p.Rebumper(); rebump != nil {
		background.Go(func() { rebump.Run(bg) })
	}

	pollLoop(ctx, cl, d.route, d.log)

	d.log.Info("consumer stopping: handing partitions over and leaving the group")
	leaveCtx, cancelLeave := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.HandoffTimeout+d.cfg.ShutdownTimeout)
	if err := cl.LeaveGroupContext(leaveCtx); err != nil {
		d.log.Warn("kafka: leaving the group", "error", err.Error())
	}
	cancelLeave()
	// Partitions the group did not revoke (it was never joined, or the
	// leave timed out) are abandoned uncommitted.
	d.stopPartitions(d.ownedPartitions(), false)
	stopWork()
	d.stopped.Store(true)
	cl.Close()
	d.m.assigned.Set(0)
	d.updateReady()

	stopBackground()
	background.Wait()
	if rebump := d.p.Rebumper(); rebump != nil {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ShutdownTimeout)
		rebump.Flush(flushCtx)
		cancel()
	}
	d.log.Info("consumer stopped")
	return nil
}

func (d *Daemon) updateReady() {
	promx.SetBool(d.m.groupJoined, d.joined())
	d.pm.SetReady(d.Ready())
}

// checkGroup is one run of the daemon's group watch (pipeline.Every, every
// health interval): it updates the group state no other loop watches (the
// membership lease's age, a credentials probe while out of the group, the
// stalled-partition gauges). It always returns true.
func (d *Daemon) checkGroup(ctx context.Context, _ bool) bool {
	if age, ok := d.lease.age(time.Now()); ok {
		d.m.leaseAge.Set(age.Seconds())
	}
	d.probeAuthOutsideGroup(ctx)
	d.reportStalled()
	return true
}

// probeAuthOutsideGroup, while the daemon is not in the group, finds out
// whether the brokers refuse the credentials, beside the loop (a probe
// may wait for brokers that do not answer); one probe at a time.
func (d *Daemon) probeAuthOutsideGroup(ctx context.Context) {
	cl := d.cl.Load()
	if cl == nil || d.joined() {
		return
	}
	if auth := clientHook[*kafkaAuth](cl); auth != nil && d.probingAuth.CompareAndSwap(false, true) {
		go func() {
			defer d.probingAuth.Store(false)
			auth.probeAuth(ctx, cl)
		}()
	}
}
