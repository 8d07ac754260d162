package cacheops

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

// errExpired stands for a guard's reason: the membership may have expired.
var errExpired = errors.New("membership may have expired")

// TestGuardStopsEveryRound: on both transports, a guard that refuses
// (WithGuard) stops the Applier before the next round leaves: a bump whose
// namespace is missing needs more than one round on the text transport,
// an append with a load query a MySQL step before its add, and a counter
// delta that misses a recount and an add. Whatever round the guard starts
// refusing at, no command after it reaches memcached and every op not done
// fails with ErrWriteRefused, not retryable.
func TestGuardStopsEveryRound(t *testing.T) {
	addr := testsvc.Memcached(t)
	mc := memcache.New(addr)
	mc.Timeout = 2 * time.Second
	t.Cleanup(func() { mc.Close() })
	for _, tr := range confTransports {
		for allowed := 0; allowed <= 2; allowed++ {
			t.Run(tr.name+"/"+string(rune('0'+allowed))+"-rounds", func(t *testing.T) {
				loader := loaderFunc(func(context.Context, string, []rules.Value) ([]string, error) { return []string{"m1"}, nil })
				rc := countFunc(func(context.Context, string, []rules.Value) (int64, error) { return 7, nil })
				a := tr.make(t, addr, loader, rc, Config{CompactSample: -1})
				counting := &countingTransport{transport: a.tr, refuseAfter: int64(allowed)}
				counting.refuse.Store(allowed == 0)
				a.tr = counting
				base := "cwguard:" + testsvc.Unique() + ":"
				ops := []rules.Op{
					{Kind: rules.OpBump, Key: base + "ns", Rule: cfBumpRule},
					{Kind: rules.OpSetAdd, Key: base + "set", Member: "m2", Rule: cfSetRule},
					{Kind: rules.OpCount, Key: base + "count", Delta: 1, Rule: cfCountRule},
				}
				ctx := WithGuard(context.Background(), func() error {
					if counting.refuse.Load() {
						return errExpired
					}
					return nil
				})
				results := make([]Result, len(ops))
				err := a.Apply(ctx, ops, results)
				if got := counting.rounds.Load(); got != int64(allowed) {
					t.Errorf("%d rounds reached memcached, want %d (the guard allowed %d)", got, allowed, allowed)
				}
				if allowed == 0 {
					for _, op := range ops {
						if v, ok := itemValue(t, mc, op.Key); ok {
							t.Errorf("%s: item %q written though the guard refused every round", op.Key, v)
						}
					}
				}
				failed := 0
				for i, r := range results {
					if r.Err == nil {
						continue
					}
					failed++
					if !errors.Is(r.Err, ErrWriteRefused) || !errors.Is(r.Err, errExpired) || Retryable(r.Err) {
						t.Errorf("op %d: %v: want ErrWriteRefused wrapping the guard's reason, not retryable", i, r.Err)
					}
				}
				if failed == 0 || err == nil {
					t.Errorf("no op failed (err %v): every op needs more than %d rounds", err, allowed)
				}
			})
		}
	}
}

// countingTransport counts the rounds that reach the transport below and
// sets refuse once refuseAfter of them are done: the guard starts
// refusing between two rounds.
type countingTransport struct {
	transport
	refuseAfter int64
	rounds      atomic.Int64
	refuse      atomic.Bool
}

func (c *countingTransport) send(ctx context.Context, cmds []metaproto.Cmd, replies []metaproto.Reply) {
	n := c.rounds.Add(1)
	c.transport.send(ctx, cmds, replies)
	if n >= c.refuseAfter {
		c.refuse.Store(true)
	}
}

// TestGuardAskedBeforeEachWrite: a guard that starts refusing after a
// round has left the Applier (the process stopped between the round's
// check and its writes, say) still stops the writes not yet made: the
// meta transport asks it again for each connection's share, the text
// transport for each request.
func TestGuardAskedBeforeEachWrite(t *testing.T) {
	addr := testsvc.Memcached(t)
	mc := memcache.New(addr)
	mc.Timeout = 2 * time.Second
	t.Cleanup(func() { mc.Close() })
	for _, tr := range confTransports {
		t.Run(tr.name, func(t *testing.T) {
			a := tr.make(t, addr, nil, nil, Config{CompactSample: -1})
			var asked atomic.Int64
			ctx := WithGuard(context.Background(), func() error {
				// The Applier's own check of the round passes; every
				// later one refuses.
				if asked.Add(1) > 1 {
					return errExpired
				}
				return nil
			})
			// A delta to a counter that exists: one round on either
			// transport (ma; incr).
			key := "cwguard:" + testsvc.Unique() + ":late"
			if err := mc.Set(&memcache.Item{Key: key, Value: []byte("5")}); err != nil {
				t.Fatal(err)
			}
			results := make([]Result, 1)
			a.Apply(ctx, []rules.Op{{Kind: rules.OpCount, Key: key, Delta: 1, Rule: cfPlainCount}}, results)
			if !errors.Is(results[0].Err, ErrWriteRefused) {
				t.Errorf("result %v (%v): want ErrWriteRefused", results[0].Outcome, results[0].Err)
			}
			if v, _ := itemValue(t, mc, key); v != "5" {
				t.Errorf("counter = %q, want 5: the delta was written after the guard refused", v)
			}
		})
	}
}
