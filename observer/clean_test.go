package observer

import (
	"context"
	"fmt"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
)

// TestObserverCleanStreamWithReversals: a clean stream, applied by the
// daemon's writer to a real memcached, in which more than 30% of the set
// changes are reversed within 100 ms (a tag added, then removed again
// before a window's read, and the other way round) while other members
// of the same sets keep changing: at every window, not one of at least
// 5,000 judged set checks is inconsistent. Every member is judged
// against the latest change the daemon applied to it, not the sampled
// change's row image.
func TestObserverCleanStreamWithReversals(t *testing.T) {
	if testing.Short() {
		t.Skip("a stream of several thousand changes")
	}
	e := newObserved(t)
	// Two windows; the sampled change's member is often reversed before
	// the first.
	e.o.Close()
	o, err := New(Config{Sample: 1, MaxPerSecond: 1e6, Windows: []time.Duration{150 * time.Millisecond, 600 * time.Millisecond},
		ConfirmAfter: 100 * time.Millisecond, MemcachedPerSecond: 1e6, MySQLPerSecond: 1e6, ReportEvery: time.Hour}, Deps{Cache: e.mc, Logger: e.o.log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	e.o = o

	const (
		streams = 4    // like partitions: each applies its own items, in order
		items   = 12   // sets per stream
		tags    = 6    // members per set
		changes = 4000 // new changes, reversals come on top
	)
	row := func(item int, tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: strconv.Itoa(item)}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	// Sets present from the start (a rule without a query never creates
	// one).
	for i := range streams * items {
		e.setSet(e.plan("tags", row(i, "x"))[0], "+x ")
	}
	var reversed sync.Mutex
	var nReversed, nChanges int
	var wg sync.WaitGroup
	for s := range streams {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(s), 7))
			in := map[[2]int]bool{}
			type pending struct {
				due       time.Time
				item, tag int
			}
			var later []pending
			offset := int64(0)
			change := func(item, tag int) rules.Op {
				k := [2]int{item, tag}
				ev := rules.Event{Database: "app", Table: "tags", Operation: rules.Insert, After: row(item, "t"+strconv.Itoa(tag)),
					Source: rules.Position{Topic: "cdc.app.tags", Partition: s, Offset: offset}}
				if in[k] {
					ev.Operation, ev.Before, ev.After = rules.Delete, ev.After, nil
				}
				in[k] = !in[k]
				offset++
				ops, _, err := e.rs.Plan(nil, &ev)
				if err != nil || len(ops) != 1 {
					panic(fmt.Sprintf("plan: %v, %d ops", err, len(ops)))
				}
				return ops[0]
			}
			for n := 0; n < changes/streams || len(later) > 0; {
				var batch []rules.Op
				now := time.Now()
				// Reversals due.
				keep := later[:0]
				for _, p := range later {
					if now.After(p.due) {
						batch = append(batch, change(p.item, p.tag))
					} else {
						keep = append(keep, p)
					}
				}
				later = keep
				for range 1 + rng.IntN(4) {
					if n >= changes/streams {
						break
					}
					n++
					item, tag := s*items+rng.IntN(items), rng.IntN(tags)
					batch = append(batch, change(item, tag))
					if rng.Float64() < 0.4 {
						later = append(later, pending{due: now.Add(time.Duration(10+rng.IntN(60)) * time.Millisecond), item: item, tag: tag})
						reversed.Lock()
						nReversed++
						reversed.Unlock()
					}
				}
				reversed.Lock()
				nChanges += len(batch)
				reversed.Unlock()
				if len(batch) > 0 {
					done := e.o.BeforeApply(context.Background(), batch)
					res := make([]cacheops.Result, len(batch))
					if err := e.w.Apply(context.Background(), batch, res); err != nil {
						t.Error(err)
						return
					}
					if done != nil {
						done(batch, res)
					}
				}
				time.Sleep(time.Duration(2+rng.IntN(4)) * time.Millisecond)
			}
		})
	}
	wg.Wait()
	if float64(nReversed) < 0.3*float64(nChanges-nReversed) {
		t.Fatalf("%d of %d changes reversed, want at least 30%%", nReversed, nChanges-nReversed)
	}
	deadline := time.Now().Add(60 * time.Second)
	for e.o.Pending() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d changes still pending", e.o.Pending())
		}
		time.Sleep(20 * time.Millisecond)
	}
	for i, c := range e.o.Totals() {
		t.Logf("window %s: %+v (nines %s); %d changes, %d reversed within 100ms", e.o.cfg.Windows[i], c, c.NinesText(), nChanges, nReversed)
		if c.Inconsistent != 0 || c.Judged() < 5000 {
			t.Errorf("window %s: %d inconsistent of %d judged, want 0 of at least 5,000\n%s", e.o.cfg.Windows[i], c.Inconsistent, c.Judged(), e.log.String())
		}
	}
}

// TestObserverBusySetJudged: a member an outside writer removed right
// after the daemon added it is reported even while the daemon keeps
// changing other members of the same set between the two readings of
// the confirm step (only the members in question are compared).
func TestObserverBusySetJudged(t *testing.T) {
	e := newObserved(t)
	row := func(tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	ops := e.plan("tags", row("red"))
	e.setSet(ops[0], "+old ")
	done := e.o.BeforeApply(context.Background(), ops)
	res := make([]cacheops.Result, len(ops))
	if err := e.w.Apply(context.Background(), ops, res); err != nil {
		t.Fatal(err)
	}
	done(ops, res)
	// The outside writer.
	if err := e.mc.Append(&memcache.Item{Key: ops[0].Key, Value: []byte("-red ")}); err != nil {
		t.Fatal(err)
	}
	// The daemon changes other members past the window and the confirm
	// step of red's check.
	for i, end := 0, time.Now().Add(testWindow+time.Second); time.Now().Before(end); i++ {
		e.apply(e.plan("tags", row("busy"+strconv.Itoa(i%50))), false)
		time.Sleep(5 * time.Millisecond)
	}
	c := e.settle()
	if c.Inconsistent != 1 {
		t.Fatalf("busy set: %+v, want the removed member reported\n%s", c, e.log.String())
	}
	if want := "key=" + ops[0].Key + " "; !strings.Contains(e.log.String(), want) || !strings.Contains(e.log.String(), "expected=+red seen=-red") {
		t.Errorf("the report does not name %s with expected=+red seen=-red:\n%s", ops[0].Key, e.log.String())
	}
	// Its history: the daemon appended +red (memcached answered
	// appended) and nothing of its own removed it, so an outside writer
	// did.
	history := regexp.MustCompile(`history="[0-9:.]+Z set_add \+red answered appended by daemon-a batch cdc\.app\.tags/0@0(; [^"]*)?"`)
	if !history.MatchString(e.log.String()) {
		t.Errorf("the report lacks the key's history:\n%s", e.log.String())
	}
	if strings.Contains(e.log.String(), "set_remove -red") {
		t.Errorf("the history shows a removal of red the daemon never applied:\n%s", e.log.String())
	}
}

// TestObserverChangeInFlight: a change memcached already holds but the
// daemon has not finished applying (its batch is still in its fence
// checks) is not taken for a wrong member: the member is not judged
// while its change is in flight, never inconsistent.
func TestObserverChangeInFlight(t *testing.T) {
	e := newObserved(t)
	row := func(tag string) rules.Row {
		return rules.Row{{Name: "item", Value: rules.Value{Kind: rules.KindInt, Text: "1"}}, {Name: "tag", Value: rules.Value{Kind: rules.KindString, Text: tag}}}
	}
	add := e.plan("tags", row("red"))
	e.setSet(add[0], "+old ")
	e.apply(add, false)
	// The removal: written to memcached, its batch done only after the
	// window and the confirm step of the add's check.
	ev := rules.Event{Database: "app", Table: "tags", Operation: rules.Delete, Before: row("red"),
		Source: rules.Position{Topic: "cdc.app.tags", Offset: 1}}
	remove, _, err := e.rs.Plan(nil, &ev)
	if err != nil {
		t.Fatal(err)
	}
	done := e.o.BeforeApply(context.Background(), remove)
	res := make([]cacheops.Result, len(remove))
	if err := e.w.Apply(context.Background(), remove, res); err != nil {
		t.Fatal(err)
	}
	time.Sleep(testWindow + 500*time.Millisecond)
	if done != nil {
		done(remove, res)
	}
	c := e.settle()
	if c.Inconsistent != 0 {
		t.Fatalf("a change in flight was reported: %+v\n%s", c, e.log.String())
	}
	if c.NotJudged == 0 {
		t.Errorf("the add's check, with the member's removal in flight: %+v, want not judged", c)
	}
}
