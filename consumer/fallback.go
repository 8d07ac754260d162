package consumer

import (
	"context"
	"errors"
	"strings"

	"github.com/cachewarden/cachewarden/consumer/cdc"
	"github.com/cachewarden/cachewarden/rules"
)

// Reasons an exact invalidation could not be delivered
// (cachewarden_invalidations_lost_total).
const (
	// lostPoison: a message that could not be decoded or planned went
	// to the DLQ (or the log) and the partition moved on.
	lostPoison = "poison"
	// lostOpFailed: a cache op failed permanently.
	lostOpFailed = "op_failed"
	// lostRetention: records were removed from the log by retention
	// before they were read (kafka.offset_reset earliest or latest).
	lostRetention = "retention"
	// lostOffsetReset: the partition's committed offset was beyond its
	// end and consumption restarted elsewhere (kafka.offset_reset).
	lostOffsetReset = "offset_reset"
)

// fallbackKeysOfTopic appends the fallback namespace keys that cover a
// change of unknown table read from topic: those of the topic's table when
// kafka.topic_tables names it; else those of every rule table whose
// db.table the topic's name is or ends with (Debezium names topics
// prefix.db.table); else every fallback key of the rules.
func (p *Pipeline) fallbackKeysOfTopic(dst []string, topic string) []string {
	rs := p.cfg.Rules
	if t, ok := p.decoderFor(topic).TopicTables[topic]; ok {
		db, table, dotted := strings.Cut(t, ".")
		if !dotted {
			db, table = "", t
		}
		return rs.FallbackKeys(dst, db, table)
	}
	start := len(dst)
	for _, t := range rs.Tables() {
		if db, table, dotted := strings.Cut(t, "."); dotted && (topic == t || strings.HasSuffix(topic, "."+t)) {
			dst = rs.FallbackKeys(dst, db, table)
		}
	}
	if len(dst) > start {
		return dst
	}
	return rs.FallbackKeys(dst, "", "")
}

// coverPoison plans the fallback bumps that cover a poison message: of
// the tables of its decoded row changes; else of the table its decode
// error names (cdc.DecodeError.Table: an unknown operation type); else of
// its topic's tables.
func (p *Pipeline) coverPoison(b *Batch, msg *Message, events []rules.Event, err error) {
	keys := b.fallbackKeys[:0]
	for i := range events {
		if events[i].Table != "" {
			keys = p.cfg.Rules.FallbackKeys(keys, events[i].Database, events[i].Table)
		}
	}
	if len(events) == 0 {
		var de *cdc.DecodeError
		if errors.As(err, &de) && de.Table != "" {
			keys = p.cfg.Rules.FallbackKeys(keys, de.Database, de.Table)
		} else {
			keys = p.fallbackKeysOfTopic(keys, msg.Pos.Topic)
		}
	}
	for _, k := range keys {
		b.planned = append(b.planned, p.cfg.Rules.FallbackOp(k, msg.Pos))
	}
	b.fallbackKeys = keys
	p.countLost(lostPoison, len(keys) > 0)
}

// countLost counts one change whose exact invalidation could not be
// delivered, covered by fallback bumps or not.
func (p *Pipeline) countLost(reason string, covered bool) {
	c := "none"
	if covered {
		c = "fallback"
	}
	p.m.lost.WithLabelValues(reason, c).Inc()
}

// CoverGap bumps the fallback namespaces of every table of topic because
// records of its partition were never read (reason lostRetention or
// lostOffsetReset), retrying until the bumps are applied, ctx ends or
// ctx's write guard refuses (cacheops.WithGuard; the error is then ctx's
// or the refusal, and the gap is not counted: whoever covers it later
// counts it). It reports whether any fallback namespace covered the gap.
func (p *Pipeline) CoverGap(ctx context.Context, topic, reason string, src rules.Position) (bool, error) {
	keys := p.fallbackKeysOfTopic(nil, topic)
	if len(keys) == 0 {
		p.countLost(reason, false)
		return false, nil
	}
	b := &Batch{}
	for _, k := range keys {
		b.Ops = append(b.Ops, p.cfg.Rules.FallbackOp(k, src))
	}
	if err := p.applyOps(ctx, b); err != nil {
		return true, err
	}
	p.countLost(reason, true)
	return true, nil
}

// fallbackFor returns the fallback bump that covers op when op failed
// permanently; ok false when no fallback namespace covers its rule (a
// fallback bump has none of its own).
func fallbackFor(rs *rules.RuleSet, op *rules.Op) (rules.Op, bool) {
	if op.Rule == nil || op.Rule.Fallback == "" {
		return rules.Op{}, false
	}
	return rs.FallbackOp(op.Rule.Fallback, op.Source), true
}
