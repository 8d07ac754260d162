package bench

import (
	"context"
	"fmt"
	"log/slog"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/source/kafka"
)

// CeilingResult is one fetch-only reference measurement.
type CeilingResult struct {
	Run       int
	Events    int64
	Elapsed   time.Duration
	BrokerCPU time.Duration // 0 for an external broker
	// ClientCPU is the CPU time (user and system) the reading client
	// used, and ClientFaults the page faults it took: the harness's
	// process does nothing else meanwhile.
	ClientCPU    time.Duration
	ClientFaults int64
}

// ClientCPUPerEvent is the client's CPU time per event in microseconds.
func (c CeilingResult) ClientCPUPerEvent() float64 {
	return float64(c.ClientCPU.Microseconds()) / float64(c.Events)
}

// selfUsage returns the CPU time and minor page faults of this process so far.
func selfUsage() (time.Duration, int64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), ru.Minflt
}

// EventsPerSec is Events / Elapsed.
func (c CeilingResult) EventsPerSec() float64 { return float64(c.Events) / c.Elapsed.Seconds() }

// runCeiling reads the whole topic with the daemon's Kafka client
// settings and does nothing else: one franz-go client reading every
// partition from the start (read_committed, the daemon's fetch sizes), no
// consumer group, no commits, no decoding, no memcached. The clock starts
// at the first record, so connection set-up is left out. It is the most a
// consumer fetching this way can reach against this broker on this
// machine, the ceiling the consumers' figures sit under.
func (e *env) runCeiling(ctx context.Context, run int, topic string, total int64) (CeilingResult, error) {
	res := CeilingResult{Run: run, Events: total}
	ends, err := e.broker.EndOffsets(ctx, topic, e.opts.Partitions)
	if err != nil {
		return res, err
	}
	cpu0, err := e.serviceCPU()
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithTimeout(ctx, e.opts.RunTimeout)
	defer cancel()
	starts := make(map[int32]kgo.Offset)
	var want int64
	for p := range e.opts.Partitions {
		if ends[p] > 0 {
			starts[int32(p)] = kgo.NewOffset().AtStart()
			want += ends[p]
		}
	}
	cl, err := kafka.KafkaConn{Brokers: e.broker.Addrs}.NewClient(slog.New(slog.DiscardHandler),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: starts}))
	if err != nil {
		return res, err
	}
	defer cl.Close()
	var (
		start, last time.Time
		read        int64
		cpuAt       time.Duration
		faultsAt    int64
	)
	next := make(map[int32]int64)
	for done := 0; done < len(starts); {
		fetches := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return res, fmt.Errorf("bench: fetch-only read of %s: %w", topic, err)
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return res, fmt.Errorf("bench: fetch-only read of %s/%d: %w", errs[0].Topic, errs[0].Partition, errs[0].Err)
		}
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) == 0 {
				return
			}
			if start.IsZero() {
				start = time.Now()
				cpuAt, faultsAt = selfUsage()
			}
			read += int64(len(p.Records))
			before := next[p.Partition]
			next[p.Partition] = p.Records[len(p.Records)-1].Offset + 1
			if end := ends[int(p.Partition)]; before < end && next[p.Partition] >= end {
				done++
			}
		})
		last = time.Now()
	}
	if read < want {
		return res, fmt.Errorf("bench: fetch-only read of %s: %d of %d records", topic, read, want)
	}
	res.Elapsed = last.Sub(start)
	cpuEnd, faultsEnd := selfUsage()
	res.ClientCPU, res.ClientFaults = cpuEnd-cpuAt, faultsEnd-faultsAt
	cpu1, err := e.serviceCPU()
	if err != nil {
		return res, err
	}
	res.BrokerCPU = cpu1.broker - cpu0.broker
	return res, nil
}
