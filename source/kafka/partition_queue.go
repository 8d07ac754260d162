package kafka

import (
	"context"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules"
)

// queueLimitBytes is how many bytes of fetched messages (keys and
// values) may wait for one partition's batcher before fetching of that
// partition pauses; it resumes once the batcher has taken them. It is two
// of the partition's shares of a fetch response: a response fits before
// the partition pauses, so a partition is paused only when its batcher
// really falls behind. (Pausing drops what the client fetched of the
// partition meanwhile, to be fetched again: a limit below a response's
// worth paused every partition after every fetch.) Waiting messages keep
// whole fetch responses in memory, each shared by several partitions: four
// shares raised the daemon's peak RSS by a quarter without a faster rate
// (docs/benchmarks.md). With the records of the response in flight, at
// most about this many bytes and one share more wait per partition.
const queueLimitBytes = 2 * fetchMaxPartitionBytes

// partitionQueue carries one partition's fetched messages from the
// client's poll loop to the partition's batcher. The poll loop pushes;
// the batcher takes everything waiting at once. When more than queueLimitBytes
// of messages wait, the partition's fetching is paused (the client stops
// fetching it and drops what it buffered for it, to fetch it again from
// the same offset once resumed), so that one slow partition holds back
// neither the others nor memory.
//
// Its methods are safe for concurrent use.
type partitionQueue struct {
	topic     string
	partition int
	// pause and resume stop and restart fetching of the partition; nil
	// when nothing can be paused.
	pause, resume func()

	// ready is signalled (capacity 1) when messages or an error arrive.
	ready chan struct{}

	mu     sync.Mutex
	msgs   []pipeline.Message
	spare  []pipeline.Message
	bytes  int   // keys and values of msgs
	stable int64 // last stable offset of the latest fetch; -1 unknown
	// logStart is the log start offset of the latest fetch: records
	// before it were removed (retention); -1 unknown.
	logStart int64
	err      error // a fetch error for the partition, reported once
	paused   bool
}

func newPartitionQueue(topic string, partition int, pause, resume func()) *partitionQueue {
	return &partitionQueue{
		topic: topic, partition: partition, pause: pause, resume: resume,
		ready: make(chan struct{}, 1), stable: -1, logStart: -1,
	}
}

// push appends the records of one fetch of the partition; stable and
// logStart are the fetch's last stable and log start offsets (-1 when
// unknown).
func (q *partitionQueue) push(recs []*kgo.Record, stable, logStart int64) {
	fetched := time.Now()
	q.mu.Lock()
	for _, r := range recs {
		q.msgs = append(q.msgs, messageFromRecord(r, fetched))
		q.bytes += len(r.Key) + len(r.Value)
	}
	if stable >= 0 {
		q.stable = stable
	}
	if logStart >= 0 {
		q.logStart = logStart
	}
	if q.bytes > queueLimitBytes && !q.paused && q.pause != nil {
		q.paused = true
		q.pause()
	}
	q.mu.Unlock()
	signal(q.ready)
}

// pushMessage appends one message that stands for records the client
// could not hand over (oversizedMessage).
func (q *partitionQueue) pushMessage(m pipeline.Message) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	signal(q.ready)
}

// fail reports a fetch error of the partition to its batcher.
func (q *partitionQueue) fail(err error) {
	q.mu.Lock()
	if q.err == nil {
		q.err = err
	}
	q.mu.Unlock()
	signal(q.ready)
}

// take returns every waiting message (nil when none) and the error
// reported meanwhile; given is the slice take returned last time, whose
// messages the caller has copied out, for reuse. It resumes a paused
// partition.
func (q *partitionQueue) take(given []pipeline.Message) (msgs []pipeline.Message, stable, logStart int64, err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if given != nil && cap(given) > cap(q.spare) {
		// Do not pin message values. Beyond len(given) nothing was
		// written since the slice was last cleared (push only appends):
		// clearing its whole capacity would cost as much for a few
		// messages as for a backlog's worth.
		clear(given)
		q.spare = given[:0]
	}
	msgs, err = q.msgs, q.err
	q.err = nil
	if len(msgs) == 0 {
		msgs = nil
	} else {
		q.msgs, q.spare = q.spare, nil
		q.bytes = 0
	}
	if q.paused {
		q.paused = false
		q.resume()
	}
	return msgs, q.stable, q.logStart, err
}

// waiting reports whether messages or an error wait to be taken.
func (q *partitionQueue) waiting() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.msgs) > 0 || q.err != nil
}

// messageFromRecord converts a record fetched at fetched; the message
// shares the record's key, value and headers.
func messageFromRecord(r *kgo.Record, fetched time.Time) pipeline.Message {
	return pipeline.Message{
		Key:     r.Key,
		Value:   r.Value,
		Headers: messageHeaders(r.Headers),
		Time:    r.Timestamp,
		Fetched: fetched,
		Pos:     rules.Position{Topic: r.Topic, Partition: int(r.Partition), Offset: r.Offset},
	}
}

// batchSource is a batcher's side of a partitionQueue: the messages it
// took and has not put in a batch yet.
type batchSource struct {
	q       *partitionQueue
	pending []pipeline.Message // the rest of taken
	taken   []pipeline.Message // the slice pending is part of
	// stable is the last stable offset of the latest fetch: the offset
	// after the partition's last committed record then.
	stable int64
	// logStart is the log start offset of the latest fetch.
	logStart int64
}

// receive waits until messages arrive, ctx ends or, with a non-nil
// timer, the timer fires (ok false, err nil). A fetch error of the
// partition is returned as err.
func (s *batchSource) receive(ctx context.Context, timer <-chan time.Time) (ok bool, err error) {
	for {
		msgs, stable, logStart, err := s.q.take(s.taken)
		s.taken = nil
		s.stable, s.logStart = stable, logStart
		if err != nil {
			return false, err
		}
		if msgs != nil {
			s.taken, s.pending = msgs, msgs
			return true, nil
		}
		select {
		case <-s.q.ready:
		case <-timer:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

// more reports whether messages wait in the queue beyond pending.
func (s *batchSource) more() bool { return s.q.waiting() }

// take appends up to max pending messages to msgs; with stopAtEnd it
// stops after a message that was the partition's last committed one when
// fetched, and reports that it did.
func (s *batchSource) take(msgs []pipeline.Message, max int, stopAtEnd bool) ([]pipeline.Message, bool) {
	n := min(len(s.pending), max)
	if stopAtEnd && s.stable > 0 {
		for i := range n {
			if s.pending[i].Pos.Offset+1 >= s.stable {
				msgs = append(msgs, s.pending[:i+1]...)
				s.pending = s.pending[i+1:]
				return msgs, true
			}
		}
	}
	msgs = append(msgs, s.pending[:n]...)
	s.pending = s.pending[n:]
	return msgs, false
}

// takeBefore appends up to max pending messages with offsets before end
// to msgs; atEnd reports that every message before end has been taken (a
// message at or past end was reached, or the one at end-1 taken).
func (s *batchSource) takeBefore(msgs []pipeline.Message, max int, end int64) (_ []pipeline.Message, atEnd bool) {
	n := min(len(s.pending), max)
	for i := range n {
		if s.pending[i].Pos.Offset >= end {
			msgs = append(msgs, s.pending[:i]...)
			s.pending = s.pending[i:]
			return msgs, true
		}
	}
	msgs = append(msgs, s.pending[:n]...)
	s.pending = s.pending[n:]
	return msgs, n > 0 && msgs[len(msgs)-1].Pos.Offset+1 >= end
}

// messageHeaders returns a record's headers as a message's (sharing
// their values); nil when there are none, which costs nothing.
func messageHeaders(hs []kgo.RecordHeader) []pipeline.Header {
	if len(hs) == 0 {
		return nil
	}
	out := make([]pipeline.Header, len(hs))
	for i, h := range hs {
		out[i] = pipeline.Header{Key: h.Key, Value: h.Value}
	}
	return out
}

// recordHeaders returns a message's headers as a record's (sharing their
// values), with room for extra more.
func recordHeaders(hs []pipeline.Header, extra int) []kgo.RecordHeader {
	out := make([]kgo.RecordHeader, len(hs), len(hs)+extra)
	for i, h := range hs {
		out[i] = kgo.RecordHeader{Key: h.Key, Value: h.Value}
	}
	return out
}
