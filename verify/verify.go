// Package verify compares the sets and counters cachewarden keeps in
// memcached with what MySQL says they should hold.
//
// For every set and count rule with a `keys` query, the keys are listed by
// running that query (each row holds the key template's placeholder
// values); the rule's own load or recount query, bound exactly as the
// daemon binds it, gives the truth for each key. A missing item is always
// consistent (readers fill it from MySQL); a present item must equal the
// truth: a counter its count, a set its members (compared as sets, order
// and duplicates ignored). A rule whose key has no placeholders is checked
// at its single key without a keys query.
//
// Keys are rebuilt from the values MySQL returns as text. Integer and
// string columns give the same text as change events do, so the keys are
// the daemon's; columns whose text differs between the two (dates, floats)
// should not be used in key templates that are verified.
//
// On a live system an item can be checked between a database commit and
// the moment the daemon applies it. Options.Recheck re-reads mismatched
// keys (both sides) after a delay and counts only those still wrong.
//
// It only reads and repairs nothing. It is not the daemon's continuous,
// sampling check (package observer), nor a check of the deployment before
// it runs (package check).
package verify

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math/big"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Cache reads items from memcached; *memcache.Client satisfies it.
type Cache interface {
	GetMulti(keys []string) (map[string]*memcache.Item, error)
}

// Truth runs rules' recount and load queries, binding arguments the way
// the daemon does; *counters.MySQL satisfies it.
type Truth interface {
	Count(ctx context.Context, query string, args []rules.Value) (int64, error)
	LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error)
}

// Querier runs keys queries; *sql.DB satisfies it.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Defaults for Options fields left at zero.
const (
	DefaultConcurrency   = 4
	DefaultMaxMismatches = 100
	// chunk is how many keys are read from memcached in one GetMulti.
	chunk = 128
)

// Options tune a verification run.
type Options struct {
	// Rules names the rules to check; empty means every set and count
	// rule that can be checked (the others are listed as skipped). A named
	// rule that cannot be checked is an error.
	Rules []string
	// Sample, when positive, checks at most this many keys per rule,
	// chosen uniformly at random among those the keys query lists;
	// 0 checks every key.
	Sample int
	// Rand is the source for sampling; nil uses a randomly seeded one.
	Rand *rand.Rand
	// Recheck, when positive, re-reads a mismatched key from memcached and
	// MySQL after this delay and counts it wrong only if it still differs.
	// 0 counts the first reading.
	Recheck time.Duration
	// Concurrency is how many keys' truth queries run at once; 0 means
	// DefaultConcurrency (4).
	Concurrency int
	// MaxMismatches caps Report.Mismatches (the counts stay exact);
	// 0 means DefaultMaxMismatches (100), negative keeps none.
	MaxMismatches int
}

// Mismatch is a present item that differs from the truth.
type Mismatch struct {
	Rule string
	Key  string
	// Cached and Truth render both sides: a counter as its decimal text
	// (Cached as stored when it is not a number), a set as its escaped
	// members, sorted, space separated, in braces.
	Cached string
	Truth  string
}

// RuleReport counts one rule's keys.
type RuleReport struct {
	Rule string
	Kind rules.RuleKind
	// Listed is how many keys the keys query returned (before sampling);
	// rows with a NULL placeholder value make no key and are in NullKeys.
	Listed   int
	NullKeys int
	Checked  int
	// Missing items are consistent; Consistent counts present items
	// equal to the truth.
	Missing    int
	Consistent int
	Wrong      int
	// Skipped says why the rule was not checked; "" when it was.
	Skipped string
}

// Report is the outcome of a run.
type Report struct {
	Rules []RuleReport
	// Totals over Rules.
	Checked, Missing, Consistent, Wrong int
	// Mismatches lists wrong items in the order found, capped by
	// Options.MaxMismatches.
	Mismatches []Mismatch
	// Dropped is how many mismatches the cap left out.
	Dropped int
}

// Present returns how many checked items were in memcached: the items the
// check actually compared.
func (r *Report) Present() int { return r.Checked - r.Missing }

// MinPresent is a floor on the items a check must find present: Count
// items, or Share (0 to 1) of the checked ones; the zero value asks
// nothing.
type MinPresent struct {
	Count int
	Share float64
}

// ParseMinPresent reads "N" (items) or "P%" (percent of the checked
// items).
func ParseMinPresent(s string) (MinPresent, error) {
	if p, ok := strings.CutSuffix(s, "%"); ok {
		f, err := strconv.ParseFloat(p, 64)
		if err != nil || f < 0 || f > 100 {
			return MinPresent{}, fmt.Errorf("verify: min-present %q: want a percentage from 0%% to 100%%", s)
		}
		return MinPresent{Share: f / 100}, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 {
		return MinPresent{}, fmt.Errorf("verify: min-present %q: want a number of items or a percentage such as 50%%", s)
	}
	return MinPresent{Count: n}, nil
}

// CheckPresent returns an error when r saw fewer present items than min.
func (r *Report) CheckPresent(min MinPresent) error {
	present := r.Present()
	if present < min.Count || (min.Share > 0 && float64(present) < min.Share*float64(r.Checked)) || (min.Share > 0 && r.Checked == 0) {
		return fmt.Errorf("verify: only %d of %d checked items were present in memcached (min-present %s); the check saw too little to vouch for the cache", present, r.Checked, min)
	}
	return nil
}

// String renders min as ParseMinPresent reads it.
func (m MinPresent) String() string {
	if m.Share > 0 {
		return strconv.FormatFloat(m.Share*100, 'g', -1, 64) + "%"
	}
	return strconv.Itoa(m.Count)
}

// OK reports whether no checked item was wrong.
func (r *Report) OK() bool { return r.Wrong == 0 }

// Consistency returns the share of checked items that are consistent
// (missing or equal to the truth), from 0 to 1; 1 when nothing was
// checked.
func (r *Report) Consistency() float64 {
	if r.Checked == 0 {
		return 1
	}
	return float64(r.Checked-r.Wrong) / float64(r.Checked)
}

// Nines returns how many nines the consistency has: the largest n with
// wrong/checked <= 10^-n. It is -1 when nothing is wrong (all nines).
func (r *Report) Nines() int {
	if r.Wrong == 0 {
		return -1
	}
	n := 0
	limit := int64(r.Checked)
	for w := int64(r.Wrong) * 10; w <= limit; w *= 10 {
		n++
	}
	return n
}

// ConsistencyText renders the consistency as a percentage and in nines:
// "100.000% (all)", "99.99% (4 nines)", "66.66% (0 nines)". The
// percentage is truncated, never rounded up, so it reads 100% only when
// nothing is wrong.
func (r *Report) ConsistencyText() string {
	if r.Wrong == 0 {
		return "100.000% (all)"
	}
	n := r.Nines()
	decimals := max(2, n-2)
	// Truncate (checked-wrong)/checked*100 to decimals digits with exact
	// integers, so no rounding shows an extra nine.
	pow := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(decimals)), nil)
	units := new(big.Int).Mul(big.NewInt(int64(r.Checked-r.Wrong)), big.NewInt(100))
	units.Mul(units, pow)
	units.Quo(units, big.NewInt(int64(r.Checked)))
	whole, frac := new(big.Int).QuoRem(units, pow, new(big.Int))
	fracText := frac.Text(10)
	pct := whole.Text(10) + "." + strings.Repeat("0", decimals-len(fracText)) + fracText + "%"
	word := "nines"
	if n == 1 {
		word = "nine"
	}
	return fmt.Sprintf("%s (%d %s)", pct, n, word)
}

// Verifier checks a cache against a database. It is safe for concurrent
// use; each Verify call is independent. A rule's keys query stays open
// while its keys are checked, so when the Querier and the Truth share a
// connection pool it needs at least two connections.
type Verifier struct {
	cache Cache
	truth Truth
	db    Querier
	log   *slog.Logger
}

// New returns a Verifier. A nil logger discards.
func New(cache Cache, truth Truth, db Querier, logger *slog.Logger) *Verifier {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &Verifier{cache: cache, truth: truth, db: db, log: logger}
}

// checkable returns why rule r cannot be verified, or "".
func checkable(r *rules.Rule) string {
	switch {
	case r.Kind != rules.SetRule && r.Kind != rules.CountRule:
		return "bump rules hold no data to compare"
	case r.Query == "" && r.Kind == rules.SetRule:
		return "no load query: the truth is unknown"
	case r.Query == "":
		return "no recount query: the truth is unknown"
	case r.Key.HasPlaceholders() && r.Keys == "":
		return "no keys query to list its keys"
	}
	return ""
}

// Verify checks the rules' items and returns the report. It returns an
// error (and no report) when a named rule is unknown or cannot be checked,
// or when memcached or MySQL fails; a wrong item is not an error.
func (v *Verifier) Verify(ctx context.Context, all []*rules.Rule, opts Options) (*Report, error) {
	if opts.Concurrency <= 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MaxMismatches == 0 {
		opts.MaxMismatches = DefaultMaxMismatches
	}
	if opts.Rand == nil {
		opts.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	selected := all
	if len(opts.Rules) > 0 {
		byName := make(map[string]*rules.Rule, len(all))
		for _, r := range all {
			byName[r.Name] = r
		}
		selected = nil
		for _, name := range opts.Rules {
			r, ok := byName[name]
			if !ok {
				return nil, fmt.Errorf("verify: no rule named %q", name)
			}
			if why := checkable(r); why != "" {
				return nil, fmt.Errorf("verify: rule %q cannot be checked: %s", name, why)
			}
			selected = append(selected, r)
		}
	}
	rep := &Report{}
	for _, r := range selected {
		rr := RuleReport{Rule: r.Name, Kind: r.Kind}
		if why := checkable(r); why != "" {
			if r.Kind == rules.BumpRule {
				continue
			}
			rr.Skipped = why
			rep.Rules = append(rep.Rules, rr)
			continue
		}
		if err := v.verifyRule(ctx, r, opts, &rr, rep); err != nil {
			return nil, err
		}
		rep.Rules = append(rep.Rules, rr)
		rep.Checked += rr.Checked
		rep.Missing += rr.Missing
		rep.Consistent += rr.Consistent
		rep.Wrong += rr.Wrong
		v.log.Debug("rule verified", "rule", r.Name, "checked", rr.Checked, "missing", rr.Missing,
			"consistent", rr.Consistent, "wrong", rr.Wrong)
	}
	return rep, nil
}

// target is one key to check and the values that bind its truth query.
type target struct {
	key  string
	args []rules.Value
}

// verifyRule lists r's keys and checks them chunk by chunk.
func (v *Verifier) verifyRule(ctx context.Context, r *rules.Rule, opts Options, rr *RuleReport, rep *Report) error {
	var sample []target // reservoir when opts.Sample > 0
	var batch []target
	seen := 0
	err := ListKeys(ctx, v.db, r, func(key string, args []rules.Value) error {
		t := target{key: key, args: args}
		seen++
		if opts.Sample > 0 {
			// Algorithm R: the i-th key replaces a random slot with
			// probability Sample/i.
			if len(sample) < opts.Sample {
				sample = append(sample, t)
			} else if j := opts.Rand.IntN(seen); j < opts.Sample {
				sample[j] = t
			}
			return nil
		}
		batch = append(batch, t)
		if len(batch) < chunk {
			return nil
		}
		err := v.checkChunk(ctx, r, opts, batch, rr, rep)
		batch = batch[:0]
		return err
	}, &rr.NullKeys)
	rr.Listed = seen + rr.NullKeys
	if err != nil {
		return err
	}
	if opts.Sample > 0 {
		batch = sample
	}
	for len(batch) > 0 {
		n := min(chunk, len(batch))
		if err := v.checkChunk(ctx, r, opts, batch[:n], rr, rep); err != nil {
			return err
		}
		batch = batch[n:]
	}
	return nil
}

// ListKeys calls fn with every key of a set or count rule and the values
// that bind its load or recount query, in the order the rule's keys query
// returns them. A rule whose key has no placeholders has one key and needs
// no keys query. Rows with a NULL value make no key; they are counted in
// *nullKeys when nullKeys is not nil. An error from fn stops the listing
// and is returned as is.
func ListKeys(ctx context.Context, db Querier, r *rules.Rule, fn func(key string, args []rules.Value) error, nullKeys *int) error {
	if r.Key == nil || (r.Kind != rules.SetRule && r.Kind != rules.CountRule) {
		return fmt.Errorf("verify: rule %q is not a set or count rule", r.Name)
	}
	if !r.Key.HasPlaceholders() {
		t, err := buildTarget(r, nil)
		if err != nil {
			return fmt.Errorf("verify: rule %q: %w", r.Name, err)
		}
		return fn(t.key, t.args)
	}
	if r.Keys == "" {
		return fmt.Errorf("verify: rule %q has no keys query", r.Name)
	}
	rows, err := db.QueryContext(ctx, r.Keys)
	if err != nil {
		return fmt.Errorf("verify: rule %q: keys query: %w", r.Name, err)
	}
	defer rows.Close()
	cols := r.Key.DistinctColumns()
	types, err := rows.ColumnTypes()
	if err != nil {
		return fmt.Errorf("verify: rule %q: keys query: %w", r.Name, err)
	}
	if len(types) != len(cols) {
		return fmt.Errorf("verify: rule %q: keys query returns %d column(s), want %d (%s, the key's placeholders in order)",
			r.Name, len(types), len(cols), strings.Join(cols, ", "))
	}
	kinds := make([]rules.Kind, len(types))
	for i, ct := range types {
		kinds[i] = kindOf(ct.DatabaseTypeName())
	}
	raw := make([]sql.RawBytes, len(cols))
	dest := make([]any, len(cols))
	for i := range raw {
		dest[i] = &raw[i]
	}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return fmt.Errorf("verify: rule %q: keys query: %w", r.Name, err)
		}
		values := make(map[string]rules.Value, len(cols))
		null := false
		for i, c := range cols {
			if raw[i] == nil {
				null = true
				break
			}
			values[c] = rules.Value{Kind: kinds[i], Text: string(raw[i])}
		}
		if null {
			if nullKeys != nil {
				*nullKeys++
			}
			continue
		}
		t, err := buildTarget(r, values)
		if err != nil {
			return fmt.Errorf("verify: rule %q: %w", r.Name, err)
		}
		if err := fn(t.key, t.args); err != nil {
			return err
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("verify: rule %q: keys query: %w", r.Name, err)
	}
	return nil
}

// kindOf maps a MySQL column type name to the value kind a change event
// would carry, which decides how the value is bound to the truth query.
func kindOf(typeName string) rules.Kind {
	switch strings.TrimPrefix(strings.ToUpper(typeName), "UNSIGNED ") {
	case "TINYINT", "SMALLINT", "MEDIUMINT", "INT", "INTEGER", "BIGINT", "YEAR", "BIT":
		return rules.KindInt
	case "DECIMAL", "FLOAT", "DOUBLE", "REAL", "NUMERIC":
		return rules.KindFloat
	}
	return rules.KindString
}

// buildTarget renders r's key from values and picks the truth query's
// arguments from them.
func buildTarget(r *rules.Rule, values map[string]rules.Value) (target, error) {
	buf := append([]byte(nil), r.Prefix...)
	buf, missing, ok := r.Key.AppendRendered(buf, func(c string) (string, bool) {
		val, ok := values[c]
		return val.Text, ok
	})
	if !ok {
		return target{}, fmt.Errorf("key %q: keys query gave no value for %q", r.Key.String(), missing)
	}
	t := target{key: rules.FinishKey(buf)}
	for _, a := range r.Args {
		val, ok := values[a]
		if !ok {
			return target{}, fmt.Errorf("argument %q is not a placeholder of key %q", a, r.Key.String())
		}
		t.args = append(t.args, val)
	}
	return t, nil
}

// verdict is one key's outcome.
type verdict struct {
	missing        bool
	wrong          bool
	cached, truthS string
	// key is the item's key when it is not the target's (a counter
	// under its generation).
	key string
}

// checkChunk reads the chunk's items in one GetMulti, then compares each
// present one with its truth, opts.Concurrency at a time.
func (v *Verifier) checkChunk(ctx context.Context, r *rules.Rule, opts Options, ts []target, rr *RuleReport, rep *Report) error {
	verdicts, err := v.judge(ctx, r, opts.Concurrency, ts)
	if err != nil {
		return err
	}
	if opts.Recheck > 0 {
		var again []target
		var at []int
		for i, vd := range verdicts {
			if vd.wrong {
				again = append(again, ts[i])
				at = append(at, i)
			}
		}
		if len(again) > 0 {
			v.log.Debug("rechecking mismatches", "rule", r.Name, "keys", len(again), "after", opts.Recheck)
			select {
			case <-ctx.Done():
				return fmt.Errorf("verify: rule %q: %w", r.Name, ctx.Err())
			case <-time.After(opts.Recheck):
			}
			second, err := v.judge(ctx, r, opts.Concurrency, again)
			if err != nil {
				return err
			}
			for j, i := range at {
				verdicts[i] = second[j]
			}
		}
	}
	for i, vd := range verdicts {
		rr.Checked++
		switch {
		case vd.missing:
			rr.Missing++
		case vd.wrong:
			rr.Wrong++
			if opts.MaxMismatches > 0 && len(rep.Mismatches) < opts.MaxMismatches {
				key := ts[i].key
				if vd.key != "" {
					key = vd.key
				}
				rep.Mismatches = append(rep.Mismatches, Mismatch{Rule: r.Name, Key: key, Cached: vd.cached, Truth: vd.truthS})
			} else {
				rep.Dropped++
			}
		default:
			rr.Consistent++
		}
	}
	return nil
}

// judge reads and compares the targets' items.
func (v *Verifier) judge(ctx context.Context, r *rules.Rule, concurrency int, ts []target) ([]verdict, error) {
	// Sets and counters are valid only under their table's current
	// generation (docs/formats.md, "Generations"): a set of another
	// generation, and every item of a table whose generation item is
	// missing, counts as missing, as readers see it. Counters live at
	// their key under the generation, so it is read first.
	gen, genOK := uint64(0), false
	if r.Generation != "" {
		gi, err := v.cache.GetMulti([]string{r.Generation})
		if err != nil {
			return nil, fmt.Errorf("verify: rule %q: read generation %q from memcached: %w", r.Name, r.Generation, err)
		}
		if it := gi[r.Generation]; it != nil {
			gen, genOK = itemformat.ParseGeneration(it.Value)
		}
		if !genOK {
			out := make([]verdict, len(ts))
			for i := range out {
				out[i].missing = true
			}
			return out, nil
		}
		if r.Kind == rules.CountRule {
			stamped := make([]target, len(ts))
			for i, t := range ts {
				stamped[i] = t
				stamped[i].key = itemformat.CounterKey(t.key, gen)
			}
			ts = stamped
		}
	}
	keys := make([]string, len(ts))
	for i, t := range ts {
		keys[i] = t.key
	}
	items, err := v.cache.GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("verify: rule %q: read %d keys from memcached: %w", r.Name, len(keys), err)
	}
	out := make([]verdict, len(ts))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sem := make(chan struct{}, concurrency)
	for i, t := range ts {
		it, ok := items[t.key]
		if !ok || (genOK && r.Kind == rules.SetRule && !itemformat.DecodeSet(it.Value).ValidAt(gen)) {
			out[i].missing = true
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			vd, err := v.compare(ctx, r, t, it.Value)
			vd.key = t.key
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				return
			}
			out[i] = vd
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

// compare checks one present item against its truth.
func (v *Verifier) compare(ctx context.Context, r *rules.Rule, t target, value []byte) (verdict, error) {
	c, err := Compare(ctx, v.truth, r, t.args, value)
	if err != nil {
		return verdict{}, fmt.Errorf("verify: rule %q key %q: %w", r.Name, t.key, err)
	}
	return verdict{wrong: c.Wrong, cached: c.Cached, truthS: c.Truth}, nil
}

// Comparison is one present item compared with its truth.
type Comparison struct {
	// Wrong reports whether the item differs from the truth.
	Wrong bool
	// Cached and Truth render both sides as Mismatch does.
	Cached, Truth string
}

// Compare runs the load or recount query of r (a set or count rule with
// a query) bound to args through truth, and compares its result with
// value, the item read from memcached: a counter as readers parse it, a
// set as its members (order and duplicates ignored). It is what verify
// does for each present item; the error is truth's.
func Compare(ctx context.Context, truth Truth, r *rules.Rule, args []rules.Value, value []byte) (Comparison, error) {
	switch r.Kind {
	case rules.CountRule:
		want, err := truth.Count(ctx, r.Query, args)
		if err != nil {
			return Comparison{}, err
		}
		// As readers parse it (memcached pads a decremented number
		// with spaces).
		got, ok := itemformat.ParseCount(value)
		wantS := strconv.FormatInt(want, 10)
		if !ok {
			return Comparison{Wrong: true, Cached: strconv.Quote(string(value)), Truth: wantS}, nil
		}
		return Comparison{Wrong: got != want, Cached: strconv.FormatInt(got, 10), Truth: wantS}, nil
	case rules.SetRule:
		loaded, err := truth.LoadMembers(ctx, r.Query, args)
		if err != nil {
			return Comparison{}, err
		}
		want := make([]string, len(loaded))
		for i, m := range loaded {
			want[i] = rules.Escape(m)
		}
		got := itemformat.DecodeSet(value).Members
		gotSet, wantSet := sortedUnique(got), sortedUnique(want)
		return Comparison{
			Wrong:  !slices.Equal(gotSet, wantSet),
			Cached: "{" + strings.Join(gotSet, " ") + "}",
			Truth:  "{" + strings.Join(wantSet, " ") + "}",
		}, nil
	}
	return Comparison{}, fmt.Errorf("rule %q is a %s rule: only set and count rules have a truth", r.Name, r.Kind)
}

func sortedUnique(in []string) []string {
	out := append([]string(nil), in...)
	sort.Strings(out)
	n := 0
	for i, s := range out {
		if i == 0 || s != out[n-1] {
			out[n] = s
			n++
		}
	}
	return out[:n]
}
