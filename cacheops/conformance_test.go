package cacheops

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// The conformance table: every op kind in every situation it handles
// (hit, miss, non-numeric item, item too large, cas conflict, server
// error, timeout), applied through the one Applier over each transport
// against the real memcached, with the same outcome and the same item
// afterwards. Faults come from a proxy in front of memcached (plProxy: a
// reply turned into a SERVER_ERROR, replies withheld) or from another
// client acting just before a cas is sent.

// confFault is what goes wrong while a case's op is applied.
type confFault uint8

const (
	faultNone confFault = iota
	// faultServerError turns the first success reply to a store (STORED,
	// HD) into "SERVER_ERROR out of memory storing object".
	faultServerError
	// faultTimeout withholds every reply.
	faultTimeout
	// faultCASConflict appends "+z " to the key (or changes the master)
	// just before the first cas is sent.
	faultCASConflict
)

// confErr is how a failed case fails.
type confErr uint8

const (
	errNone confErr = iota
	// errRetryable: Retryable is true.
	errRetryable
	// errPermanent: Retryable is false.
	errPermanent
	// errUnknown: ErrUnknownOutcome (the meta transport's lost counter
	// reply); the text transport reports a retryable error instead.
	errUnknown
)

var (
	cfBumpRule     = &rules.Rule{Name: "ns", Kind: rules.BumpRule, TTL: time.Hour}
	cfSetRule      = &rules.Rule{Name: "set", Kind: rules.SetRule, TTL: time.Hour, Query: "SELECT member"}
	cfPlainSetRule = &rules.Rule{Name: "plain-set", Kind: rules.SetRule, TTL: time.Hour}
	cfCountRule    = &rules.Rule{Name: "count", Kind: rules.CountRule, TTL: time.Hour, Query: "SELECT COUNT(*)"}
	cfPlainCount   = &rules.Rule{Name: "plain-count", Kind: rules.CountRule, TTL: time.Hour}
)

// cfMissing stands for "no item" in confCase.before and after.
const cfMissing = "\x00missing"

type confCase struct {
	name string
	// before is the item at the op's key before the op (cfMissing: none;
	// "big:clean" and "big:dirty": a set just below the item size limit).
	before string
	op     rules.Op
	fault  confFault
	// loader, recounter: the case has a working load query / recount
	// (count 7); failingRecount: the recount fails.
	loader, recounter, failingRecount bool
	recountElsewhere                  bool
	// sample: every append is followed by a compaction check.
	sample bool
	want   Outcome
	err    confErr
	// after is the item afterwards ("" with want OutcomeFailed: not
	// checked; cfMissing: none).
	after string
}

func confCases() []confCase {
	bump := rules.Op{Kind: rules.OpBump, Rule: cfBumpRule}
	appendOp := rules.Op{Kind: rules.OpSetAppend, Rule: cfSetRule, Tokens: "+a "}
	plainAppend := rules.Op{Kind: rules.OpSetAppend, Rule: cfPlainSetRule, Tokens: "+a "}
	add := rules.Op{Kind: rules.OpSetAdd, Rule: cfSetRule, Member: "a"}
	remove := rules.Op{Kind: rules.OpSetRemove, Rule: cfSetRule, Member: "x"}
	del := rules.Op{Kind: rules.OpSetDelete, Rule: cfSetRule}
	rebuild := rules.Op{Kind: rules.OpSetRebuild, Rule: cfSetRule}
	count := func(d int64) rules.Op { return rules.Op{Kind: rules.OpCount, Rule: cfCountRule, Delta: d} }
	recount := rules.Op{Kind: rules.OpRecount, Rule: cfCountRule}
	start := strconv.FormatUint(itemformat.NamespaceStart(plClock), 10)
	// bigTokens do not fit beside a set just below the item size limit.
	bigTokens := strings.Repeat("+more -more ", 1500) + "+added "
	bigAppend := rules.Op{Kind: rules.OpSetAppend, Rule: cfSetRule, Tokens: bigTokens}
	return []confCase{
		{name: "bump/hit", before: "100", op: bump, want: OutcomeIncr, after: "101"},
		{name: "bump/miss", before: cfMissing, op: bump, want: OutcomeAdded, after: start},
		{name: "bump/non-numeric", before: "abc", op: bump, want: OutcomeDeleted, after: cfMissing},
		{name: "bump/server-error", before: cfMissing, op: bump, fault: faultServerError, want: OutcomeFailed, err: errRetryable},
		{name: "bump/timeout", before: "100", op: bump, fault: faultTimeout, want: OutcomeFailed, err: errRetryable},

		{name: "append/hit", before: "+x ", op: appendOp, want: OutcomeAppended, after: "+x +a "},
		{name: "append/miss/no-query", before: cfMissing, op: plainAppend, want: OutcomeMissing, after: cfMissing},
		{name: "append/miss/load", before: cfMissing, op: appendOp, loader: true, want: OutcomeLoaded, after: "+m1 +m2 "},
		{name: "append/too-large/compacted", before: "big:dirty", op: bigAppend, want: OutcomeCompacted, after: "+keep +keep2 " + bigTokens},
		{name: "append/too-large/deleted", before: "big:clean", op: bigAppend, want: OutcomeDeleted, after: cfMissing},
		{name: "append/cas-conflict", before: "+x -x +y ", op: appendOp, sample: true, fault: faultCASConflict,
			want: OutcomeAppended, after: "+x -x +y +a +z "},
		{name: "append/sampled-compaction", before: "+x -x +y ", op: appendOp, sample: true, want: OutcomeCompacted, after: "+y +a "},
		{name: "append/server-error", before: cfMissing, op: appendOp, loader: true, fault: faultServerError, want: OutcomeFailed, err: errRetryable},
		{name: "append/timeout", before: "+x ", op: appendOp, fault: faultTimeout, want: OutcomeFailed, err: errRetryable},

		{name: "add/hit", before: "+x ", op: add, want: OutcomeAppended, after: "+x +a "},
		{name: "remove/hit", before: "+x ", op: remove, want: OutcomeAppended, after: "+x -x "},
		{name: "add/unescaped", before: "+x ", op: rules.Op{Kind: rules.OpSetAdd, Rule: cfSetRule, Member: "a b"},
			want: OutcomeFailed, err: errPermanent, after: "+x "},

		{name: "delete/hit", before: "+x ", op: del, want: OutcomeDeleted, after: cfMissing},
		{name: "delete/miss", before: cfMissing, op: del, want: OutcomeDeleted, after: cfMissing},
		{name: "delete/timeout", before: "+x ", op: del, fault: faultTimeout, want: OutcomeFailed, err: errRetryable},

		{name: "rebuild/load", before: "+old ", op: rebuild, loader: true, want: OutcomeLoaded, after: "+m1 +m2 "},
		{name: "rebuild/no-loader", before: "+old ", op: rebuild, want: OutcomeDeleted, after: cfMissing},
		{name: "rebuild/server-error", before: "+old ", op: rebuild, loader: true, fault: faultServerError, want: OutcomeFailed, err: errRetryable},

		{name: "count/incr", before: "10", op: count(3), want: OutcomeIncr, after: "13"},
		{name: "count/decr", before: "10", op: count(-4), want: OutcomeDecr, after: "6"},
		{name: "count/decr-to-zero", before: "1", op: count(-1), recounter: true, want: OutcomeRecounted, after: "7"},
		{name: "count/miss/recount", before: cfMissing, op: count(1), recounter: true, want: OutcomeLoaded, after: "7"},
		{name: "count/miss/no-query", before: cfMissing, op: rules.Op{Kind: rules.OpCount, Rule: cfPlainCount, Delta: 1},
			want: OutcomeMissing, after: cfMissing},
		{name: "count/miss/recount-fails", before: cfMissing, op: count(1), failingRecount: true, want: OutcomeDeleted, after: cfMissing},
		{name: "count/miss/elsewhere", before: cfMissing, op: count(1), recountElsewhere: true, want: OutcomeRecountNeeded, after: cfMissing},
		{name: "count/non-numeric", before: "abc", op: count(1), recounter: true, want: OutcomeRecounted, after: "7"},
		{name: "count/non-numeric/elsewhere", before: "abc", op: count(1), recountElsewhere: true, want: OutcomeRecountNeeded, after: "abc"},
		{name: "count/server-error", before: cfMissing, op: count(1), recounter: true, fault: faultServerError, want: OutcomeFailed, err: errRetryable},
		{name: "count/timeout", before: "10", op: count(1), fault: faultTimeout, want: OutcomeFailed, err: errUnknown},

		{name: "recount/hit", before: "3", op: recount, recounter: true, want: OutcomeRecounted, after: "7"},
		{name: "recount/elsewhere", before: "3", op: recount, recountElsewhere: true, want: OutcomeRecountNeeded, after: "3"},
		{name: "recount/fails", before: "3", op: recount, failingRecount: true, want: OutcomeDeleted, after: cfMissing},
	}
}

// confTransports are the transports under test: each returns an Applier
// (with counter ops) over memcached at addr.
var confTransports = []struct {
	name string
	make func(t *testing.T, addr string, loader SetLoader, rc Recounter, cfg Config) *Applier
}{
	{"meta", func(t *testing.T, addr string, loader SetLoader, rc Recounter, cfg Config) *Applier {
		var sl memcache.ServerList
		if err := sl.SetServers(addr); err != nil {
			t.Fatal(err)
		}
		cfg.Meta.Timeout = 300 * time.Millisecond
		a := NewMetaApplier(&sl, loader, rc, cfg, readTestLogger(t))
		t.Cleanup(func() { a.Close() })
		return a
	}},
	{"text", func(t *testing.T, addr string, loader SetLoader, rc Recounter, cfg Config) *Applier {
		mc := memcache.New(addr)
		mc.Timeout = 300 * time.Millisecond
		mc.MaxIdleConns = DefaultMaxConcurrency
		t.Cleanup(func() { mc.Close() })
		return NewTextApplier(mc, loader, rc, cfg, readTestLogger(t))
	}},
}

// TestConformance runs the conformance table on both transports.
func TestConformance(t *testing.T) {
	addr := testsvc.Memcached(t)
	mc := memcache.New(addr)
	mc.Timeout = 2 * time.Second
	t.Cleanup(func() { mc.Close() })
	limit := plItemSizeMax(t, addr)
	for _, tr := range confTransports {
		t.Run(tr.name, func(t *testing.T) {
			for _, tc := range confCases() {
				t.Run(tc.name, func(t *testing.T) {
					runConfCase(t, tr.name, tr.make, mc, addr, limit, tc)
				})
			}
		})
	}
}

func runConfCase(t *testing.T, transport string, build func(*testing.T, string, SetLoader, Recounter, Config) *Applier,
	mc *memcache.Client, addr string, limit int, tc confCase) {
	key := "cwconf:" + testsvc.Unique() + ":" + transport + ":" + tc.name
	before := tc.before
	switch before {
	case "big:dirty":
		before = plBigSet(limit-8192, true)
	case "big:clean":
		before = plBigSet(limit-8192, false)
	}
	if before != cfMissing {
		if err := mc.Set(&memcache.Item{Key: key, Value: []byte(before)}); err != nil {
			t.Fatal(err)
		}
	}
	proxy := startPLProxy(t, addr)
	switch tc.fault {
	case faultServerError:
		proxy.inject.Store(true)
	case faultTimeout:
		proxy.stall.Store(true)
	}
	var loader SetLoader
	if tc.loader {
		loader = loaderFunc(func(context.Context, string, []rules.Value) ([]string, error) { return []string{"m1", "m2", "m1"}, nil })
	}
	var rc Recounter
	switch {
	case tc.recounter:
		rc = countFunc(func(context.Context, string, []rules.Value) (int64, error) { return 7, nil })
	case tc.failingRecount:
		rc = countFunc(func(context.Context, string, []rules.Value) (int64, error) { return 0, errors.New("mysql is down") })
	}
	cfg := Config{Now: func() time.Time { return plClock }, CompactSample: -1, RecountElsewhere: tc.recountElsewhere}
	if tc.sample {
		cfg.CompactSample = 1
	}
	a := build(t, proxy.addr, loader, rc, cfg)
	if tc.fault == faultCASConflict {
		a.tr = &casHookTransport{transport: a.tr, before: func(cmd *metaproto.Cmd) {
			if err := mc.Append(&memcache.Item{Key: cmd.Key, Value: []byte("+z ")}); err != nil {
				t.Errorf("append before the cas: %v", err)
			}
		}}
	}
	op := tc.op
	op.Key = key
	results := make([]Result, 1)
	a.Apply(context.Background(), []rules.Op{op}, results)
	r := results[0]
	if r.Outcome != tc.want || (r.Err != nil) != (tc.want == OutcomeFailed) {
		t.Fatalf("result = %v (%v), want %v", r.Outcome, r.Err, tc.want)
	}
	switch tc.err {
	case errRetryable:
		if !Retryable(r.Err) {
			t.Errorf("error %v is not retryable", r.Err)
		}
	case errPermanent:
		if Retryable(r.Err) {
			t.Errorf("error %v is retryable, want permanent", r.Err)
		}
	case errUnknown:
		// Only the pipelined transport knows the delta was sent before
		// the connection broke.
		if unknown := errors.Is(r.Err, ErrUnknownOutcome); unknown != (transport == "meta") || !Retryable(r.Err) {
			t.Errorf("error %v: unknown outcome %v, want %v, and retryable", r.Err, unknown, transport == "meta")
		}
	}
	if s := a.Stats(); tc.fault == faultCASConflict && s.CASConflicts != 1 {
		t.Errorf("stats = %+v, want the one lost cas counted", s)
	}
	if tc.after == "" {
		return
	}
	v, ok := itemValue(t, mc, key)
	switch {
	case tc.after == cfMissing && ok:
		t.Errorf("item = %q, want it missing", v)
	case tc.after != cfMissing && (!ok || strings.TrimRight(v, " ") != strings.TrimRight(tc.after, " ")):
		// decr may leave spaces where digits were.
		t.Errorf("item = %q (present %v), want %q", v, ok, tc.after)
	}
}

// countFunc is a Recounter.
type countFunc func(ctx context.Context, query string, args []rules.Value) (int64, error)

func (f countFunc) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	return f(ctx, query, args)
}

// casHookTransport runs before ahead of the first cas it sends: another
// writer acting between a gets and its cas.
type casHookTransport struct {
	transport
	before func(cmd *metaproto.Cmd)
	done   atomic.Bool
}

func (h *casHookTransport) send(ctx context.Context, cmds []metaproto.Cmd, replies []metaproto.Reply) {
	for i := range cmds {
		if cmds[i].Verb == metaproto.VerbSet && cmds[i].CAS != 0 && h.done.CompareAndSwap(false, true) {
			h.before(&cmds[i])
		}
	}
	h.transport.send(ctx, cmds, replies)
}
