package bench

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/source/kafka"
)

// LatencyResult is one event-to-applied latency measurement.
type LatencyResult struct {
	Run int
	// Bare: the fetch-only latency, the harness reading the topic
	// instead of the daemon (runLatency).
	Bare bool
	// Rate is the offered rate (events/s); Achieved the rate the paced
	// producer actually reached.
	Rate, Achieved float64
	// Samples is how many sample latencies were measured after the
	// warm-up; Missing how many samples never became visible.
	Samples, Missing    int
	P50, P99, P999, Max time.Duration
	// Latencies and AckLatencies are every sample's latency, from produce
	// and from the broker's acknowledgement, sorted: Summarize pools them
	// over the runs.
	Latencies, AckLatencies []time.Duration
	// AckP50 and AckP99 measure from the broker's acknowledgement of the
	// sample instead: the producer's own queueing left out.
	AckP50, AckP99 time.Duration
	// FirstP50 and LastP50 are the medians of the first and the last fifth
	// of the samples in produce order: a backlog that grows during the
	// measurement (the daemon falling behind) shows as LastP50 >> FirstP50.
	FirstP50, LastP50 time.Duration
	// CPU is the CPU time each process used during the measurement
	// (warm-up included), by "cachewarden", "broker", "memcached" and
	// "harness" (producer and sampler).
	CPU     map[string]time.Duration
	Elapsed time.Duration
	// BatchP99 and CommitP99 are the daemon's own view, from its
	// histograms over the whole measurement (warm-up included): the
	// 99th percentile of the time to process one batch and of one offset
	// commit, as the upper bound of the histogram bucket holding it
	// (buckets double from 0.5 ms). Zero when the scrape failed.
	BatchP99, CommitP99 time.Duration
	// EventAge is the daemon's cachewarden_event_age_seconds histogram at
	// the end of the measurement (warm-up included): how old each applied
	// row change was, now minus its source time, which the paced producer
	// sets to the moment it hands the event to the producer client.
	EventAge Histogram
	// FetchToApply is the daemon's cachewarden_fetch_to_apply_seconds
	// histogram at the end of the measurement (warm-up included): the
	// daemon's own latency, from each record's fetch to its batch applied.
	FetchToApply Histogram
}

// sampler polls memcached for the namespace keys of sample events and
// records when each becomes visible. Samples are numbered from 0 in
// produce order; sample n's key is SampleKey(n).
type sampler struct {
	mc       *memcache.Client
	interval time.Duration

	mu       sync.Mutex
	produced []time.Time // handed to the producer client
	acked    []time.Time // acknowledged by the broker (zero: not yet)
	seen     []time.Time // first poll that found the key (zero: not yet)
	pending  map[int]bool
}

func newSampler(mc *memcache.Client, n int) *sampler {
	return &sampler{mc: mc, interval: time.Millisecond, produced: make([]time.Time, n),
		acked: make([]time.Time, n), seen: make([]time.Time, n), pending: map[int]bool{}}
}

func (s *sampler) produce(n int, t time.Time) {
	s.mu.Lock()
	s.produced[n] = t
	s.pending[n] = true
	s.mu.Unlock()
}

func (s *sampler) ack(n int, t time.Time) {
	s.mu.Lock()
	s.acked[n] = t
	s.mu.Unlock()
}

func (s *sampler) pendingCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// run polls until ctx ends: every interval, one multi-get of all pending
// keys.
func (s *sampler) run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	var keys []string
	byKey := map[string]int{}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		keys = keys[:0]
		clear(byKey)
		s.mu.Lock()
		for n := range s.pending {
			k := SampleKey(uint64(n))
			keys = append(keys, k)
			byKey[k] = n
		}
		s.mu.Unlock()
		if len(keys) == 0 {
			continue
		}
		items, err := s.mc.GetMulti(keys)
		now := time.Now()
		if err != nil {
			continue // polled again next tick
		}
		s.mu.Lock()
		for k := range items {
			n := byKey[k]
			delete(s.pending, n)
			s.seen[n] = now
		}
		s.mu.Unlock()
	}
}

// read marks samples seen as the reader fetches their records, until ctx
// ends: the fetch-only latency (runLatency with bare).
func (s *sampler) read(ctx context.Context, reader *kgo.Client, sampleByKey map[string]int) {
	for ctx.Err() == nil {
		fetches := reader.PollFetches(ctx)
		now := time.Now()
		s.mu.Lock()
		fetches.EachRecord(func(r *kgo.Record) {
			if n, ok := sampleByKey[string(r.Key)]; ok && s.pending[n] {
				delete(s.pending, n)
				s.seen[n] = now
			}
		})
		s.mu.Unlock()
	}
}

// latencies returns, for the samples produced at or after from, in
// produce order, the latencies from produce and from broker ack (ack
// latencies of samples seen before their ack count as 0), and the number
// of those samples never seen.
func (s *sampler) latencies(from time.Time) (fromProduce, fromAck []time.Duration, missing int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, p := range s.produced {
		if p.IsZero() || p.Before(from) {
			continue
		}
		if s.seen[n].IsZero() {
			missing++
			continue
		}
		fromProduce = append(fromProduce, s.seen[n].Sub(p))
		if !s.acked[n].IsZero() {
			fromAck = append(fromAck, max(s.seen[n].Sub(s.acked[n]), 0))
		}
	}
	return fromProduce, fromAck, missing
}

// Percentile returns the q-quantile (0..1) of sorted by the nearest-rank
// method; 0 for no values.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(q*float64(len(sorted))+0.999999999) - 1
	return sorted[min(max(rank, 0), len(sorted)-1)]
}

// runLatency measures cachewarden's event-to-applied latency: a paced
// producer offers LatencyRate events/s of the uniform workload to a fresh
// topic that a running daemon consumes; LatencySamplesPerSec of those
// events are changes of users that no cache holds, and a sampler polls
// memcached for those users' namespace keys. A sample's latency runs from
// just before its record is handed to the producer client until the poll
// that first sees the key.
//
// With bare set, the daemon is left out: the harness itself reads the
// topic with the daemon's Kafka client settings (no group, decoding or
// memcached) and a sample counts as seen when its record is fetched. That
// is the fetch-only latency: what broker, producer and machine leave for
// any consumer at this rate.
func (e *env) runLatency(ctx context.Context, run int, bare bool) (LatencyResult, error) {
	o := e.opts
	res := LatencyResult{Run: run, Rate: float64(o.LatencyRate), Bare: bare}
	topic := fmt.Sprintf("%s-latency-r%d", e.prefix, run)
	if bare {
		topic += "-fetch-only"
	}
	if err := e.broker.CreateTopic(ctx, topic, o.Partitions); err != nil {
		return res, err
	}
	var proc *consumerProc
	if !bare {
		if err := SeedKeys(e.mc.Addr, o.Keys); err != nil {
			return res, err
		}
		group := fmt.Sprintf("%s-cachewarden-latency-r%d", e.prefix, run)
		var err error
		if proc, err = e.startCachewarden(group, topic, daemonSetup{}); err != nil {
			return res, err
		}
		defer proc.Stop(15 * time.Second)
		if err := proc.waitReady(ctx, 60*time.Second); err != nil {
			return res, err
		}
	}

	every := max(o.LatencyRate/o.LatencySamplesPerSec, 1)
	total := int(float64(o.LatencyRate) * (o.LatencyWarmup + o.LatencyDuration).Seconds())
	recs, sampleAt, err := pregenerate(Workload{Dist: Uniform, Keys: o.Keys, Seed: o.Seed + 1000 + uint64(run)}, total, every)
	if err != nil {
		return res, err
	}
	sampleOf := make(map[*kgo.Record]int, len(sampleAt)) // read-only from here on
	for n, i := range sampleAt {
		sampleOf[recs[i]] = n
	}

	mc := memcache.New(e.mc.Addr)
	defer mc.Close()
	s := newSampler(mc, len(sampleAt))
	sctx, stopSampler := context.WithCancel(ctx)
	defer stopSampler()
	samplerDone := make(chan struct{})
	if bare {
		sampleByKey := make(map[string]int, len(sampleAt))
		for n, i := range sampleAt {
			sampleByKey[string(recs[i].Key)] = n
		}
		reader, err := kafka.KafkaConn{Brokers: e.broker.Addrs}.NewClient(slog.New(slog.DiscardHandler),
			kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		if err != nil {
			return res, err
		}
		defer reader.Close()
		go func() {
			defer close(samplerDone)
			s.read(sctx, reader, sampleByKey)
		}()
	} else {
		go func() {
			defer close(samplerDone)
			s.run(sctx)
		}()
	}

	// franz-go's client, asynchronous: the producer never waits for the
	// broker, so the offered rate holds whatever the consumer does, and it
	// costs the shared CPUs about half of what kafka-go's Writer does.
	var writeErrs atomic.Int64
	var firstWriteErr atomic.Value
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(e.broker.Addrs...),
		kgo.DefaultProduceTopic(topic),
		kgo.ProducerLinger(time.Millisecond),
		kgo.RequiredAcks(kgo.LeaderAck()),
		kgo.DisableIdempotentWrite(),
		kgo.ProducerBatchCompression(kgo.NoCompression()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)), // by key, as Kafka Connect does
	)
	if err != nil {
		return res, fmt.Errorf("bench: paced producer: %w", err)
	}
	defer cl.Close()
	promise := func(r *kgo.Record, err error) {
		if err != nil {
			writeErrs.Add(1)
			firstWriteErr.CompareAndSwap(nil, err)
			return
		}
		if n, ok := sampleOf[r]; ok {
			s.ack(n, time.Now())
		}
	}

	cpu0, err := e.latencyCPU(proc)
	if err != nil {
		return res, err
	}
	start := time.Now()
	produced, nextSample := 0, 0
	for produced < total {
		due := min(int(float64(o.LatencyRate)*time.Since(start).Seconds()), total)
		if due <= produced {
			time.Sleep(time.Millisecond - time.Since(start)%time.Millisecond)
			continue
		}
		for ; produced < due; produced++ {
			now := time.Now()
			SetSourceTime(recs[produced].Value, now.UnixMilli())
			if nextSample < len(sampleAt) && sampleAt[nextSample] == produced {
				s.produce(nextSample, now)
				nextSample++
			}
			cl.Produce(ctx, recs[produced], promise)
		}
	}
	res.Elapsed = time.Since(start)
	res.Achieved = float64(produced) / res.Elapsed.Seconds()
	cpu1, err := e.latencyCPU(proc)
	if err != nil {
		return res, err
	}
	res.CPU = map[string]time.Duration{}
	for k, v := range cpu1 {
		res.CPU[k] = v - cpu0[k]
	}
	if err := cl.Flush(ctx); err != nil {
		return res, fmt.Errorf("bench: paced produce: %w", err)
	}
	if n := writeErrs.Load(); n > 0 {
		return res, fmt.Errorf("bench: paced produce: %d records not written: %v", n, firstWriteErr.Load())
	}

	// Let the last samples land.
	wait := time.Now().Add(10 * time.Second)
	for s.pendingCount() > 0 && time.Now().Before(wait) {
		time.Sleep(10 * time.Millisecond)
	}
	stopSampler()
	<-samplerDone
	lat, ackLat, missing := s.latencies(start.Add(o.LatencyWarmup))
	res.Missing, res.Samples = missing, len(lat)
	fifth := len(lat) / 5
	res.FirstP50, res.LastP50 = median(lat[:fifth]), median(lat[len(lat)-fifth:])
	slices.Sort(lat)
	slices.Sort(ackLat)
	res.P50, res.P99, res.P999 = Percentile(lat, 0.50), Percentile(lat, 0.99), Percentile(lat, 0.999)
	res.AckP50, res.AckP99 = Percentile(ackLat, 0.50), Percentile(ackLat, 0.99)
	res.Latencies, res.AckLatencies = lat, ackLat
	if len(lat) > 0 {
		res.Max = lat[len(lat)-1]
	}
	if proc == nil {
		return res, nil
	}
	if counts, err := proc.scrape(); err != nil {
		e.log.Warn("cannot read the daemon's histograms", "error", err.Error())
	} else {
		res.BatchP99 = seconds(counts.BatchDuration.Quantile(0.99))
		res.CommitP99 = seconds(counts.CommitDuration.Quantile(0.99))
		res.EventAge = counts.EventAge
		res.FetchToApply = counts.FetchToApply
	}
	if err := proc.Stop(15 * time.Second); err != nil {
		e.log.Warn("daemon did not stop cleanly", "error", err.Error())
	}
	return res, nil
}

// seconds converts a histogram bound; +Inf becomes the largest duration.
func seconds(s float64) time.Duration {
	if math.IsInf(s, 1) {
		return time.Duration(math.MaxInt64)
	}
	return time.Duration(s * float64(time.Second))
}

// median returns the median of unsorted durations; 0 for none.
func median(xs []time.Duration) time.Duration {
	if len(xs) == 0 {
		return 0
	}
	sorted := slices.Clone(xs)
	slices.Sort(sorted)
	return Percentile(sorted, 0.5)
}

// latencyCPU reads the CPU time used so far by the processes of the
// latency measurement.
func (e *env) latencyCPU(daemon *consumerProc) (map[string]time.Duration, error) {
	svc, err := e.serviceCPU()
	if err != nil {
		return nil, err
	}
	self, err := ProcCPU(os.Getpid())
	if err != nil {
		return nil, err
	}
	cpu := map[string]time.Duration{"broker": svc.broker, "memcached": svc.memcached, "harness": self}
	if daemon != nil {
		if cpu["cachewarden"], err = ProcCPU(daemon.Pid()); err != nil {
			return nil, err
		}
	}
	return cpu, nil
}

// pregenerate builds the records of a latency run ahead of time, so that
// generating them does not compete with the daemon during the
// measurement: n events of w, with every every-th one (from the first) a
// latency sample; sampleAt lists the indexes of the samples in order.
func pregenerate(w Workload, n, every int) (recs []*kgo.Record, sampleAt []int, err error) {
	g, err := NewGenerator(w)
	if err != nil {
		return nil, nil, err
	}
	recs = make([]*kgo.Record, n)
	arena := make([]byte, 0, 1<<20)
	for i := range n {
		if len(arena) > cap(arena)-4096 {
			arena = make([]byte, 0, 1<<20) // records keep slices of the old one
		}
		k0 := len(arena)
		var v []byte
		if i%every == 0 {
			arena, v = g.Sample(arena, nil, uint64(len(sampleAt)))
			sampleAt = append(sampleAt, i)
		} else {
			arena, v, _ = g.Next(arena, nil)
		}
		k1 := len(arena)
		arena = append(arena, v...)
		recs[i] = &kgo.Record{Key: arena[k0:k1:k1], Value: arena[k1:len(arena):len(arena)]}
	}
	return recs, sampleAt, nil
}
