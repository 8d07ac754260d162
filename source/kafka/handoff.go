package kafka

// The Daemon's side of group membership: the partitions the group assigns
// it get a worker each (assigned), and on a rebalance, a lost session or
// shutdown they are handed over: stopped after the batch in flight, and
// their applied offsets committed with the handoff marker (handOver,
// commitHandoffs).

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

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
	offsets, err := d.groupCommits(fctx, cl)
	cancel()
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
		d.log.Warn("kafka: reading the group's committed offsets failed; restarting kept partitions where their workers started", "error", err.Error())
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
		d.log.Warn("kafka: reading the topics' partition counts failed", "error", err.Error())
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
	current, err := d.groupCommits(ctx, cl)
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

// groupCommits reads the offsets the group has committed; an error of any
// partition fails the whole read.
func (d *Daemon) groupCommits(ctx context.Context, cl *kgo.Client) (kadm.OffsetResponses, error) {
	offsets, err := kadm.NewClient(cl).FetchOffsets(ctx, d.cfg.Group)
	if err == nil {
		err = offsets.Error()
	}
	return offsets, err
}
