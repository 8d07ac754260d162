// Package inspect is the operator's view of single cache items: what
// memcached holds for one entity of a rule and what it means (Pool.Key,
// behind `cachewarden key`), and invalidation by hand of an entity or of
// a whole table (Pool.EntityOps, Pool.TableOps and Pool.Apply, behind
// `cachewarden invalidate`).
//
// It builds no key of its own: keys come from the rules package exactly
// as the planner renders them (rules.Rule.EntityOps: hashed long keys,
// hot-key copies, keys of earlier releases, counters under their table's
// generation), servers from the configured distribution
// (itemformat.Selector), item meanings from itemformat and counters, and
// the comparison with MySQL from verify. Ops go through the daemon's own
// Applier.
//
// A Pool is one memcached pool, described by one daemon config; sites
// with several pools (docs/operations.md, "Several memcached pools") pass
// one Pool per config. Pools are safe for concurrent use when their
// Cache, Applier and Truth are.
package inspect

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/verify"
)

// Cache reads items from memcached, each from the server the pool's
// distribution picks; *memcache.Client satisfies it.
type Cache interface {
	GetMulti(keys []string) (map[string]*memcache.Item, error)
}

// Applier applies ops to memcached; *cacheops.Applier (the daemon's)
// satisfies it.
type Applier interface {
	Apply(ctx context.Context, ops []rules.Op, results []cacheops.Result) error
}

// Pool is one memcached pool and the rules of the daemon that keeps it.
type Pool struct {
	// Name identifies the pool in reports and logs (the config file).
	Name string
	// Rules are the pool's daemon's rules.
	Rules *rules.RuleSet
	// Servers names the server of each key (the daemon's distribution).
	Servers *itemformat.Selector
	// Cache reads the pool's items.
	Cache Cache
	// Applier writes to the pool; needed by Apply only.
	Applier Applier
	// Truth runs load and recount queries; nil when the config has no
	// MySQL DSN (Key then says nothing of MySQL).
	Truth verify.Truth
}

// server names the server that holds key in p.
func (p *Pool) server(key string) string {
	addr, err := p.Servers.PickServer(key)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	return addr.String()
}

// Rule returns the rule of p named name; the error lists p's rules.
func (p *Pool) Rule(name string) (*rules.Rule, error) {
	if r := p.Rules.Rule(name); r != nil {
		return r, nil
	}
	var names []string
	for _, r := range p.Rules.Rules() {
		names = append(names, r.Name)
	}
	return nil, fmt.Errorf("pool %s: no rule named %q (rules: %s)", p.Name, name, strings.Join(names, ", "))
}

// entity resolves the rule named ruleName in p and the entity args name
// (rules.Rule.EntityRow), and returns its ops as the planner keys them
// (rules.Rule.EntityOps).
func (p *Pool) entity(ruleName string, args []string) (*rules.Rule, rules.Row, []rules.Op, error) {
	r, err := p.Rule(ruleName)
	if err != nil {
		return nil, nil, nil, err
	}
	row, err := r.EntityRow(args)
	if err != nil {
		return nil, nil, nil, err
	}
	ops, err := r.EntityOps(row)
	if err != nil {
		return nil, nil, nil, err
	}
	return r, row, ops, nil
}

// generation reads the current generation of r's table: ok is false
// when the item is missing or holds no generation (no set or counter of
// the table is then valid).
func (p *Pool) generation(r *rules.Rule) (gen uint64, item *memcache.Item, ok bool, err error) {
	items, err := p.Cache.GetMulti([]string{r.Generation})
	if err != nil {
		return 0, nil, false, fmt.Errorf("pool %s: read generation %q from %s: %w", p.Name, r.Generation, p.server(r.Generation), err)
	}
	item = items[r.Generation]
	if item == nil {
		return 0, nil, false, nil
	}
	gen, ok = itemformat.ParseGeneration(item.Value)
	return gen, item, ok, nil
}

// EntityOps returns the ops that invalidate the entity of the rule named
// ruleName given by "column=value" args (rules.Rule.EntityRow): the
// namespace's bumps, or the delete of the set or counter. A counter is
// deleted at its key under the table's current generation, read here;
// when the generation is missing no counter of the table is valid and
// only the deletes of keys of earlier releases remain.
func (p *Pool) EntityOps(ctx context.Context, ruleName string, args []string) ([]rules.Op, error) {
	r, _, ops, err := p.entity(ruleName, args)
	if err != nil {
		return nil, err
	}
	if r.Kind != rules.CountRule || r.Generation == "" {
		return ops, nil
	}
	gen, _, ok, err := p.generation(r)
	if err != nil {
		return nil, err
	}
	out := ops[:0]
	for _, op := range ops {
		if !op.Legacy {
			if !ok {
				continue
			}
			op.Key = itemformat.CounterKey(op.Key, gen)
		}
		out = append(out, op)
	}
	return out, nil
}

// TableOps returns the bumps that invalidate everything cached of a
// table, as the daemon does for a change of it that was lost: its
// fallback namespaces and the generation of its sets and counters
// (rules.RuleSet.FallbackKeys and GenerationKeys). table is "db.table",
// or "table" for every database. It is an error when no rule of p
// covers the table that way.
func (p *Pool) TableOps(table string) ([]rules.Op, error) {
	db, name, dotted := strings.Cut(table, ".")
	if !dotted {
		db, name = "", table
	}
	if name == "" {
		return nil, fmt.Errorf("table %q: want db.table or table", table)
	}
	var ops []rules.Op
	for _, k := range p.Rules.FallbackKeys(nil, db, name) {
		ops = append(ops, p.Rules.FallbackOp(k, rules.Position{}))
	}
	for _, k := range p.Rules.GenerationKeys(nil, db, name) {
		ops = append(ops, p.Rules.GenerationOp(k, rules.Position{}))
	}
	if len(ops) == 0 {
		return nil, fmt.Errorf("pool %s: no rule of table %q has a fallback namespace or a generation (rules cover tables %s)",
			p.Name, table, strings.Join(p.Rules.Tables(), ", "))
	}
	return ops, nil
}

// Action is one op of an invalidation and what became of it.
type Action struct {
	Pool   string `json:"pool"`
	Rule   string `json:"rule"`
	Op     string `json:"op"`
	Key    string `json:"key"`
	Server string `json:"server"`
	// Result is the op's outcome ("bumped", "deleted", ...), "dry run"
	// when nothing was sent, or "failed".
	Result string `json:"result"`
	// Error says why the op failed; "" when it did not.
	Error string `json:"error,omitempty"`
}

// opName names what an op of an invalidation does.
func opName(op rules.Op) string {
	if op.Kind == rules.OpBump {
		return "bump"
	}
	return "delete"
}

// Apply applies ops to p through its Applier (nothing with dryRun) and
// logs one line per op with pool, rule, op, key, server and result, at
// error level when the op failed. It returns the actions in op order;
// their Result and Error say what failed.
func (p *Pool) Apply(ctx context.Context, ops []rules.Op, dryRun bool, log *slog.Logger) []Action {
	acts := make([]Action, len(ops))
	for i, op := range ops {
		acts[i] = Action{Pool: p.Name, Rule: op.Rule.Name, Op: opName(op), Key: op.Key, Server: p.server(op.Key), Result: "dry run"}
	}
	if !dryRun {
		results := make([]cacheops.Result, len(ops))
		// Failed ops are in results; the joined error adds nothing.
		_ = p.Applier.Apply(ctx, ops, results)
		for i, res := range results {
			acts[i].Result = res.Outcome.String()
			if res.Err != nil {
				acts[i].Error = res.Err.Error()
			}
		}
	}
	for _, a := range acts {
		level, msg := slog.LevelInfo, "invalidated by hand"
		switch {
		case dryRun:
			msg = "would invalidate by hand"
		case a.Error != "":
			level, msg = slog.LevelError, "invalidation by hand failed"
		}
		attrs := []any{"pool", a.Pool, "rule", a.Rule, "op", a.Op, "key", a.Key, "server", a.Server, "result", a.Result}
		if a.Error != "" {
			attrs = append(attrs, "error", a.Error)
		}
		log.Log(ctx, level, msg, attrs...)
	}
	return acts
}
