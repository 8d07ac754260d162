// Package consumer turns CDC messages from Kafka into cache operations.
//
// It holds the batch pipeline that decodes (package cdc), plans,
// coalesces and applies them (Pipeline, Coalescer), and the daemon that
// consumes topics as a member of a Kafka consumer group, commits offsets
// only after a batch is applied, hands partitions over cleanly on
// rebalances and shutdown, sends poison messages to a dead-letter topic
// (DLQ) and applies delayed second bumps (Rebumper). It also replays
// ranges of topics or files through the same pipeline (Replayer), reads
// the schemas of Avro messages from a schema registry (SchemaRegistry),
// and serves the metrics and health endpoints (Metrics, HTTPHandler).
// NewStack builds all of it from a config file, for the run, replay and
// demo commands alike.
//
// It applies nothing to memcached itself: package cacheops does (one
// Applier per Stack), with package counters for exact recounts.
package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/cachewarden/cachewarden/config"
)

// Daemon defaults.
const (
	DefaultMaxEvents       = config.DefaultBatchMaxEvents
	DefaultMaxWait         = config.DefaultBatchMaxWait
	DefaultReadyInterval   = 2 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	DefaultHandoffTimeout  = 10 * time.Second
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
	// default 10ms. After a crash, the first batch of a partition's next
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
	// ReadyInterval is the period of the memcached health check; default
	// 2s.
	ReadyInterval time.Duration
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

// Pinger checks that memcached answers; *memcache.Client is one. Close
// drops its idle connections (the client stays usable): after a failed
// ping the daemon closes them all at once, since after a memcached restart
// every pooled connection is dead and each would otherwise cost a failed
// request (and a retry backoff) of its own.
type Pinger interface {
	Ping() error
	Close() error
}

// Deps are the daemon's collaborators.
type Deps struct {
	// Pipeline applies batches; required. Its Rebumper, if any, is run by
	// the daemon and flushed at shutdown.
	Pipeline *Pipeline
	// Memcached is checked for readiness; required.
	Memcached Pinger
	// Logger receives the daemon's records; nil discards.
	Logger *slog.Logger
	// MySQL, when not nil, is checked for readiness like memcached: set
	// it when some rule queries MySQL.
	MySQL *MySQLHealth
}

// Daemon consumes CDC topics as a member of a Kafka consumer group and
// keeps memcached in step with them (docs/operations.md): every assigned
// partition is read in order by its own goroutine, in batches that are
// planned, coalesced and applied, and whose offsets are committed only
// after every op succeeded. Create it with New and start it with Run.
type Daemon struct {
	cfg    Config
	p      *Pipeline
	health Pinger
	m      *Metrics
	log    *slog.Logger

	running     atomic.Bool
	stopped     atomic.Bool
	memcachedUp atomic.Bool
	// mysql is checked for readiness when set; mysqlState holds the
	// result.
	mysql      *MySQLHealth
	mysqlState mysqlState

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
		return nil, errors.New("consumer: no Kafka brokers")
	}
	if cfg.Group == "" {
		return nil, errors.New("consumer: no consumer group")
	}
	if len(cfg.Topics) == 0 {
		return nil, errors.New("consumer: no topics")
	}
	if deps.Pipeline == nil || deps.Memcached == nil {
		return nil, errors.New("consumer: a Pipeline and a memcached Pinger are required")
	}
	if deps.MySQL != nil && deps.MySQL.DB == nil {
		return nil, errors.New("consumer: Deps.MySQL without a DB to ping")
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.ReadyInterval <= 0 {
		cfg.ReadyInterval = DefaultReadyInterval
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
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
		cfg: cfg, p: deps.Pipeline, health: deps.Memcached, mysql: deps.MySQL, m: deps.Pipeline.Metrics(), log: log,
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
	var reasons []string
	if !d.memcachedUp.Load() {
		reasons = append(reasons, "memcached: unreachable, or a server does not answer the meta commands (see the log)")
	}
	if r := d.mysqlNotReady(); r != "" {
		reasons = append(reasons, r)
	}
	if !d.joined() {
		reasons = append(reasons, "kafka: not a member of consumer group "+d.cfg.Group)
	}
	if d.p.WaitingForSchemas() {
		reasons = append(reasons, "schema registry: a batch waits for a schema it cannot fetch (see the log)")
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
		return errors.New("consumer: Run called twice")
	}
	// Partition work outlives ctx until the group is left.
	work, stopWork := context.WithCancel(context.WithoutCancel(ctx))
	defer stopWork()
	d.workCtx = work
	cl, err := d.cfg.Kafka.NewClient(d.log, d.clientOpts()...)
	if err != nil {
		return fmt.Errorf("consumer: group %s: %w", d.cfg.Group, err)
	}
	d.committer = newGroupCommitter(cl, d.m)
	d.cl.Store(cl)
	d.log.Info("consumer starting", "group", d.cfg.Group, "topics", d.cfg.Topics, "brokers", d.cfg.Kafka.Brokers,
		"max_events", d.cfg.MaxEvents, "max_wait", d.cfg.MaxWait)

	// Background work outlives ctx until the partitions have stopped.
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	var background sync.WaitGroup
	background.Go(func() { d.healthLoop(bg) })
	if d.mysql != nil {
		background.Go(func() { d.mysqlHealthLoop(bg) })
	}
	background.Go(func() { d.committer.run(bg) })
	background.Go(func() {
		d.lease.heartbeatLoop(bg, cl, d.cfg.Group, d.cfg.heartbeatInterval(), d.cfg.sessionTimeout(), d.pokeLease, d.log)
	})
	if rebump := d.p.cfg.Rebump; rebump != nil {
		background.Go(func() { rebump.Run(bg) })
	}

	pollLoop(ctx, cl, d.route, d.log)

	d.log.Info("consumer stopping: handing partitions over and leaving the group")
	leaveCtx, cancelLeave := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.HandoffTimeout+d.cfg.ShutdownTimeout)
	if err := cl.LeaveGroupContext(leaveCtx); err != nil {
		d.log.Warn("consumer: leaving the group", "error", err.Error())
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
	if rebump := d.p.cfg.Rebump; rebump != nil {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ShutdownTimeout)
		rebump.Flush(flushCtx)
		cancel()
	}
	d.log.Info("consumer stopped")
	return nil
}

// partitionWorker is the goroutine consuming one assigned partition.
type partitionWorker struct {
	q *partitionQueue
	// release asks the worker to stop once the batch it is applying
	// is applied; abandon stops it at once.
	release, abandon context.CancelFunc
	done             chan struct{}
	// result is set before done is closed.
	result partitionResult
	// progress tells a stalled partition (see Daemon.Stalled).
	progress progressClock
	// member is the group member ID the partition was assigned to: the
	// worker writes and commits only while that membership's lease holds
	// (memberLease), never after the client joined again as another
	// member.
	member string
}

// partitionResult is what a worker leaves behind.
type partitionResult struct {
	// next is the offset after the last applied message; -1 when none
	// was applied.
	next int64
	// clean: nothing past next was applied (no batch was abandoned
	// half applied).
	clean bool
	// first is the offset of the first message read; -1 when none was.
	first int64
	// member is the worker's partitionWorker.member.
	member string
}

// route returns the queue of an owned partition, or nil.
func (d *Daemon) route(topic string, partition int32) *partitionQueue {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if w := d.parts[topicPartition{topic, int(partition)}]; w != nil {
		return w.q
	}
	return nil
}

// assigned starts a worker per newly assigned partition. It runs in the
// client's group management goroutine, before fetching of the partitions
// starts.
func (d *Daemon) assigned(ctx context.Context, cl *kgo.Client, assigned map[string][]int32) {
	d.m.generations.Inc()
	d.learnPartitionCounts(ctx, cl)
	// New workers wait for the first acknowledged heartbeat of this
	// membership before they write: ask for one now.
	member, _ := cl.GroupMetadata()
	signal(d.pokeLease)
	assigned = d.restartExpired(ctx, cl, member, assigned)
	n := 0
	d.mu.Lock()
	for topic, parts := range assigned {
		for _, p := range parts {
			tp := topicPartition{topic, int(p)}
			if d.parts[tp] != nil {
				continue
			}
			one := map[string][]int32{topic: {p}}
			w := &partitionWorker{
				q: newPartitionQueue(topic, int(p),
					func() { cl.PauseFetchPartitions(one) },
					func() { cl.ResumeFetchPartitions(one) }),
				done:   make(chan struct{}),
				member: member,
			}
			w.progress.reset()
			d.parts[tp] = w
			n++
			abandonCtx, abandon := context.WithCancel(d.workCtx)
			releaseCtx, release := context.WithCancel(abandonCtx)
			w.release, w.abandon = release, abandon
			go func() {
				defer close(w.done)
				w.result = d.consumePartition(abandonCtx, releaseCtx, tp, w)
			}()
		}
	}
	total := len(d.parts)
	d.mu.Unlock()
	d.m.assigned.Set(float64(total))
	d.updateReady()
	d.log.Info("partitions assigned", "group", d.cfg.Group, "added", assigned, "owned", total)
}

// restartExpired restarts the partitions the client kept across a join as
// another member: after the coordinator forgot the member (its session
// expired), franz-go joins again without a member ID and keeps consuming
// the partitions it held, from where it was. Their workers belong to the
// expired membership: another member may have consumed the partitions
// meanwhile and committed past them. So each is stopped like a lost
// partition (nothing committed), the client is rewound to the group's
// committed offset, and a new worker starts there as after a crash
// (recounting first). It returns assigned with those partitions added.
// It runs in assigned, after the revokes of the new generation.
func (d *Daemon) restartExpired(ctx context.Context, cl *kgo.Client, member string, assigned map[string][]int32) map[string][]int32 {
	d.mu.RLock()
	var expired []topicPartition
	for tp, w := range d.parts {
		if w.member != member {
			expired = append(expired, tp)
		}
	}
	d.mu.RUnlock()
	if len(expired) == 0 {
		return assigned
	}
	results := d.stopPartitions(expired, false)
	fctx, cancel := context.WithTimeout(ctx, d.cfg.HandoffTimeout)
	offsets, err := kadm.NewClient(cl).FetchOffsets(fctx, d.cfg.Group)
	cancel()
	if err == nil {
		err = offsets.Error()
	}
	out := make(map[string][]int32, len(assigned)+1)
	for t, ps := range assigned {
		out[t] = append([]int32(nil), ps...)
	}
	rewind := make(map[string]map[int32]kgo.EpochOffset)
	for _, tp := range expired {
		at := results[tp].first
		if err == nil {
			if o, ok := offsets.Lookup(tp.topic, int32(tp.partition)); ok && o.Err == nil && o.At >= 0 {
				at = o.At
				d.mu.Lock()
				d.committed[tp] = committedOffset{offset: at} // never a clean handoff
				d.mu.Unlock()
			}
		}
		d.log.Warn("partition kept across a join as a new member: restarting it from its committed offset, recounting first",
			"topic", tp.topic, "partition", tp.partition, "offset", at, "expired_member", results[tp].member, "member", member)
		if at >= 0 {
			if rewind[tp.topic] == nil {
				rewind[tp.topic] = make(map[int32]kgo.EpochOffset)
			}
			rewind[tp.topic][int32(tp.partition)] = kgo.EpochOffset{Epoch: -1, Offset: at}
		}
		out[tp.topic] = append(out[tp.topic], int32(tp.partition))
	}
	if err != nil {
		d.log.Warn("consumer: reading the group's committed offsets failed; restarting kept partitions where their workers started", "error", err.Error())
	}
	cl.SetOffsets(rewind)
	return out
}

// learnPartitionCounts tells the pipeline how many partitions the topics
// have (see orderGuard); on failure it keeps what it knew.
func (d *Daemon) learnPartitionCounts(ctx context.Context, cl *kgo.Client) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	topics, err := kadm.NewClient(cl).ListTopics(ctx, d.cfg.Topics...)
	if err != nil {
		d.log.Warn("consumer: reading the topics' partition counts failed", "error", err.Error())
		return
	}
	counts := make(map[string]int, len(topics))
	for name, t := range topics {
		if t.Err == nil {
			counts[name] = len(t.Partitions)
		}
	}
	d.p.SetPartitionCounts(counts)
}

// offsetsFetched records the committed offsets of newly assigned
// partitions and whether their previous owners handed them off cleanly.
// It runs after assigned, before fetching starts.
func (d *Daemon) offsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	found := committedOffsets(resp)
	d.mu.Lock()
	for tp, c := range found {
		d.committed[tp] = c
	}
	d.mu.Unlock()
	return nil
}

// committedOffset returns the offset partition tp was found at when it
// was assigned; ok false when it had none.
func (d *Daemon) committedOffset(tp topicPartition) (committedOffset, bool) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	c, ok := d.committed[tp]
	return c, ok
}

// revoked releases partitions cleanly: each worker finishes the batch it
// is applying (up to HandoffTimeout), then the applied offsets are
// committed, marked as handed off when nothing past them was applied. It
// runs in the client's group management goroutine; the group waits for
// it (within the rebalance timeout) before the partitions move.
func (d *Daemon) revoked(_ context.Context, cl *kgo.Client, revoked map[string][]int32) {
	d.handOver(cl, revoked, true)
}

// lost stops partitions the member no longer owns (its session expired,
// or the group fenced it): their batches are abandoned and nothing is
// committed, since the next owner may be consuming them already.
func (d *Daemon) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	d.handOver(cl, lost, false)
}

func (d *Daemon) handOver(cl *kgo.Client, parts map[string][]int32, graceful bool) {
	var tps []topicPartition
	for topic, ps := range parts {
		for _, p := range ps {
			tps = append(tps, topicPartition{topic, int(p)})
		}
	}
	results := d.stopPartitions(tps, graceful)
	if graceful {
		d.commitHandoffs(cl, results)
	}
	// Paused partitions stay paused across assignments in the client:
	// resume them for whichever member gets them next time.
	cl.ResumeFetchPartitions(parts)
	d.mu.RLock()
	total := len(d.parts)
	d.mu.RUnlock()
	d.m.assigned.Set(float64(total))
	d.updateReady()
	if len(tps) > 0 {
		d.log.Info("partitions released", "group", d.cfg.Group, "released", parts, "graceful", graceful, "owned", total)
	}
}

// ownedPartitions lists the partitions with a worker.
func (d *Daemon) ownedPartitions() []topicPartition {
	d.mu.RLock()
	defer d.mu.RUnlock()
	out := make([]topicPartition, 0, len(d.parts))
	for tp := range d.parts {
		out = append(out, tp)
	}
	return out
}

// stopPartitions stops the workers of tps and returns what they applied.
// graceful lets each finish the batch it is applying, up to
// HandoffTimeout, before it is abandoned.
func (d *Daemon) stopPartitions(tps []topicPartition, graceful bool) map[topicPartition]partitionResult {
	d.mu.Lock()
	workers := make(map[topicPartition]*partitionWorker, len(tps))
	for _, tp := range tps {
		if w := d.parts[tp]; w != nil {
			workers[tp] = w
			delete(d.parts, tp)
		}
		// The next assignment reads the partition's commit afresh.
		delete(d.committed, tp)
	}
	d.mu.Unlock()
	deadline := time.NewTimer(d.cfg.HandoffTimeout)
	defer deadline.Stop()
	for _, w := range workers {
		if graceful {
			w.release()
		} else {
			w.abandon()
		}
	}
	results := make(map[topicPartition]partitionResult, len(workers))
	for tp, w := range workers {
		select {
		case <-w.done:
		case <-deadline.C:
			d.log.Warn("partition did not finish its batch in time; abandoning it", "topic", tp.topic, "partition", tp.partition,
				"handoff_timeout", d.cfg.HandoffTimeout)
			for _, w := range workers {
				w.abandon()
			}
			<-w.done
		}
		w.abandon()
		r := w.result
		r.member = w.member
		results[tp] = r
		d.m.forgetPartition(tp.topic, tp.partition)
	}
	return results
}

// commitHandoffs commits the released partitions' applied offsets, with
// the handoff marker where nothing past them was applied. A partition
// held under a membership whose lease does not hold (memberLease: the
// session may have expired, or the client joined again as another member)
// is treated as lost: another member may have consumed it and committed
// past it, so nothing is committed. Nor is an offset below the group's
// current commit of the partition: a commit never goes backwards.
func (d *Daemon) commitHandoffs(cl *kgo.Client, results map[topicPartition]partitionResult) {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.HandoffTimeout)
	defer cancel()
	now := time.Now()
	commit := make(map[topicPartition]partitionResult, len(results))
	for tp, r := range results {
		if r.next < 0 {
			continue // nothing applied: the previous commit stands
		}
		if err := d.lease.check(r.member, now); err != nil {
			d.m.handoffs.WithLabelValues("lost").Inc()
			d.log.Warn("released partition not committed: it was held under a membership that may have expired; its next owner recounts",
				"topic", tp.topic, "partition", tp.partition, "offset", r.next, "reason", err.Error())
			continue
		}
		commit[tp] = r
	}
	if len(commit) == 0 {
		return
	}
	current, err := kadm.NewClient(cl).FetchOffsets(ctx, d.cfg.Group)
	if err == nil {
		err = current.Error()
	}
	if err != nil {
		d.log.Warn("reading the group's committed offsets before a handoff failed; not committing the released partitions, their next owners recount",
			"error", err.Error())
		return
	}
	var wg sync.WaitGroup
	for tp, r := range commit {
		if o, ok := current.Lookup(tp.topic, int32(tp.partition)); ok && o.Err == nil && o.At > r.next {
			d.m.handoffs.WithLabelValues("lost").Inc()
			d.log.Warn("released partition not committed: the group's commit is past what was applied here",
				"topic", tp.topic, "partition", tp.partition, "offset", r.next, "committed", o.At)
			continue
		}
		meta := commitConsuming
		if r.clean {
			meta = commitHandedOff
		}
		wg.Go(func() {
			if err := d.committer.commit(ctx, tp.topic, tp.partition, r.next, meta); err != nil {
				d.log.Warn("committing a released partition failed; its next owner recounts", "topic", tp.topic,
					"partition", tp.partition, "offset", r.next, "error", err.Error())
				return
			}
			if r.clean {
				d.m.handoffs.WithLabelValues("clean").Inc()
			} else {
				d.m.handoffs.WithLabelValues("abandoned").Inc()
			}
		})
	}
	wg.Wait()
}

func (d *Daemon) updateReady() {
	boolGauge(d.m.groupJoined, d.joined())
	boolGauge(d.m.ready, d.Ready())
}

// healthLoop pings memcached every ReadyInterval until ctx ends, and
// updates the stalled-partition gauges.
func (d *Daemon) healthLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.ReadyInterval)
	defer t.Stop()
	for first := true; ; first = false {
		err := d.health.Ping()
		up := err == nil
		if !up {
			d.health.Close()
		}
		if was := d.memcachedUp.Swap(up); was != up || first {
			if up {
				d.log.Info("memcached reachable")
			} else {
				d.log.Warn("memcached unreachable; not ready", "error", err.Error())
			}
		}
		boolGauge(d.m.memcachedUp, up)
		if age, ok := d.lease.age(time.Now()); ok {
			d.m.leaseAge.Set(age.Seconds())
		}
		d.reportStalled()
		d.updateReady()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
