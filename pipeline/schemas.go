package pipeline

import (
	"context"
	"slices"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/retry"
)

// missingSchemas appends to ids the registry ids of the Confluent-framed Avro
// messages among msgs (values, and the keys of Avro values) whose schema
// the decoder of their topic lacks, once each.
func (p *Pipeline) missingSchemas(ids []uint32, msgs []Message) []uint32 {
	add := func(dec *decode.Decoder, b []byte) bool {
		id, ok := decode.AvroSchemaID(b)
		if ok && dec.Schemas.Lookup(id) == nil && !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
		return ok
	}
	for i := range msgs {
		dec := p.decoderFor(msgs[i].Pos.Topic)
		if dec.Schemas == nil {
			continue
		}
		if add(dec, msgs[i].Value) {
			add(dec, msgs[i].Key) // read by the ordering check of set rules
		}
	}
	return ids
}

// awaitSchemas makes sure the schemas of the Avro messages among msgs are
// cached before they are decoded: it asks the registry for the missing
// ones and, when the registry cannot be asked, retries with backoff for
// as long as it takes, the partition waiting meanwhile and the daemon
// reporting not ready. It returns ctx's error when ctx ends first. ids is
// scratch space, returned for reuse.
func (p *Pipeline) awaitSchemas(ctx context.Context, ids []uint32, msgs []Message) ([]uint32, error) {
	if p.cfg.Schemas == nil {
		return ids, nil
	}
	ids = p.missingSchemas(ids[:0], msgs)
	if len(ids) == 0 {
		return ids, nil
	}
	for attempt := 0; ; attempt++ {
		err := p.cfg.Schemas.Fetch(ctx, ids)
		if err == nil {
			if attempt > 0 {
				p.log.Info("schema registry answered; the partition goes on", "schema_ids", ids, "attempts", attempt+1)
			}
			return ids, nil
		}
		if ctx.Err() != nil {
			return ids, ctx.Err()
		}
		if attempt == 0 {
			p.schemaWaits.Add(1)
			p.m.schemaWaiting.Inc()
			defer func() {
				p.schemaWaits.Add(-1)
				p.m.schemaWaiting.Dec()
			}()
		}
		wait := p.backoff(attempt)
		if retry.Logged(attempt) {
			p.log.Error("cannot read message schemas from the schema registry; the partition waits and the daemon is not ready",
				"schema_ids", ids, "attempt", attempt+1, "retry_in", wait, "error", err.Error())
		}
		if err := retry.Sleep(ctx, wait); err != nil {
			return ids, err
		}
	}
}

// WaitingForSchemas reports whether a batch waits for the schema registry
// (the daemon is then not ready). It is safe for concurrent use.
func (p *Pipeline) WaitingForSchemas() bool { return p.schemaWaits.Load() > 0 }
