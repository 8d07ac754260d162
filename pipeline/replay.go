package pipeline

import (
	"context"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
)

// What a replay (package replay) needs of the pipeline beyond Process:
// it plans and applies batches itself, holding counter and set ops back
// for the recounts and set rebuilds it runs at its end.

// WithDecoder returns a copy of p that decodes every message with dec,
// whatever its topic (a replay file). The copy shares p's rules and
// metrics.
func (p *Pipeline) WithDecoder(dec *decode.Decoder) *Pipeline {
	cp := *p
	cp.fileDecoder = dec
	return &cp
}

// DecoderFor returns the decoder of messages of topic under the current
// rules ("" for messages without a topic).
func (p *Pipeline) DecoderFor(topic string) *decode.Decoder { return p.decoderFor(topic) }

// AwaitSchemas makes sure the schemas of the Avro messages among msgs are
// cached before they are decoded, waiting for the registry as long as it
// takes (see Config.Schemas); ids is scratch space, returned for reuse.
func (p *Pipeline) AwaitSchemas(ctx context.Context, ids []uint32, msgs []Message) ([]uint32, error) {
	return p.awaitSchemas(ctx, ids, msgs)
}

// ApplyOps applies b.Ops as they are (no planning, no coalescing): the
// counters' generations are read first, then each op is retried until it
// succeeds or fails permanently. A replay's final recounts and set
// rebuilds take this way.
func (p *Pipeline) ApplyOps(ctx context.Context, b *Batch) error {
	if err := p.stampCounters(ctx, b.Ops); err != nil {
		return err
	}
	return p.applyOps(ctx, b)
}

// CountPoison counts a poison message that its reader reports itself
// (cachewarden_poison_messages_total) rather than through the PoisonSink.
func (p *Pipeline) CountPoison(pos rules.Position) { p.m.poison.WithLabelValues(pos.Topic).Inc() }

// CountRecounts counts n recounts of the config's RecountReason
// (cachewarden_recounts_total).
func (p *Pipeline) CountRecounts(n int) {
	p.m.recounts.WithLabelValues(p.cfg.RecountReason).Add(float64(n))
}

// Failed returns how many of the ops the last Apply or ApplyOps of b
// gave up on after a permanent error.
func (b *Batch) Failed() int {
	n := 0
	for i := range b.results {
		if b.results[i].Err != nil {
			n++
		}
	}
	return n
}
