package observer

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/itemformat"
)

// Result is the outcome of one check of one item.
type Result uint8

const (
	// Consistent: the item reflects the change (or a later state).
	Consistent Result = iota
	// Inconsistent: the item is present and does not reflect it.
	Inconsistent
	// Missing: the item is absent, which is always correct.
	Missing
	// NotJudged: the check could not decide (the truth moved, a query or
	// read failed, the budget was spent, ...). Never counted as
	// consistent.
	NotJudged
)

// results lists every Result in label order.
var results = [...]Result{Consistent, Inconsistent, Missing, NotJudged}

// String returns the result's label in
// cachewarden_consistency_checks_total.
func (r Result) String() string {
	switch r {
	case Consistent:
		return "consistent"
	case Inconsistent:
		return "inconsistent"
	case Missing:
		return "missing"
	}
	return "not_judged"
}

// Item is what a read of one key found.
type Item struct {
	Present bool
	Value   []byte
	// cas is the item's cas token (0 when the read did not return one).
	cas uint64
}

// verdict is a judgement and, for an inconsistent or unjudged item, what
// was expected and what was seen.
type verdict struct {
	result         Result
	expected, seen string
}

func (it Item) text() string {
	if !it.Present {
		return "<missing>"
	}
	return strconv.Quote(string(it.Value))
}

// judgeVersion judges a namespace version (or one hot-key copy) read at
// the check against the one read before the bump (docs/formats.md,
// "Namespace versions"). The version must have moved past the value read
// before; a version missing before must now be at least the namespace
// start of the time of that read less skew (whoever created it after the
// read started it there). detached observers read "before" at an unknown
// point relative to the bump: an unmoved version is not judged.
func judgeVersion(before, now Item, beforeAt time.Time, skew time.Duration, detached bool) verdict {
	if !now.Present {
		return verdict{result: Missing}
	}
	v, ok := itemformat.ParseVersion(now.Value)
	if !ok {
		return verdict{Inconsistent, "a decimal version", now.text()}
	}
	if before.Present {
		if b, ok := itemformat.ParseVersion(before.Value); ok {
			switch {
			case v > b:
				return verdict{result: Consistent}
			case v == b && detached:
				return verdict{NotJudged, fmt.Sprintf("a version above %d", b), strconv.FormatUint(v, 10) + " (unmoved: the writer may have bumped before the first read)"}
			}
			return verdict{Inconsistent, fmt.Sprintf("a version above %d (read before the bump)", b), strconv.FormatUint(v, 10)}
		}
		// Not a version before: the bump deleted it; whoever created it
		// again started at the namespace start of a later time.
	}
	floor := itemformat.NamespaceStart(beforeAt.Add(-skew))
	if v >= floor {
		return verdict{result: Consistent}
	}
	return verdict{Inconsistent, fmt.Sprintf("a version of at least %d (created after %s, missing before the bump)", floor, beforeAt.UTC().Format(time.RFC3339Nano)), strconv.FormatUint(v, 10)}
}

// judgeMaster judges a master namespace with evidence after a bump of the
// entity with bit: its bit is set, or the master rolled past the version
// read before (docs/formats.md, "Master namespaces with evidence"). A
// master missing (or unreadable) before the bump must now be one created
// after that read. Masters only move forward, so the same judgement holds
// for detached observers.
func judgeMaster(before, now Item, bit, bits int, beforeAt time.Time, skew time.Duration) verdict {
	if !now.Present {
		return verdict{result: Missing}
	}
	m, err := itemformat.DecodeMaster(now.Value, bits)
	if err != nil {
		return verdict{Inconsistent, fmt.Sprintf("a master item of %d bits", bits), now.text()}
	}
	if m.Has(bit) {
		return verdict{result: Consistent}
	}
	if before.Present {
		if b, err := itemformat.DecodeMaster(before.Value, bits); err == nil {
			if m.Version > b.Version {
				return verdict{result: Consistent}
			}
			return verdict{Inconsistent, fmt.Sprintf("bit %d set, or a master version above %d", bit, b.Version),
				fmt.Sprintf("bit %d clear, master version %d", bit, m.Version)}
		}
	}
	floor := itemformat.NamespaceStart(beforeAt.Add(-skew))
	if m.Version >= floor {
		return verdict{result: Consistent}
	}
	return verdict{Inconsistent, fmt.Sprintf("bit %d set, or a master created after the bump (version of at least %d)", bit, floor),
		fmt.Sprintf("bit %d clear, master version %d", bit, m.Version)}
}

// judgeSetAll compares a present set with the members the rule's load
// query returns (escaped), as sets.
func judgeSetAll(now Item, truth []string) verdict {
	if !now.Present {
		return verdict{result: Missing}
	}
	got := itemformat.DecodeSet(now.Value).Members
	extra, lacking := diff(got, truth)
	if len(extra) == 0 && len(lacking) == 0 {
		return verdict{result: Consistent}
	}
	return verdict{Inconsistent, "{" + strings.Join(sortedUnique(truth), " ") + "}",
		"{" + strings.Join(sortedUnique(got), " ") + "}" + describeDiff(extra, lacking)}
}

// judgeSetMembers judges the members of want (escaped member -> whether
// it should be in the set) in a set read now: the first reading's
// judgement of a set without a load query, want being the latest change
// the daemon applied to each member (viewSet).
func judgeSetMembers(now Item, want map[string]bool) verdict {
	if !now.Present {
		return verdict{result: Missing}
	}
	latest := make(map[string]memberRecord, len(want))
	for m, in := range want {
		latest[m] = memberRecord{in: in, known: true}
	}
	s := viewSet(now, sortedKeys(want), nil, latest)
	return s.verdict(s.wrong)
}

func memberState(m string, in bool) string {
	if in {
		return "+" + m
	}
	return "-" + m
}

// judgeCounter compares a present counter with its recount.
func judgeCounter(now Item, truth int64) verdict {
	if !now.Present {
		return verdict{result: Missing}
	}
	want := strconv.FormatInt(truth, 10)
	n, ok := itemformat.ParseCount(now.Value)
	if !ok {
		return verdict{Inconsistent, want, now.text()}
	}
	if n == truth {
		return verdict{result: Consistent}
	}
	return verdict{Inconsistent, want, strconv.FormatInt(n, 10)}
}

// diff returns the members of got not in want, and of want not in got.
func diff(got, want []string) (extra, lacking []string) {
	g, w := toSet(got), toSet(want)
	for m := range g {
		if !w[m] {
			extra = append(extra, m)
		}
	}
	for m := range w {
		if !g[m] {
			lacking = append(lacking, m)
		}
	}
	sort.Strings(extra)
	sort.Strings(lacking)
	return extra, lacking
}

func describeDiff(extra, lacking []string) string {
	var parts []string
	if len(extra) > 0 {
		parts = append(parts, "extra "+strings.Join(extra, " "))
	}
	if len(lacking) > 0 {
		parts = append(parts, "lacking "+strings.Join(lacking, " "))
	}
	return " (" + strings.Join(parts, "; ") + ")"
}

func toSet(s []string) map[string]bool {
	m := make(map[string]bool, len(s))
	for _, x := range s {
		m[x] = true
	}
	return m
}

func sortedUnique(in []string) []string {
	m := toSet(in)
	return sortedKeys(m)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
