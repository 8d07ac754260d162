package kafka

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Commit metadata: every offset the daemon commits names the state its
// owner left the partition in, so that the next owner can tell a clean
// handoff from a crash (docs/operations.md, "Handoffs").
const (
	// commitConsuming marks a commit made while the owner kept applying
	// messages: after a crash, messages past the offset may have been
	// applied already, and the next owner turns the counter deltas of
	// its first batch into recounts.
	commitConsuming = "cachewarden:consuming"
	// commitHandedOff marks an owner's last commit when it released the
	// partition after applying exactly the messages before the offset
	// and nothing after: the next owner applies counter deltas as they
	// come.
	commitHandedOff = "cachewarden:handed-off"
)

// groupCommitter commits the offsets of every partition of a consumer
// group member, with their metadata, in one request per round: the
// partitions' commits wait for the round in flight and then go together.
// Its methods are safe for concurrent use; run works in a goroutine of its
// own.
type groupCommitter struct {
	cl *kgo.Client
	m  *Metrics

	wake chan struct{}

	mu   sync.Mutex
	want map[topicPartition]*commitWant
}

// commitWant is the latest offset asked for one partition and who waits
// for it.
type commitWant struct {
	offset  int64
	meta    string
	waiters []chan error
}

func newGroupCommitter(cl *kgo.Client, m *Metrics) *groupCommitter {
	return &groupCommitter{cl: cl, m: m, wake: make(chan struct{}, 1), want: make(map[topicPartition]*commitWant)}
}

// commit commits next as the partition's offset with meta (commitConsuming
// or commitHandedOff) and returns when the brokers answered or ctx ended.
// Commits of one partition must be asked in offset order; a later ask
// before the round replaces an earlier one.
func (g *groupCommitter) commit(ctx context.Context, topic string, partition int, next int64, meta string) error {
	done := make(chan error, 1)
	tp := topicPartition{topic, partition}
	g.mu.Lock()
	w := g.want[tp]
	if w == nil {
		w = &commitWant{}
		g.want[tp] = w
	}
	w.offset, w.meta = next, meta
	w.waiters = append(w.waiters, done)
	g.mu.Unlock()
	signal(g.wake)
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// run sends the rounds until ctx ends.
func (g *groupCommitter) run(ctx context.Context) {
	for {
		select {
		case <-g.wake:
		case <-ctx.Done():
			return
		}
		g.mu.Lock()
		round := g.want
		g.want = make(map[topicPartition]*commitWant, len(round))
		g.mu.Unlock()
		if len(round) == 0 {
			continue
		}
		errs := g.send(ctx, round)
		for tp, w := range round {
			for _, ch := range w.waiters {
				ch <- errs[tp]
			}
		}
	}
}

// send commits one round and returns each partition's error.
func (g *groupCommitter) send(ctx context.Context, round map[topicPartition]*commitWant) map[topicPartition]error {
	offsets := make(map[string]map[int32]kgo.EpochOffset)
	for tp, w := range round {
		if offsets[tp.topic] == nil {
			offsets[tp.topic] = make(map[int32]kgo.EpochOffset)
		}
		offsets[tp.topic][int32(tp.partition)] = kgo.EpochOffset{Epoch: -1, Offset: w.offset}
	}
	cctx := kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				p := &t.Partitions[j]
				if w := round[topicPartition{t.Topic, int(p.Partition)}]; w != nil {
					meta := w.meta
					p.Metadata = &meta
				}
			}
		}
		return nil
	})
	errs := make(map[topicPartition]error, len(round))
	start := time.Now()
	var reqErr error
	g.cl.CommitOffsetsSync(cctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, err error) {
		if err != nil {
			reqErr = err
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
					errs[topicPartition{t.Topic, int(p.Partition)}] = err
				}
			}
		}
	})
	g.m.commitDuration.Observe(time.Since(start).Seconds())
	for tp := range round {
		if reqErr != nil {
			errs[tp] = reqErr
		}
		if errs[tp] != nil {
			g.m.commits.WithLabelValues("error").Inc()
		} else {
			g.m.commits.WithLabelValues("ok").Inc()
		}
	}
	return errs
}

// offsetCommitter commits a partition's applied offsets in the
// background: one commit at a time, each for the latest offset applied
// when it starts. A failed commit is retried with backoff (during a
// rebalance the coordinator refuses commits until the group is stable
// again; a member that lost the partition is stopped by its release
// instead). Its methods are safe for concurrent use; run runs in a
// goroutine of its own.
type offsetCommitter struct {
	commit func(next int64) error
	// failed is told of each failed attempt (1-based); may be nil.
	failed func(err error, attempt int)
	// backoff is the pause after failed attempt n; default commitBackoff.
	backoff func(attempt int) time.Duration
	// wake is signalled when want grows; acked when committed grows.
	wake, acked chan struct{}

	mu        sync.Mutex
	want      int64 // offset after the last applied message
	committed int64 // offset after the last committed message
}

// Commit retry backoff: doubling from commitBackoffMin up to
// commitBackoffMax.
const (
	commitBackoffMin = 100 * time.Millisecond
	commitBackoffMax = 5 * time.Second
)

func commitBackoff(attempt int) time.Duration {
	return min(commitBackoffMin<<min(attempt-1, 16), commitBackoffMax)
}

func newOffsetCommitter(commit func(next int64) error, failed func(err error, attempt int)) *offsetCommitter {
	return &offsetCommitter{commit: commit, failed: failed, backoff: commitBackoff,
		wake: make(chan struct{}, 1), acked: make(chan struct{}, 1)}
}

// begin sets the offset the partition starts from (the first message
// read), which counts as committed.
func (c *offsetCommitter) begin(offset int64) {
	c.mu.Lock()
	c.want, c.committed = offset, offset
	c.mu.Unlock()
}

// applied records that the messages before next are applied.
func (c *offsetCommitter) applied(next int64) {
	c.mu.Lock()
	c.want = next
	c.mu.Unlock()
	signal(c.wake)
}

// room waits until fewer than limit offsets are applied and uncommitted
// and returns how many more messages may be applied (offsets missing from
// the log count too, so it errs on the safe side). It returns ctx's error
// when ctx ends first.
func (c *offsetCommitter) room(ctx context.Context, limit int) (int, error) {
	for {
		c.mu.Lock()
		n := limit - int(c.want-c.committed)
		c.mu.Unlock()
		if n > 0 {
			return n, nil
		}
		select {
		case <-c.acked:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// run commits until ctx ends.
func (c *offsetCommitter) run(ctx context.Context) {
	failures := 0
	for {
		select {
		case <-c.wake:
		case <-ctx.Done():
			return
		}
		c.mu.Lock()
		want, done := c.want, c.committed
		c.mu.Unlock()
		if want <= done {
			continue
		}
		if err := c.commit(want); err != nil {
			if ctx.Err() != nil {
				return // stopping: the owner's last commit follows
			}
			failures++
			if c.failed != nil {
				c.failed(fmt.Errorf("offset %d: %w", want, err), failures)
			}
			if retry.Sleep(ctx, c.backoff(failures)) != nil {
				return
			}
			signal(c.wake) // try again
			continue
		}
		failures = 0
		c.mu.Lock()
		c.committed = want
		c.mu.Unlock()
		signal(c.acked)
		signal(c.wake) // more may have been applied meanwhile
	}
}

// signal wakes the receiver of ch (capacity 1) without blocking.
func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// committedOffsets reads the partitions' committed offsets and whether
// their last owner handed them off cleanly from an OffsetFetch response
// (a group's own, or the first group's from a version 8+ response).
func committedOffsets(resp *kmsg.OffsetFetchResponse) map[topicPartition]committedOffset {
	out := make(map[topicPartition]committedOffset)
	add := func(topic string, partition int32, offset int64, meta *string, code int16) {
		if code != 0 || offset < 0 {
			return
		}
		out[topicPartition{topic, int(partition)}] = committedOffset{
			offset: offset, handedOff: meta != nil && *meta == commitHandedOff,
		}
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			add(t.Topic, p.Partition, p.Offset, p.Metadata, p.ErrorCode)
		}
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				add(t.Topic, p.Partition, p.Offset, p.Metadata, p.ErrorCode)
			}
		}
	}
	return out
}

// committedOffset is a partition's committed offset as a new owner finds
// it.
type committedOffset struct {
	offset int64
	// handedOff: the previous owner applied exactly the messages before
	// offset (commitHandedOff).
	handedOff bool
}
