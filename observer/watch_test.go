package observer

import (
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// TestWatchList: the latest applied change of each member of a watched
// set (adds, removes, coalesced tokens, a failed op, a delete), the
// bound on members, the history ring and the release of keys.
func TestWatchList(t *testing.T) {
	var w watchList
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ok := cacheops.Result{Outcome: cacheops.OutcomeAppended}
	failed := cacheops.Result{Err: errors.New("timeout")}
	apply := func(res cacheops.Result, ops ...rules.Op) {
		results := make([]cacheops.Result, len(ops))
		for i := range results {
			results[i] = res
		}
		flight, _ := w.begin(ops)
		w.record(ops, results, now, false, flight)
	}
	if _, watching := w.begin([]rules.Op{{Key: "s"}}); watching {
		t.Fatal("an empty list watches a key")
	}
	w.add("s")
	w.add("s")
	apply(ok, rules.Op{Kind: rules.OpSetAdd, Key: "s", Member: "a"}, rules.Op{Kind: rules.OpSetAdd, Key: "other", Member: "a"})
	apply(ok, rules.Op{Kind: rules.OpSetAppend, Key: "s", Tokens: "+b -a +c "})
	apply(failed, rules.Op{Kind: rules.OpSetRemove, Key: "s", Member: "c"})
	got := w.latest("s", []string{"a", "b", "c", "d"})
	for m, want := range map[string]memberRecord{"a": {in: false, known: true, seq: 2}, "b": {in: true, known: true, seq: 2}, "c": {known: false, seq: 3}} {
		if r := got[m]; r.in != want.in || r.known != want.known || r.seq != want.seq {
			t.Errorf("member %s: %+v, want %+v", m, r, want)
		}
	}
	if _, ok := got["d"]; ok {
		t.Error("a member never changed has a record")
	}
	if _, watching := w.begin([]rules.Op{{Key: "other"}}); watching {
		t.Error("begin takes an unwatched key for a watched one")
	}
	// A change being applied: its member is busy until recorded.
	busy := []rules.Op{{Kind: rules.OpSetRemove, Key: "s", Member: "b"}}
	flight, watching := w.begin(append([]rules.Op{{Key: "x"}}, busy...))
	if !watching || !w.latest("s", []string{"b"})["b"].busy || w.latest("s", []string{"a"})["a"].busy {
		t.Errorf("in flight: %v, b %+v, a %+v", watching, w.latest("s", []string{"b"})["b"], w.latest("s", []string{"a"})["a"])
	}
	w.record(append([]rules.Op{{Key: "x"}}, busy...), []cacheops.Result{ok, ok}, now, false, flight)
	if r := w.latest("s", []string{"b"})["b"]; r.busy || r.in || r.seq != 4 {
		t.Errorf("b once recorded: %+v", r)
	}
	// A delete leaves every member unknown.
	apply(cacheops.Result{Outcome: cacheops.OutcomeDeleted}, rules.Op{Kind: rules.OpSetDelete, Key: "s"})
	if r := w.latest("s", []string{"b"})["b"]; r.known {
		t.Errorf("b after the set's delete: %+v, want unknown", r)
	}
	// The history keeps the last historyLen applications and, before
	// them, the last change of a member asked about that fell out of it
	// (a's: the delete).
	for i := range historyLen {
		apply(ok, rules.Op{Kind: rules.OpSetAdd, Key: "s", Member: "n" + strconv.Itoa(i)})
	}
	h := w.history("s", []string{"a"})
	if len(h) != historyLen+1 || h[0].kind != rules.OpSetDelete || h[1].detail != "+n0" || h[len(h)-1].detail != "+n7" {
		t.Errorf("history: %+v", h)
	}
	if s := h[1].String("daemon-a"); s != "00:00:00.000Z set_add +n0 answered appended by daemon-a" {
		t.Errorf("rendered: %q", s)
	}
	// Members beyond the bound are not recorded.
	for i := range maxTrackedMembers {
		apply(ok, rules.Op{Kind: rules.OpSetAdd, Key: "s", Member: "m" + strconv.Itoa(i)})
	}
	if r, ok := w.latest("s", []string{"m" + strconv.Itoa(maxTrackedMembers-1)})["m"+strconv.Itoa(maxTrackedMembers-1)]; ok {
		t.Errorf("a member beyond the bound was recorded: %+v", r)
	}
	if r := w.latest("s", []string{"n0"})["n0"]; !r.known || !r.in {
		t.Errorf("a member recorded before the bound: %+v", r)
	}
	// Released by both sampled changes, the key is forgotten.
	w.release("s")
	if w.history("s", nil) == nil {
		t.Error("released by one of two changes, the key is forgotten")
	}
	w.release("s")
	if w.history("s", nil) != nil || w.size.Load() != 0 {
		t.Error("released by both changes, the key is still watched")
	}
}
