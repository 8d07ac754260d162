package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// PartitionOffset is an offset of one partition, written
// topic:partition:offset.
type PartitionOffset struct {
	Topic     string
	Partition int
	Offset    int64
}

func (po PartitionOffset) String() string {
	return po.Topic + ":" + strconv.Itoa(po.Partition) + ":" + strconv.FormatInt(po.Offset, 10)
}

// ReplayBound is where a replay starts (--from) or ends (--to). At most
// one of its fields is set; the zero ReplayBound means "not given".
type ReplayBound struct {
	// Earliest means each partition's first retained offset.
	Earliest bool
	// Time, when not zero, means in each partition the first record
	// whose timestamp is at or after Time.
	Time time.Time
	// Offsets are offsets of single partitions. A start bound lists the
	// partitions to replay (others are not replayed); an end bound ends
	// the listed partitions there (others end at their end offset).
	Offsets []PartitionOffset
}

// IsZero reports whether no bound was given.
func (b ReplayBound) IsZero() bool {
	return !b.Earliest && b.Time.IsZero() && len(b.Offsets) == 0
}

func (b ReplayBound) String() string {
	switch {
	case b.Earliest:
		return "earliest"
	case !b.Time.IsZero():
		return b.Time.Format(time.RFC3339Nano)
	}
	parts := make([]string, len(b.Offsets))
	for i, po := range b.Offsets {
		parts[i] = po.String()
	}
	return strings.Join(parts, ",")
}

// ParseReplayBound parses a --from or --to value: "earliest", an RFC 3339
// time (2026-05-01T12:00:00Z, 2026-05-01T14:00:00.5+02:00), or a comma
// separated list of topic:partition:offset (cdc.users:0:1200,cdc.users:1:950)
// naming each partition at most once.
func ParseReplayBound(s string) (ReplayBound, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return ReplayBound{}, errors.New("empty; want earliest, an RFC 3339 time or topic:partition:offset,...")
	}
	if s == "earliest" {
		return ReplayBound{Earliest: true}, nil
	}
	t, timeErr := time.Parse(time.RFC3339Nano, s)
	if timeErr == nil {
		return ReplayBound{Time: t}, nil
	}
	offsets, err := parsePartitionOffsets(s)
	if err == nil {
		return ReplayBound{Offsets: offsets}, nil
	}
	if looksLikeDate(s) {
		return ReplayBound{}, fmt.Errorf("%q is not an RFC 3339 time such as 2026-05-01T12:00:00Z", s)
	}
	return ReplayBound{}, err
}

// looksLikeDate reports whether s starts like a date (2026-), so that a
// malformed time gets a message about times rather than offsets.
func looksLikeDate(s string) bool {
	if len(s) < 5 || s[4] != '-' {
		return false
	}
	for _, c := range s[:4] {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

func parsePartitionOffsets(s string) ([]PartitionOffset, error) {
	var out []PartitionOffset
	seen := make(map[topicPartition]bool)
	for item := range strings.SplitSeq(s, ",") {
		item = strings.TrimSpace(item)
		rest, offStr, ok1 := cutLast(item, ':')
		topic, partStr, ok2 := cutLast(rest, ':')
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("%q: want topic:partition:offset", item)
		}
		if err := checkTopic(topic); err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		part, err := strconv.Atoi(partStr)
		if err != nil || part < 0 || part > math.MaxInt32 {
			return nil, fmt.Errorf("%q: partition %q is not a partition number", item, partStr)
		}
		off, err := strconv.ParseInt(offStr, 10, 64)
		if err != nil || off < 0 {
			return nil, fmt.Errorf("%q: offset %q is not an offset (a number from 0)", item, offStr)
		}
		tp := topicPartition{topic, part}
		if seen[tp] {
			return nil, fmt.Errorf("%s:%d is listed twice", topic, part)
		}
		seen[tp] = true
		out = append(out, PartitionOffset{Topic: topic, Partition: part, Offset: off})
	}
	return out, nil
}

func cutLast(s string, sep byte) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, sep)
	if i < 0 {
		return s, "", false
	}
	return s[:i], s[i+1:], true
}

// checkTopic checks a Kafka topic name: 1 to 249 of [a-zA-Z0-9._-].
func checkTopic(t string) error {
	if t == "" || len(t) > 249 {
		return fmt.Errorf("topic name %q must have 1 to 249 characters", t)
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("topic name %q: only letters, digits, '.', '_' and '-' are allowed", t)
		}
	}
	return nil
}

type topicPartition struct {
	topic     string
	partition int
}

// PartitionRange is the part of one partition a replay reads: offsets
// Start (included) to End (excluded).
type PartitionRange struct {
	Topic     string
	Partition int
	Start     int64
	End       int64
}

// Len returns the number of offsets in the range.
func (r PartitionRange) Len() int64 { return max(r.End-r.Start, 0) }

func (r PartitionRange) String() string {
	return fmt.Sprintf("%s:%d:[%d,%d)", r.Topic, r.Partition, r.Start, r.End)
}

// partitionOffsets are what the brokers said about one partition.
type partitionOffsets struct {
	// first is the log start offset, end the last stable offset (the
	// offset after the last committed record).
	first, end int64
	// fromAt and toAt are the offsets found for the bounds' times; -1
	// when no record is that recent.
	fromAt, toAt int64
}

// ResolveReplayRanges asks the brokers which partitions to read and from
// where to where, and returns one range per partition, sorted by topic and
// partition, leaving out empty ones.
//
// topics are the topics to replay; when empty, the topics named in
// from.Offsets (which must then be given). from.Offsets lists the only
// partitions replayed; otherwise every partition of topics is. from
// selects each partition's start (required); to its end, default the end
// offset the partition has now, so a replay never waits for new messages.
// Time bounds select the first record at or after the time, so a replay
// from T1 to T2 reads the records stamped [T1, T2). A start before the log
// start offset (records removed by retention) starts at the log start
// offset; an end beyond the end offset ends there; both are logged.
func ResolveReplayRanges(ctx context.Context, conn KafkaConn, topics []string, from, to ReplayBound, logger *slog.Logger) ([]PartitionRange, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	topics, err := replayTopics(topics, from, to)
	if err != nil {
		return nil, err
	}
	cl, err := conn.NewClient(logger)
	if err != nil {
		return nil, fmt.Errorf("kafka: replay: %w", err)
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	all, err := topicPartitions(ctx, cl, adm, topics)
	if err != nil {
		return nil, err
	}
	parts, err := replayPartitions(all, topics, from, to)
	if err != nil {
		return nil, err
	}
	offs, err := listPartitionOffsets(ctx, adm, parts, from.Time, to.Time)
	if err != nil {
		return nil, err
	}
	var ranges []PartitionRange
	for _, tp := range parts {
		o := offs[tp]
		r, notes := replayRange(tp, o, from, to)
		for _, n := range notes {
			logger.Warn(n, "topic", tp.topic, "partition", tp.partition, "log_start", o.first, "end", o.end)
		}
		if r.Len() > 0 {
			ranges = append(ranges, r)
		}
	}
	return ranges, nil
}

// replayTopics checks the bounds and returns the topics to replay: topics,
// or when none is given those the start's offsets name.
func replayTopics(topics []string, from, to ReplayBound) ([]string, error) {
	if from.IsZero() {
		return nil, errors.New("kafka: replay: no start given")
	}
	if to.Earliest {
		return nil, errors.New("kafka: replay: \"earliest\" is not an end")
	}
	if len(topics) == 0 {
		for _, po := range from.Offsets {
			if !slices.Contains(topics, po.Topic) {
				topics = append(topics, po.Topic)
			}
		}
		if len(topics) == 0 {
			return nil, errors.New("kafka: replay: no topics")
		}
	}
	return topics, nil
}

// topicPartitions returns every partition of topics, which must all
// exist; a refusal of the credentials is named in the error.
func topicPartitions(ctx context.Context, cl *kgo.Client, adm *kadm.Client, topics []string) ([]topicPartition, error) {
	meta, err := adm.ListTopics(ctx, topics...)
	if err != nil {
		if auth := clientHook[*kafkaAuth](cl); auth != nil {
			auth.probeAuth(ctx, cl)
			if f := auth.Failure(); f != "" {
				return nil, fmt.Errorf("kafka: replay: read topic metadata: %w (%s)", err, f)
			}
		}
		return nil, fmt.Errorf("kafka: replay: read topic metadata: %w", err)
	}
	var all []topicPartition
	for _, t := range topics {
		td, ok := meta[t]
		if !ok || errors.Is(td.Err, kerr.UnknownTopicOrPartition) {
			return nil, fmt.Errorf("kafka: replay: topic %s does not exist", t)
		}
		if td.Err != nil {
			return nil, fmt.Errorf("kafka: replay: topic %s: %w", t, td.Err)
		}
		for p := range td.Partitions {
			all = append(all, topicPartition{t, int(p)})
		}
	}
	return all, nil
}

// replayPartitions returns the partitions to replay, sorted: those the
// start's offsets name, else all; every partition the bounds name must be
// one of all, of a replayed topic, and the end may name only partitions
// the start lists.
func replayPartitions(all []topicPartition, topics []string, from, to ReplayBound) ([]topicPartition, error) {
	check := func(flag string, offs []PartitionOffset) error {
		for _, po := range offs {
			if !slices.Contains(topics, po.Topic) {
				return fmt.Errorf("kafka: replay: %s names topic %s, which is not replayed (topics: %s)", flag, po.Topic, strings.Join(topics, ","))
			}
			if !slices.Contains(all, topicPartition{po.Topic, po.Partition}) {
				return fmt.Errorf("kafka: replay: %s names %s:%d, which does not exist", flag, po.Topic, po.Partition)
			}
		}
		return nil
	}
	if err := check("the start", from.Offsets); err != nil {
		return nil, err
	}
	if err := check("the end", to.Offsets); err != nil {
		return nil, err
	}
	parts := all
	if len(from.Offsets) > 0 {
		parts = parts[:0:0]
		for _, po := range from.Offsets {
			parts = append(parts, topicPartition{po.Topic, po.Partition})
		}
		for _, po := range to.Offsets {
			if !slices.Contains(parts, topicPartition{po.Topic, po.Partition}) {
				return nil, fmt.Errorf("kafka: replay: the end names %s:%d, which the start does not list", po.Topic, po.Partition)
			}
		}
	}
	slices.SortFunc(parts, func(a, b topicPartition) int {
		if c := strings.Compare(a.topic, b.topic); c != 0 {
			return c
		}
		return a.partition - b.partition
	})
	return parts, nil
}

// offsetOf returns the offset b names for tp, if it names one (a
// partition is named at most once: ParseReplayBound).
func (b ReplayBound) offsetOf(tp topicPartition) (int64, bool) {
	for _, po := range b.Offsets {
		if po.Topic == tp.topic && po.Partition == tp.partition {
			return po.Offset, true
		}
	}
	return 0, false
}

// replayRange applies the bounds to one partition's offsets. notes say
// where a bound was moved into the partition's log.
func replayRange(tp topicPartition, o partitionOffsets, from, to ReplayBound) (PartitionRange, []string) {
	var notes []string
	start := o.end
	switch {
	case from.Earliest:
		start = o.first
	case !from.Time.IsZero():
		if o.fromAt >= 0 {
			start = o.fromAt
		} else if o.end > o.first {
			notes = append(notes, fmt.Sprintf("no message at or after the replay start %s (every message of the partition is older); nothing to replay", from))
		}
	default:
		if off, ok := from.offsetOf(tp); ok {
			start = off
		}
		if start < o.first {
			notes = append(notes, fmt.Sprintf("replay start %d was removed by retention; starting at the log start offset", start))
		}
		if start > o.end {
			notes = append(notes, fmt.Sprintf("replay start %d is beyond the partition's end offset; nothing to replay", start))
		}
	}
	start = min(max(start, o.first), o.end)

	end := o.end
	switch {
	case !to.Time.IsZero():
		if o.toAt >= 0 {
			end = o.toAt
		}
	default:
		if off, ok := to.offsetOf(tp); ok {
			end = off
			if end > o.end {
				notes = append(notes, fmt.Sprintf("replay end %d is beyond the partition's end offset; ending there", end))
			}
		}
	}
	end = max(min(end, o.end), start)
	return PartitionRange{Topic: tp.topic, Partition: tp.partition, Start: start, End: end}, notes
}

// listPartitionOffsets asks for the log start and last stable offsets of
// parts, and for the offsets of the times that are not zero.
func listPartitionOffsets(ctx context.Context, adm *kadm.Client, parts []topicPartition, fromTime, toTime time.Time) (map[topicPartition]partitionOffsets, error) {
	out := make(map[topicPartition]partitionOffsets, len(parts))
	var topics []string
	for _, tp := range parts {
		out[tp] = partitionOffsets{first: -1, end: -1, fromAt: -1, toAt: -1}
		if !slices.Contains(topics, tp.topic) {
			topics = append(topics, tp.topic)
		}
	}
	ask := func(what string, list func() (kadm.ListedOffsets, error), set func(o *partitionOffsets, off int64)) error {
		listed, err := list()
		if err != nil {
			return fmt.Errorf("kafka: replay: list %s offsets: %w", what, err)
		}
		for tp, o := range out {
			lo, ok := listed.Lookup(tp.topic, int32(tp.partition))
			if !ok {
				continue
			}
			if lo.Err != nil {
				return fmt.Errorf("kafka: replay: list %s offsets of %s:%d: %w", what, tp.topic, tp.partition, lo.Err)
			}
			set(&o, lo.Offset)
			out[tp] = o
		}
		return nil
	}
	err := ask("first", func() (kadm.ListedOffsets, error) { return adm.ListStartOffsets(ctx, topics...) },
		func(o *partitionOffsets, off int64) { o.first = off })
	if err == nil {
		// The last stable offset: records of open transactions are not
		// replayed (they are not decided yet).
		err = ask("end", func() (kadm.ListedOffsets, error) { return adm.ListCommittedOffsets(ctx, topics...) },
			func(o *partitionOffsets, off int64) { o.end = off })
	}
	// A partition with no record at or after a time answers its end
	// offset, which the bounds clamp to the last stable offset.
	if err == nil && !fromTime.IsZero() {
		err = ask("start time", func() (kadm.ListedOffsets, error) {
			return adm.ListOffsetsAfterMilli(ctx, fromTime.UnixMilli(), topics...)
		}, func(o *partitionOffsets, off int64) { o.fromAt = off })
	}
	if err == nil && !toTime.IsZero() {
		err = ask("end time", func() (kadm.ListedOffsets, error) {
			return adm.ListOffsetsAfterMilli(ctx, toTime.UnixMilli(), topics...)
		}, func(o *partitionOffsets, off int64) { o.toAt = off })
	}
	if err != nil {
		return nil, err
	}
	for tp, o := range out {
		if o.first < 0 || o.end < 0 {
			return nil, fmt.Errorf("kafka: replay: the brokers did not report the offsets of %s:%d", tp.topic, tp.partition)
		}
	}
	return out, nil
}

// Replay reading settings.
const (
	// DefaultReplayIdleTimeout is how long a partition may deliver
	// nothing before its end before the replay gives up on it.
	DefaultReplayIdleTimeout = 30 * time.Second
)

// partitionReader reads one partition from an offset with a client of its
// own, outside any consumer group (replay, tests).
type partitionReader struct {
	q    *partitionQueue
	stop func()
}

// startPartitionReader reads partition of topic from offset (an absolute
// offset within the log) until stop is called or ctx ends; stop waits for
// the client to close. A start offset no longer in the log (removed by
// retention meanwhile) is reported through the queue as an error.
func startPartitionReader(ctx context.Context, conn KafkaConn, topic string, partition int, offset int64, log *slog.Logger) (*partitionReader, error) {
	cl, err := conn.NewClient(log,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {int32(partition): kgo.NewOffset().At(offset)}}),
		kgo.ConsumeResetOffset(kgo.NoResetOffset()),
		kgo.WithPools(newRecordPool()),
	)
	if err != nil {
		return nil, err
	}
	tp := map[string][]int32{topic: {int32(partition)}}
	q := newPartitionQueue(topic, partition,
		func() { cl.PauseFetchPartitions(tp) },
		func() { cl.ResumeFetchPartitions(tp) })
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pollLoop(pctx, cl, func(t string, p int32) *partitionQueue {
			if t == topic && int(p) == partition {
				return q
			}
			return nil
		}, log)
	}()
	return &partitionReader{q: q, stop: func() {
		cancel()
		<-done
		cl.Close()
	}}, nil
}

// RangeStream reads one partition range for a replay (replay.Stream):
// from Range.Start to Range.End, with a client of its own that reads as
// the daemon's does (read_committed). Offsets missing from the log
// (compaction) are passed over.
type RangeStream struct {
	Range PartitionRange
	Conn  KafkaConn
	// IdleTimeout is how long the partition may deliver nothing before
	// the end of the range before Read fails; default
	// DefaultReplayIdleTimeout.
	IdleTimeout time.Duration
	// Logger receives the reading's records; nil discards.
	Logger *slog.Logger
}

// RangeStreams returns a RangeStream for each of ranges.
func RangeStreams(conn KafkaConn, ranges []PartitionRange, idleTimeout time.Duration, log *slog.Logger) []RangeStream {
	out := make([]RangeStream, len(ranges))
	for i, r := range ranges {
		out[i] = RangeStream{Range: r, Conn: conn, IdleTimeout: idleTimeout, Logger: log}
	}
	return out
}

// Len is the number of offsets the range spans.
func (s RangeStream) Len() int64 { return s.Range.Len() }

// Read hands each batch of up to maxMessages messages to handle, in
// order; a batch is handed over when it is full or when no more fetched
// messages are waiting. progress (which may be nil) is told how many
// offsets each batch passed.
func (s RangeStream) Read(ctx context.Context, maxMessages int, progress func(n int64), handle func([]pipeline.Message) error) error {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	idle := s.IdleTimeout
	if idle <= 0 {
		idle = DefaultReplayIdleTimeout
	}
	return readRange(ctx, rangeReading{what: "replay", conn: s.Conn, idleTimeout: idle, log: log, progress: progress}, s.Range, maxMessages, handle)
}

// rangeReading is how readRange reads: through conn, failing after
// idleTimeout without a message before the range's end, telling progress
// (nil: nobody) how many offsets each batch passed.
type rangeReading struct {
	// what names the reading in errors: "replay", "read".
	what        string
	conn        KafkaConn
	idleTimeout time.Duration
	log         *slog.Logger
	progress    func(n int64)
}

// readRange reads r in batches with the settings in rr: RangeStream
// and the reading of the dead-letter topic (ReadDLQ) share it.
func readRange(ctx context.Context, rr rangeReading, r PartitionRange, maxMessages int, handle func([]pipeline.Message) error) error {
	log := rr.log.With("topic", r.Topic, "partition", r.Partition)
	pr, err := startPartitionReader(ctx, rr.conn, r.Topic, r.Partition, r.Start, log)
	if err != nil {
		return fmt.Errorf("kafka: %s %s:%d: %w", rr.what, r.Topic, r.Partition, err)
	}
	defer pr.stop()
	log.Debug("replaying partition", "from", r.Start, "to", r.End)

	src := batchSource{q: pr.q}
	next := r.Start
	msgs := make([]pipeline.Message, 0, min(maxMessages, int(r.Len())))
	flush := func() error {
		if len(msgs) == 0 {
			return nil
		}
		if err := handle(msgs); err != nil {
			return err
		}
		last := msgs[len(msgs)-1].Pos.Offset
		rr.passed(last + 1 - next)
		next = last + 1
		clear(msgs)
		msgs = msgs[:0]
		return nil
	}
	idle := time.NewTimer(rr.idleTimeout)
	defer idle.Stop()
	for atEnd := false; !atEnd; {
		if len(src.pending) == 0 {
			if !src.more() {
				// Nothing more is waiting: hand over the batch in hand.
				if err := flush(); err != nil {
					return err
				}
			}
			idle.Reset(rr.idleTimeout)
			ok, err := src.receive(ctx, idle.C)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				return fmt.Errorf("kafka: %s %s:%d: read at offset %d: %w", rr.what, r.Topic, r.Partition, next, err)
			}
			if !ok {
				return fmt.Errorf("kafka: %s %s:%d: no message for %s at offset %d (the range ends at %d); are the brokers reachable?",
					rr.what, r.Topic, r.Partition, rr.idleTimeout, next, r.End)
			}
		}
		msgs, atEnd = src.takeBefore(msgs, maxMessages-len(msgs), r.End)
		if len(msgs) == maxMessages {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := flush(); err != nil {
		return err
	}
	rr.passed(r.End - next)
	return nil
}

// passed tells the progress that n more offsets were read.
func (rr rangeReading) passed(n int64) {
	if rr.progress != nil {
		rr.progress(n)
	}
}
