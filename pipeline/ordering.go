package pipeline

import (
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
)

// What the daemon does with the changes of a set rule whose changes may
// arrive out of order (Config.UnorderedSets, config
// kafka.unordered_sets).
const (
	// UnorderedSetsDelete deletes the set instead of appending tokens: a
	// missing set is always correct, and deletes give the same end state
	// in any order (the default).
	UnorderedSetsDelete = "delete"
	// UnorderedSetsAppend appends tokens anyway, for operators who know
	// their changes are ordered by other means.
	UnorderedSetsAppend = "append"
)

// orderGuard decides, per topic and set rule, whether the rule's changes
// of one membership reach the daemon in order. A set's membership of a
// member is decided by the last token appended for it, and partitions are
// consumed independently: two changes of one (key, member) on different
// partitions may be applied in either order. They share a partition when
// the message key (which the producer hashes to pick the partition) is
// made of columns of the set's key and member only, or names only the
// table, or when the topic has one partition.
//
// Only the daemon's pipeline judges (once Pipeline.SetPartitionCounts was
// called); replay rebuilds or deletes every set it touches at its end.
//
// It is safe for concurrent use.
type orderGuard struct {
	policy string
	log    *slog.Logger
	m      *Metrics
	// partitions are the topics' partition counts, once known.
	partitions atomic.Pointer[map[string]int]

	mu      sync.Mutex
	decided map[orderKey]bool // true: unordered
}

type orderKey struct {
	topic string
	rule  *rules.Rule
}

// setPartitions records the topics' partition counts.
func (g *orderGuard) setPartitions(counts map[string]int) { g.partitions.Store(&counts) }

// unordered reports whether changes of set rule r read from topic may
// arrive out of order, judging from msgKey, a message of that topic and
// rule, whose columns dec (the topic's decoder) reads. The first answer for a topic and rule is kept.
func (g *orderGuard) unordered(topic string, r *rules.Rule, msgKey []byte, dec *decode.Decoder) bool {
	k := orderKey{topic, r}
	g.mu.Lock()
	defer g.mu.Unlock()
	if v, ok := g.decided[k]; ok {
		return v
	}
	if g.decided == nil {
		g.decided = make(map[orderKey]bool)
	}
	counts := g.partitions.Load()
	if counts == nil {
		// Not consuming as a group (replay: it rebuilds or deletes every
		// set it touches at its end): nothing to judge.
		return false
	}
	if (*counts)[topic] == 1 {
		g.decided[k] = false
		return false
	}
	cols, perTable, named := dec.KeyColumns(msgKey)
	need := append(slices.Clone(r.Key.Columns()), r.Member.Columns()...)
	// A key naming the table (Maxwell or Canal partitioning by table or
	// database) sends every change of the table to one partition.
	perTable = perTable || string(msgKey) == r.Table || (r.Database != "" && string(msgKey) == r.Database+"."+r.Table)
	unordered := !perTable && (!named || slices.ContainsFunc(cols, func(c string) bool { return !slices.Contains(need, c) }))
	g.decided[k] = unordered
	if unordered {
		g.report(topic, r, cols, need)
	}
	return unordered
}

func (g *orderGuard) report(topic string, r *rules.Rule, cols, need []string) {
	g.m.unorderedSets.WithLabelValues(r.Name, topic).Set(1)
	seen := "none (the key is not a JSON object of columns)"
	if len(cols) > 0 {
		seen = strings.Join(cols, ",")
	}
	action := "the set is deleted instead of appended to (kafka.unordered_sets: delete); readers load it again"
	if g.policy == UnorderedSetsAppend {
		action = "tokens are appended anyway (kafka.unordered_sets: append): the set may end wrong"
	}
	g.log.Error("set rule: changes of one member may arrive out of order: the topic has several partitions and its message key is not made of the set's key and member columns; "+
		action+"; key the topic by those columns (Debezium message.key.columns) or use one partition (docs/operations.md, \"Ordering across partitions\")",
		"rule", r.Name, "file", r.File, "topic", topic, "key_columns_seen", seen, "set_columns", strings.Join(need, ","))
}

// guardOrder turns the set changes among ops of rules whose changes on
// msg's topic may be unordered into deletes of their sets (with policy
// delete).
func (p *Pipeline) guardOrder(ops []rules.Op, msg *Message) {
	for i := range ops {
		op := &ops[i]
		if op.Kind != rules.OpSetAdd && op.Kind != rules.OpSetRemove {
			continue
		}
		if p.order.unordered(msg.Pos.Topic, op.Rule, msg.Key, p.decoderFor(msg.Pos.Topic)) && p.order.policy != UnorderedSetsAppend {
			op.Kind, op.Member = rules.OpSetDelete, ""
		}
	}
}
