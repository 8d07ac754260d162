package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// produceChunk is how many messages one WriteMessages call carries when
// loading a topic.
const produceChunk = 20_000

func newWriter(addrs []string, topic string, batchTimeout time.Duration) *kafka.Writer {
	return &kafka.Writer{
		Addr:      kafka.TCP(addrs...),
		Topic:     topic,
		Balancer:  &kafka.Hash{}, // by message key (the row's primary key), as Kafka Connect does
		BatchSize: produceChunk,
		// Below the broker's default message.max.bytes (1 MiB + 12).
		BatchBytes:   1 << 20,
		BatchTimeout: batchTimeout,
		RequiredAcks: kafka.RequireOne,
	}
}

// chunk is a reusable batch of generated messages.
type chunk struct {
	msgs  []kafka.Message
	arena []byte
}

// fill generates n messages into c, reusing its memory.
func (c *chunk) fill(g *Generator, n int) {
	c.msgs = c.msgs[:0]
	c.arena = c.arena[:0]
	type span struct{ k0, k1, v1 int }
	spans := make([]span, 0, n)
	for range n {
		k0 := len(c.arena)
		var v []byte
		c.arena, v, _ = g.Next(c.arena, nil)
		k1 := len(c.arena)
		c.arena = append(c.arena, v...)
		spans = append(spans, span{k0, k1, len(c.arena)})
	}
	// The arena may have moved while growing: slice it at the end.
	for _, s := range spans {
		c.msgs = append(c.msgs, kafka.Message{Key: c.arena[s.k0:s.k1:s.k1], Value: c.arena[s.k1:s.v1:s.v1]})
	}
}

// Produce writes n events of w to topic as fast as the broker takes them
// and returns how long it took. Generation of the next chunk overlaps the
// write of the previous one.
func Produce(ctx context.Context, addrs []string, topic string, w Workload, n int) (time.Duration, error) {
	g, err := NewGenerator(w)
	if err != nil {
		return 0, err
	}
	wr := newWriter(addrs, topic, 2*time.Millisecond)
	defer wr.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the generator if a write fails
	start := time.Now()
	free := make(chan *chunk, 2)
	free <- &chunk{}
	free <- &chunk{}
	full := make(chan *chunk, 1)
	genErr := make(chan error, 1)
	go func() {
		defer close(full)
		for left := n; left > 0; {
			var c *chunk
			select {
			case c = <-free:
			case <-ctx.Done():
				genErr <- ctx.Err()
				return
			}
			k := min(left, produceChunk)
			c.fill(g, k)
			left -= k
			select {
			case full <- c:
			case <-ctx.Done():
				genErr <- ctx.Err()
				return
			}
		}
	}()
	for c := range full {
		if err := wr.WriteMessages(ctx, c.msgs...); err != nil {
			return 0, fmt.Errorf("bench: produce to %q: %w", topic, shortWriteError(err))
		}
		free <- c
	}
	select {
	case err := <-genErr:
		return 0, err
	default:
	}
	return time.Since(start), nil
}

// shortWriteError reduces kafka.WriteErrors (one entry per message) to a
// count and the first error.
func shortWriteError(err error) error {
	var we kafka.WriteErrors
	if !errors.As(err, &we) {
		return err
	}
	for _, e := range we {
		if e != nil {
			return fmt.Errorf("%d of %d messages failed, first: %w", we.Count(), len(we), e)
		}
	}
	return err
}
