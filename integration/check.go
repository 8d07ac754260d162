package integration

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/counters"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/verify"
)

// Warmed is what an application read into the cache before the workload.
type Warmed struct {
	// Namespaces holds the version of every namespace read, by key.
	Namespaces map[string]uint64
	// Sets and Counters list the keys filled through the read side.
	Sets, Counters []string
}

// Warm reads the cache as an application would before the workload runs,
// through the client package: the namespace of every entity of the
// snapshot that a bump rule covers (created when missing), and the first
// and about share (0..1) of the others of the sets and counters the rules'
// keys queries list (loaded or recounted from the database when missing).
// Items the daemon later changes in place are then present, which makes
// the final check meaningful. Counters are read with counters.Get, which
// fences its recounts as the daemon does.
func Warm(ctx context.Context, rs *rules.RuleSet, cl *client.Client, db *counters.MySQL, snapshot []Change, share float64, rng *rand.Rand) (*Warmed, error) {
	w := &Warmed{Namespaces: map[string]uint64{}}
	if err := w.warmNamespaces(ctx, rs, cl, snapshot); err != nil {
		return nil, err
	}
	ctrs := counters.New(cl.Memcache(), db, counters.Config{}, nil)
	for _, r := range rs.Rules() {
		if (r.Kind != rules.SetRule && r.Kind != rules.CountRule) || r.Query == "" || (r.Keys == "" && r.Key.HasPlaceholders()) {
			continue
		}
		first := true
		err := verify.ListKeys(ctx, db.DB(), r, func(key string, args []rules.Value) error {
			// The first key of each rule is always warmed, so that every
			// rule has a present item for the final check to judge.
			if !first && rng.Float64() >= share {
				return nil
			}
			first = false
			if r.Kind == rules.CountRule {
				return w.warmCounter(ctx, cl, ctrs, r, key, args)
			}
			return w.warmSet(ctx, cl, r, key, args)
		}, nil)
		if err != nil {
			return nil, fmt.Errorf("integration: warm rule %q: %w", r.Name, err)
		}
	}
	return w, nil
}

// warmNamespaces reads, through cl, the namespace of every entity of the
// snapshot that a bump rule of rs covers, recording its version in
// w.Namespaces.
func (w *Warmed) warmNamespaces(ctx context.Context, rs *rules.RuleSet, cl *client.Client, snapshot []Change) error {
	var ops []rules.Op
	for i := range snapshot {
		ev := snapshot[i].Event
		ev.Operation = rules.Insert // every bump rule, whatever its `on`
		var err error
		ops, _, err = rs.Plan(ops[:0], &ev)
		if err != nil {
			return fmt.Errorf("integration: warm: plan %s.%s: %w", ev.Database, ev.Table, err)
		}
		row := clientRow(ev.After)
		for _, op := range ops {
			if op.Kind != rules.OpBump {
				continue
			}
			if _, seen := w.Namespaces[op.Key]; seen {
				continue
			}
			if err := w.warmNamespace(ctx, cl, op, row); err != nil {
				return err
			}
		}
	}
	return nil
}

// warmNamespace reads the namespace of the bump op through cl, for the
// row it was planned from, and records its version.
func (w *Warmed) warmNamespace(ctx context.Context, cl *client.Client, op rules.Op, row client.Row) error {
	if k, err := cl.Key(op.Rule.Name, row); err != nil || k != op.Key {
		return fmt.Errorf("integration: warm: the client's key %q (%v) is not the daemon's %q", k, err, op.Key)
	}
	v, err := cl.Namespace(ctx, op.Rule.Name, row)
	if err != nil {
		return fmt.Errorf("integration: warm namespace %q: %w", op.Key, err)
	}
	if w.Namespaces[op.Key], err = strconv.ParseUint(v, 10, 64); err != nil {
		return fmt.Errorf("integration: warm namespace %q: version %q: %w", op.Key, v, err)
	}
	return nil
}

// warmCounter reads the counter of count rule r at key, args being its
// query's arguments, recounting it when missing.
func (w *Warmed) warmCounter(ctx context.Context, cl *client.Client, ctrs *counters.Counters, r *rules.Rule, key string, args []rules.Value) error {
	bound := make([]any, len(args))
	for i, a := range args {
		bound[i] = a
	}
	// Counters live under their table's generation
	// (docs/formats.md, "Generations").
	gen, err := Generation(cl.Memcache(), r.Generation)
	if err != nil {
		return err
	}
	key = itemformat.CounterKey(key, gen)
	if _, err := ctrs.Get(ctx, key, r.Query, bound...); err != nil {
		return err
	}
	w.Counters = append(w.Counters, key)
	return nil
}

// warmSet reads the set of set rule r at key through cl, loading it when
// missing; args are the values of the key's placeholders.
func (w *Warmed) warmSet(ctx context.Context, cl *client.Client, r *rules.Rule, key string, args []rules.Value) error {
	// args are the values of the key's placeholders, in order of
	// first appearance: the row the client renders the key from.
	row := client.Row{}
	for _, c := range r.Key.Columns() {
		if _, done := row[c]; !done && len(row) < len(args) {
			row[c] = args[len(row)]
		}
	}
	if k, err := cl.Key(r.Name, row); err != nil || k != key {
		return fmt.Errorf("the client's key %q (%v) is not %q", k, err, key)
	}
	if _, err := cl.Members(ctx, r.Name, row); err != nil {
		return err
	}
	w.Sets = append(w.Sets, key)
	return nil
}

// Generation returns the generation at key (a rule's Generation key),
// creating it when missing as readers do.
func Generation(mc *memcache.Client, key string) (uint64, error) {
	for range 3 {
		it, err := mc.Get(key)
		if err == nil {
			if g, ok := itemformat.ParseGeneration(it.Value); ok {
				return g, nil
			}
			return 0, fmt.Errorf("integration: generation %q holds %q", key, it.Value)
		}
		if !errors.Is(err, memcache.ErrCacheMiss) {
			return 0, fmt.Errorf("integration: generation %q: %w", key, err)
		}
		g := itemformat.NewGeneration(time.Now())
		err = mc.Add(&memcache.Item{Key: key, Value: strconv.AppendUint(nil, g, 10)})
		if err == nil {
			return g, nil
		}
		if !errors.Is(err, memcache.ErrNotStored) {
			return 0, fmt.Errorf("integration: generation %q: %w", key, err)
		}
	}
	return 0, fmt.Errorf("integration: generation %q keeps vanishing", key)
}

// CounterItemKey returns the key of the counter a planned count op
// addresses, under its table's current generation (Generation).
func CounterItemKey(mc *memcache.Client, op *rules.Op) (string, error) {
	if op.Rule == nil || op.Rule.Generation == "" {
		return op.Key, nil
	}
	gen, err := Generation(mc, op.Rule.Generation)
	if err != nil {
		return "", err
	}
	return itemformat.CounterKey(op.Key, gen), nil
}

// clientRow converts a row image to the client's Row.
func clientRow(r rules.Row) client.Row {
	row := make(client.Row, len(r))
	for _, c := range r {
		row[c.Name] = c.Value
	}
	return row
}

// PlanOps returns the ops the rules plan for the transactions' changes as
// published in format f, planned as the daemon plans them (before
// coalescing).
func PlanOps(rs *rules.RuleSet, f Format, txs []Tx) ([]rules.Op, error) {
	var ops []rules.Op
	for _, tx := range txs {
		for _, ev := range f.Events(tx.Changes) {
			var err error
			ops, _, err = rs.Plan(ops, &ev)
			if err != nil {
				return nil, fmt.Errorf("integration: plan %q: %w", tx.Desc, err)
			}
		}
	}
	return ops, nil
}

// ExpectedBumps returns the namespace keys the rules bump for the
// transactions' changes as published in format f.
func ExpectedBumps(rs *rules.RuleSet, f Format, txs []Tx) (map[string]bool, error) {
	ops, err := PlanOps(rs, f, txs)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, op := range ops {
		if op.Kind == rules.OpBump {
			out[op.Key] = true
		}
	}
	return out, nil
}

// NamespaceReport is the outcome of CheckNamespaces.
type NamespaceReport struct {
	// Moved counts expected bumps that happened; Stayed counts warmed
	// namespaces that no change concerned and that kept their version.
	Moved, Stayed int
	// Problems describes every namespace that did not do what it should.
	Problems []string
}

// OK reports whether every namespace behaved.
func (r *NamespaceReport) OK() bool { return len(r.Problems) == 0 }

// CheckNamespaces checks that every namespace in bumped moved: it exists
// and, when it was warmed, its version differs from the warmed one; and
// that every warmed namespace in neither bumped nor unsettled kept its
// version. unsettled holds keys that may move for reasons the check does
// not follow (a delayed second bump of a change made before warming).
func CheckNamespaces(mc *memcache.Client, warmed map[string]uint64, bumped, unsettled map[string]bool) (*NamespaceReport, error) {
	keys := make([]string, 0, len(bumped)+len(warmed))
	for k := range bumped {
		keys = append(keys, k)
	}
	for k := range warmed {
		if !bumped[k] && !unsettled[k] {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	rep := &NamespaceReport{}
	for len(keys) > 0 {
		n := min(100, len(keys))
		items, err := mc.GetMulti(keys[:n])
		if err != nil {
			return nil, fmt.Errorf("integration: read namespaces: %w", err)
		}
		for _, k := range keys[:n] {
			it, present := items[k]
			var now uint64
			if present {
				v, err := strconv.ParseUint(string(trimSpaces(it.Value)), 10, 64)
				if err != nil {
					rep.Problems = append(rep.Problems, fmt.Sprintf("%s holds %q, not a version", k, it.Value))
					continue
				}
				now = v
			}
			before, wasWarmed := warmed[k]
			switch {
			case bumped[k] && !present:
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s should have been bumped but is missing", k))
			case bumped[k] && wasWarmed && now == before:
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s should have been bumped but still holds %d", k, now))
			case bumped[k]:
				rep.Moved++
			case !present:
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s vanished (was %d); nothing should have touched it", k, before))
			case now != before:
				rep.Problems = append(rep.Problems, fmt.Sprintf("%s moved from %d to %d; nothing should have bumped it", k, before, now))
			default:
				rep.Stayed++
			}
		}
		keys = keys[n:]
	}
	return rep, nil
}

func trimSpaces(b []byte) []byte {
	for len(b) > 0 && b[len(b)-1] == ' ' {
		b = b[:len(b)-1]
	}
	return b
}
