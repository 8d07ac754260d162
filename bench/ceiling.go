package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/consumer"
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

// runCeiling reads the whole topic with kafka-go and does nothing else:
// one leader connection per partition fetching as cachewarden's partition
// fetchers do (kafka-go Conn fetch requests of up to 16 MiB, read through
// the daemon's dialer and its socket buffer), no consumer group, no
// commits, no decoding, no memcached. The clock starts at the first
// message, so connection set-up is left out. It is the most a kafka-go
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
	dialer := consumer.KafkaConn{Brokers: e.broker.Addrs}.Dialer()
	var (
		first sync.Once
		start time.Time
		mu    sync.Mutex
		last  time.Time
	)
	read := func(p int) error {
		conn, err := dialer.DialLeader(ctx, "tcp", e.broker.Addrs[0], topic, p)
		if err != nil {
			return err
		}
		defer conn.Close()
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		defer stop()
		if _, err := conn.Seek(0, kafka.SeekStart); err != nil {
			return err
		}
		for next := int64(0); next < ends[p]; {
			batch := conn.ReadBatchWith(kafka.ReadBatchConfig{
				MinBytes: 1, MaxBytes: 16 << 20, MaxWait: time.Second, IsolationLevel: kafka.ReadCommitted,
			})
			for {
				m, err := batch.ReadMessage()
				if err != nil {
					break
				}
				first.Do(func() { start = time.Now() })
				next = m.Offset + 1
			}
			if err := batch.Close(); err != nil {
				return err
			}
		}
		mu.Lock()
		if now := time.Now(); now.After(last) {
			last = now
		}
		mu.Unlock()
		return nil
	}
	var (
		wg   sync.WaitGroup
		errs = make([]error, e.opts.Partitions)
	)
	for p := range e.opts.Partitions {
		if ends[p] == 0 {
			continue
		}
		wg.Go(func() {
			if err := read(p); err != nil {
				cancel()
				errs[p] = fmt.Errorf("bench: fetch-only read of %s/%d: %w", topic, p, err)
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return res, err
	}
	res.Elapsed = last.Sub(start)
	cpu1, err := e.serviceCPU()
	if err != nil {
		return res, err
	}
	res.BrokerCPU = cpu1.broker - cpu0.broker
	return res, nil
}
