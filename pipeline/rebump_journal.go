package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// The rebump journal (docs/operations.md, "Delayed bumps and crashes")
// keeps the Rebumper's pending delayed bumps in memcached, so that a
// daemon restarted after a crash, or another daemon of its group, finds
// and applies them.
//
// A journal item is a token log (cacheops.TokenLog) under the key
//
//	<rule file prefix>%rebump:<escaped consumer group>:<shard>
//
// passed through rules.FinishKey, one per rule file prefix (every rule's
// prefix: a deployment whose rule files use different prefixes keeps one
// journal per prefix), and RebumpJournalShards shards per prefix: a batch
// of partition p writes to shard p mod RebumpJournalShards, so one batch
// appends to one item per prefix. "%rebump:" is one of the daemon's key
// marks (rules.CheckLiteral): no rendered key holds '%' followed by
// anything but two upper-case hex digits, so no row value or template
// spells a journal key.
//
// Each pending bump is a member "<due unix ms> <rule> <key>", escaped with
// rules.Escape, added ("+") before the batch that scheduled it is
// committed and removed ("-") once the bump was applied, or in the same
// append that adds the member of the key's later bump, which replaces it:
// the journal holds one member per pending bump.

// RebumpJournalShards is the number of journal items per rule file prefix.
const RebumpJournalShards = 16

// rebumpJournalInfix separates a journal key's prefix from its group.
const rebumpJournalInfix = "%rebump:"

// RebumpJournalKey returns the key of the journal item of prefix (a rule
// file's prefix), consumer group and shard (0 to RebumpJournalShards-1).
func RebumpJournalKey(prefix, group string, shard int) string {
	b := make([]byte, 0, len(prefix)+len(rebumpJournalInfix)+len(group)+4)
	b = append(b, prefix...)
	b = append(b, rebumpJournalInfix...)
	b = append(b, rules.Escape(group)...)
	b = append(b, ':')
	b = strconv.AppendInt(b, int64(shard), 10)
	return rules.FinishKey(b)
}

// PendingRebump is a delayed bump recorded in a journal.
type PendingRebump struct {
	// Journal is the key of the journal item holding it.
	Journal string
	// Due is when the bump is due; Rule names the rule and Key the
	// namespace key to bump.
	Due  time.Time
	Rule string
	Key  string
	// member is the escaped journal member.
	member string
}

// rebumpMember returns the escaped journal member of a bump.
func rebumpMember(due time.Time, rule, key string) string {
	return rules.Escape(strconv.FormatInt(due.UnixMilli(), 10) + " " + rule + " " + key)
}

// parseRebumpMember reads a journal member.
func parseRebumpMember(journal, member string) (PendingRebump, error) {
	raw := itemformat.Unescape(member)
	ms, rest, ok1 := strings.Cut(raw, " ")
	i := strings.LastIndexByte(rest, ' ')
	n, err := strconv.ParseInt(ms, 10, 64)
	if !ok1 || i <= 0 || i == len(rest)-1 || err != nil || n <= 0 {
		return PendingRebump{}, fmt.Errorf("pipeline: rebump journal %q: member %.80q is not \"<due ms> <rule> <key>\"", journal, raw)
	}
	return PendingRebump{Journal: journal, Due: time.UnixMilli(n), Rule: rest[:i], Key: rest[i+1:], member: member}, nil
}

// journalStore is what the journal needs of memcached (a
// *cacheops.TokenLog).
type journalStore interface {
	Append(key string, tokens []byte) error
	Members(keys []string) (map[string][]string, error)
	Compact(key string) (int, error)
}

// rebumpJournalCompactBytes is how many bytes of tokens are appended to a
// journal item before it is compacted, or its size as last compacted when
// that is more (so compaction costs a constant share of what is
// appended). With one entry per pending bump, an item then stays below
// twice its live entries plus this.
const rebumpJournalCompactBytes = 16 << 10

// rebumpJournal writes and reads the journal items of one consumer group.
type rebumpJournal struct {
	store journalStore
	group string
	// prefixes are the rule file prefixes, sorted; rules the rules by
	// name, to rebuild the ops of recovered bumps.
	prefixes []string
	rules    map[string]*rules.Rule

	mu sync.Mutex
	// grown is what was appended to each item since it was last
	// compacted, compacted its size then.
	grown, compacted map[string]int
}

func newRebumpJournal(store journalStore, rs *rules.RuleSet, group string) *rebumpJournal {
	j := &rebumpJournal{store: store, group: group, rules: make(map[string]*rules.Rule),
		grown: make(map[string]int), compacted: make(map[string]int)}
	for _, r := range rs.Rules() {
		j.rules[r.Name] = r
		if !slices.Contains(j.prefixes, r.Prefix) {
			j.prefixes = append(j.prefixes, r.Prefix)
		}
	}
	slices.Sort(j.prefixes)
	return j
}

// journalEntry is where one pending bump is recorded.
type journalEntry struct {
	item, member string
}

// entryFor returns the journal entry of a bump of op due at due.
func (j *rebumpJournal) entryFor(op *rules.Op, due time.Time) journalEntry {
	shard := op.Source.Partition % RebumpJournalShards
	if shard < 0 {
		shard = -shard
	}
	return journalEntry{
		item:   RebumpJournalKey(op.Rule.Prefix, j.group, shard),
		member: rebumpMember(due, op.Rule.Name, op.Key),
	}
}

// write adds the entries of plan to the journal, removing the entries
// they replace in the same appends (one append per item, adds first). It
// returns the items memcached refused as too large even compacted
// (cacheops.ErrTooLarge), and every error joined.
func (j *rebumpJournal) write(plan []plannedRebump) (full []string, err error) {
	var w journalWrite
	for _, p := range plan {
		w.token(p.entry, true)
	}
	for _, p := range plan {
		if p.replaces != (journalEntry{}) {
			w.token(p.replaces, false)
		}
	}
	return j.flush(&w)
}

// remove removes entries from the journal; it returns the errors joined.
func (j *rebumpJournal) remove(entries []journalEntry) error {
	var w journalWrite
	for _, e := range entries {
		w.token(e, false)
	}
	_, err := j.flush(&w)
	return err
}

// journalWrite collects the tokens of one write, by item.
type journalWrite struct {
	byItem map[string][]byte
	order  []string
}

func (w *journalWrite) token(e journalEntry, add bool) {
	if w.byItem == nil {
		w.byItem = make(map[string][]byte)
	}
	if _, ok := w.byItem[e.item]; !ok {
		w.order = append(w.order, e.item)
	}
	w.byItem[e.item] = itemformat.AppendEscapedToken(w.byItem[e.item], add, e.member)
}

// flush appends the tokens of w, one append per item, and compacts the
// items that grew enough (rebumpJournalCompactBytes). It returns the
// items memcached refused as too large, and every append error joined.
func (j *rebumpJournal) flush(w *journalWrite) (full []string, err error) {
	var errs []error
	for _, item := range w.order {
		tokens := w.byItem[item]
		if err := j.store.Append(item, tokens); err != nil {
			if errors.Is(err, cacheops.ErrTooLarge) {
				full = append(full, item)
			}
			errs = append(errs, err)
			continue
		}
		if j.grew(item, len(tokens)) {
			// A failure leaves the item as it is: it is compacted when
			// full, or by the next read or compaction.
			size, err := j.store.Compact(item)
			j.mu.Lock()
			if err == nil {
				j.compacted[item] = size
			}
			j.mu.Unlock()
		}
	}
	return full, errors.Join(errs...)
}

// grew counts n bytes appended to item and reports whether the item is
// due a compaction (then counting starts again).
func (j *rebumpJournal) grew(item string, n int) bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.grown[item] += n
	if j.grown[item] < max(rebumpJournalCompactBytes, j.compacted[item]) {
		return false
	}
	j.grown[item] = 0
	return true
}

// keys returns every journal item key of the group.
func (j *rebumpJournal) keys() []string {
	out := make([]string, 0, len(j.prefixes)*RebumpJournalShards)
	for _, p := range j.prefixes {
		for shard := range RebumpJournalShards {
			out = append(out, RebumpJournalKey(p, j.group, shard))
		}
	}
	return out
}

// read returns the pending bumps recorded in the journal, and the members
// that could not be read (which the caller removes).
func (j *rebumpJournal) read() (pending []PendingRebump, bad []journalEntry, err error) {
	logs, err := j.store.Members(j.keys())
	if err != nil {
		return nil, nil, err
	}
	for item, members := range logs {
		for _, m := range members {
			pr, err := parseRebumpMember(item, m)
			if err != nil {
				bad = append(bad, journalEntry{item: item, member: m})
				continue
			}
			pending = append(pending, pr)
		}
	}
	slices.SortFunc(pending, func(a, b PendingRebump) int { return a.Due.Compare(b.Due) })
	return pending, bad, nil
}

// op returns the bump op of a recovered entry: its rule when still
// loaded, else a rule of that name without TTL (the bump is still due:
// a namespace that is missing is created without expiry).
func (j *rebumpJournal) op(pr PendingRebump) rules.Op {
	r := j.rules[pr.Rule]
	if r == nil || r.Kind != rules.BumpRule {
		r = &rules.Rule{Name: pr.Rule, Kind: rules.BumpRule}
	}
	return rules.Op{Kind: rules.OpBump, Rule: r, Key: pr.Key}
}

// PendingRebumps reads the delayed bumps that the daemons of group have
// recorded and not yet applied, sorted by due time: what a daemon that
// starts would apply. rs gives the rule file prefixes (the journals).
func PendingRebumps(store journalStore, rs *rules.RuleSet, group string) ([]PendingRebump, error) {
	pending, _, err := newRebumpJournal(store, rs, group).read()
	return pending, err
}
