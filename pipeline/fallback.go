package pipeline

import (
	"context"
	"errors"
	"strings"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
)

// Reasons an exact invalidation could not be delivered
// (cachewarden_invalidations_lost_total).
const (
	// LostPoison: a message that could not be decoded or planned went
	// to the DLQ (or the log) and the partition moved on.
	LostPoison = "poison"
	// LostOpFailed: a cache op failed permanently.
	LostOpFailed = "op_failed"
	// LostRetention: records were removed from the log by retention
	// before they were read (kafka.offset_reset earliest or latest).
	LostRetention = "retention"
	// LostOffsetReset: the partition's committed offset was beyond its
	// end and consumption restarted elsewhere (kafka.offset_reset).
	LostOffsetReset = "offset_reset"
)

// topicTables calls f with the db and table of every table a change of
// unknown table read from topic may belong to: the topic's table when
// kafka.topic_tables names it; else every rule table whose db.table the
// topic's name is or ends with (Debezium names topics prefix.db.table);
// else once with ("", ""), every table of the rules.
func (p *Pipeline) topicTables(st *ruleState, topic string, f func(db, table string)) {
	rs := st.rules
	if t, ok := p.decoderIn(st, topic).TopicTables[topic]; ok {
		db, table, dotted := strings.Cut(t, ".")
		if !dotted {
			db, table = "", t
		}
		f(db, table)
		return
	}
	found := false
	for _, t := range rs.Tables() {
		if db, table, dotted := strings.Cut(t, "."); dotted && (topic == t || strings.HasSuffix(topic, "."+t)) {
			f(db, table)
			found = true
		}
	}
	if !found {
		f("", "")
	}
}

// coverKeysOfTopic appends the fallback namespace keys and the
// generation keys that cover a change of unknown table read from topic
// (see topicTables).
func (p *Pipeline) coverKeysOfTopic(st *ruleState, dst []string, topic string) []string {
	rs := st.rules
	p.topicTables(st, topic, func(db, table string) {
		dst = rs.FallbackKeys(dst, db, table)
		dst = rs.GenerationKeys(dst, db, table)
	})
	return dst
}

// topicCovered reports whether every rule of every table of topic (see
// topicTables) is covered by a fallback namespace or a generation
// (rules.RuleSet.Covered).
func (p *Pipeline) topicCovered(st *ruleState, topic string) bool {
	covered := true
	p.topicTables(st, topic, func(db, table string) {
		covered = covered && st.rules.Covered(db, table)
	})
	return covered
}

// coverPoison plans the bumps that cover a poison message: the fallback
// namespaces and the generations (of sets and counters) of the tables of
// its decoded row changes; else of the table its decode error names
// (decode.DecodeError.Table: an unknown operation type, too many rows); else
// of its topic's tables. The bumps are applied with the batch, before its
// offsets are committed.
func (p *Pipeline) coverPoison(b *Batch, msg *Message, events []rules.Event, err error) {
	keys := b.fallbackKeys[:0]
	covered := true
	st := p.batchRules(b)
	rs := st.rules
	for i := range events {
		if events[i].Table != "" {
			keys = rs.FallbackKeys(keys, events[i].Database, events[i].Table)
			keys = rs.GenerationKeys(keys, events[i].Database, events[i].Table)
			covered = covered && rs.Covered(events[i].Database, events[i].Table)
		}
	}
	if len(events) == 0 {
		var de *decode.DecodeError
		if errors.As(err, &de) && de.Table != "" {
			keys = rs.FallbackKeys(keys, de.Database, de.Table)
			keys = rs.GenerationKeys(keys, de.Database, de.Table)
			covered = rs.Covered(de.Database, de.Table)
		} else {
			keys = p.coverKeysOfTopic(st, keys, msg.Pos.Topic)
			covered = p.topicCovered(st, msg.Pos.Topic)
		}
	}
	for _, k := range keys {
		b.planned = append(b.planned, rs.FallbackOp(k, msg.Pos))
	}
	b.fallbackKeys = keys
	p.countLost(LostPoison, covered && len(keys) > 0)
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

// CoverGap bumps the fallback namespaces and the generations of every
// table of topic because records of its partition were never read
// (reason LostRetention or LostOffsetReset), retrying until the bumps are
// applied, ctx ends or ctx's write guard refuses (cacheops.WithGuard; the
// error is then ctx's or the refusal, and the gap is not counted: whoever
// covers it later counts it). It reports whether the bumps covered every
// rule of those tables (rules.RuleSet.Covered).
func (p *Pipeline) CoverGap(ctx context.Context, topic, reason string, src rules.Position) (bool, error) {
	st := p.rules.Load()
	keys := p.coverKeysOfTopic(st, nil, topic)
	covered := p.topicCovered(st, topic) && len(keys) > 0
	if len(keys) == 0 {
		p.countLost(reason, false)
		return false, nil
	}
	b := &Batch{}
	for _, k := range keys {
		b.Ops = append(b.Ops, st.rules.FallbackOp(k, src))
	}
	if err := p.applyOps(ctx, b); err != nil {
		return covered, err
	}
	p.countLost(reason, covered)
	return covered, nil
}

// fallbackFor returns the bump that covers op when op failed
// permanently: its table's generation for a set or counter op, its
// rule's fallback namespace for a bump; ok false when neither covers its
// rule (a fallback or generation bump has none of its own).
func fallbackFor(rs *rules.RuleSet, op *rules.Op) (rules.Op, bool) {
	switch {
	case op.Rule == nil:
		return rules.Op{}, false
	case op.Rule.Generation != "":
		return rs.GenerationOp(op.Rule.Generation, op.Source), true
	case op.Rule.Fallback != "":
		return rs.FallbackOp(op.Rule.Fallback, op.Source), true
	}
	return rules.Op{}, false
}
