package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
)

// CeilingResult is one fetch-only reference measurement.
type CeilingResult struct {
	Run       int
	Events    int64
	Elapsed   time.Duration
	BrokerCPU time.Duration // 0 for an external broker
}

// EventsPerSec is Events / Elapsed.
func (c CeilingResult) EventsPerSec() float64 { return float64(c.Events) / c.Elapsed.Seconds() }

// runCeiling reads the whole topic with kafka-go and does nothing else: one
// partition Reader per partition, configured as cachewarden configures its
// partition readers, no consumer group, no commits, no decoding, no
// memcached. The clock starts at the first message, so connection set-up
// is left out. It is the most any kafka-go consumer can reach against this
// broker on this machine, the ceiling the consumers' figures sit under.
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
	var (
		first    sync.Once
		start    time.Time
		last     time.Time
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for p := range e.opts.Partitions {
		if ends[p] == 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := kafka.NewReader(kafka.ReaderConfig{
				Brokers: e.broker.Addrs, Topic: topic, Partition: p,
				MinBytes: 1, MaxBytes: 16 << 20, MaxWait: time.Second, QueueCapacity: 1000,
				IsolationLevel: kafka.ReadCommitted,
			})
			defer r.Close()
			for {
				m, err := r.FetchMessage(ctx)
				first.Do(func() { start = time.Now() })
				if err != nil {
					mu.Lock()
					if firstErr == nil {
						firstErr = fmt.Errorf("bench: fetch-only read of %s/%d: %w", topic, p, err)
					}
					mu.Unlock()
					cancel()
					return
				}
				if m.Offset+1 >= ends[p] {
					// Close waits for the reader's pending long-poll
					// fetch: stop the clock before it.
					mu.Lock()
					if now := time.Now(); now.After(last) {
						last = now
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	res.Elapsed = last.Sub(start)
	if firstErr != nil {
		return res, firstErr
	}
	cpu1, err := e.serviceCPU()
	if err != nil {
		return res, err
	}
	res.BrokerCPU = cpu1.broker - cpu0.broker
	return res, nil
}
