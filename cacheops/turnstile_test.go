package cacheops

import (
	"bufio"
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

func TestTurnstileTupleFixtures(t *testing.T) {
	f, err := os.Open("testdata/turnstile_tuples.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	unhexField := func(s string) []byte {
		if s == "-" {
			return []byte{}
		}
		b, err := hex.DecodeString(s)
		if err != nil {
			t.Fatalf("fixture hex %q: %v", s, err)
		}
		return b
	}
	sc := bufio.NewScanner(f)
	cases := 0
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		cases++
		switch {
		case fields[0] == "valid" && len(fields) == 6:
			name := fields[1]
			state, err1 := strconv.ParseUint(fields[2], 10, 8)
			soft, err2 := strconv.ParseInt(fields[3], 10, 64)
			if err1 != nil || err2 != nil {
				t.Fatalf("line %d: bad state or soft expiry", line)
			}
			want := turnstileTuple{state: byte(state), softExpiry: soft, value: unhexField(fields[4])}
			encoded := unhexField(fields[5])
			if got := appendTuple(nil, want); !bytes.Equal(got, encoded) {
				t.Errorf("%s: encoded %x, want %x", name, got, encoded)
			}
			got, err := decodeTuple(encoded)
			if err != nil {
				t.Errorf("%s: decode: %v", name, err)
				continue
			}
			if got.state != want.state || got.softExpiry != want.softExpiry || !bytes.Equal(got.value, want.value) {
				t.Errorf("%s: decoded %+v, want %+v", name, got, want)
			}
		case fields[0] == "invalid" && len(fields) == 3:
			if got, err := decodeTuple(unhexField(fields[2])); err == nil {
				t.Errorf("%s: decoded as %+v, want an error", fields[1], got)
			}
		default:
			t.Fatalf("line %d: malformed fixture %q", line, sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if cases == 0 {
		t.Fatal("no fixtures")
	}
}

func FuzzDecodeTuple(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte("+a +b "))
	f.Add(appendTuple(nil, turnstileTuple{softExpiry: 1700000000000, value: []byte("v")}))
	f.Add(appendTuple(nil, turnstileTuple{state: tupleRecomputing | tupleNoValue, softExpiry: 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		tup, err := decodeTuple(b)
		if err != nil {
			return
		}
		if again := appendTuple(nil, tup); !bytes.Equal(again, b) {
			t.Fatalf("decoded %x as %+v, which encodes as %x", b, tup, again)
		}
	})
}

// putTuple stores a tuple as GetOrCompute would have, with a memcached
// lifetime of a minute.
func putTuple(t *testing.T, mc *memcache.Client, key string, state byte, soft time.Time, value string) {
	t.Helper()
	tup := turnstileTuple{state: state, softExpiry: soft.UnixMilli(), value: []byte(value)}
	if err := mc.Set(&memcache.Item{Key: key, Value: appendTuple(nil, tup), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
}

// storedTuple reads and decodes the tuple at key.
func storedTuple(t *testing.T, mc *memcache.Client, key string) turnstileTuple {
	t.Helper()
	it, err := mc.Get(key)
	if err != nil {
		t.Fatalf("get %s: %v", key, err)
	}
	tup, err := decodeTuple(it.Value)
	if err != nil {
		t.Fatalf("decode %s: %v", key, err)
	}
	return tup
}

func computeValue(v string) ComputeFunc {
	return func(context.Context) ([]byte, error) { return []byte(v), nil }
}

func TestGetOrComputeStoresTuples(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{})
	key := readTestKey("ts")

	before := time.Now()
	v, err := r.GetOrCompute(t.Context(), key, time.Minute, computeValue("hello"))
	if err != nil || string(v) != "hello" {
		t.Fatalf("GetOrCompute = %q, %v", v, err)
	}
	tup := storedTuple(t, mc, key)
	if tup.state != 0 || string(tup.value) != "hello" {
		t.Fatalf("stored %+v", tup)
	}
	if lo, hi := before.Add(time.Minute).UnixMilli(), time.Now().Add(time.Minute).UnixMilli(); tup.softExpiry < lo || tup.softExpiry > hi {
		t.Errorf("soft expiry %d not a minute after the computation (%d..%d)", tup.softExpiry, lo, hi)
	}
	v, err = r.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) {
		t.Error("fresh value recomputed")
		return nil, nil
	})
	if err != nil || string(v) != "hello" {
		t.Fatalf("second GetOrCompute = %q, %v", v, err)
	}

	forever := readTestKey("ts")
	if _, err := r.GetOrCompute(t.Context(), forever, 0, computeValue("x")); err != nil {
		t.Fatal(err)
	}
	if tup := storedTuple(t, mc, forever); tup.softExpiry != 0 {
		t.Errorf("expiration 0 stored soft expiry %d, want never", tup.softExpiry)
	}

	boom := errors.New("backend down")
	failing := readTestKey("ts")
	_, err = r.GetOrCompute(t.Context(), failing, time.Minute, func(context.Context) ([]byte, error) { return nil, boom })
	if !errors.Is(err, boom) {
		t.Fatalf("compute error: %v", err)
	}
	if _, err := r.GetOrCompute(t.Context(), key, -time.Second, computeValue("x")); err == nil {
		t.Error("negative expiration accepted")
	}
}

func TestGetOrComputeHerdComputesOnce(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{ComputeTime: 2 * time.Second, Wait: time.Second}})
	key := readTestKey("ts")

	const callers = 50
	var computes atomic.Int32
	compute := func(context.Context) ([]byte, error) {
		computes.Add(1)
		time.Sleep(20 * time.Millisecond) // a computation others can pile up behind
		return []byte("value"), nil
	}
	start := make(chan struct{})
	values := make([][]byte, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			values[i], errs[i] = r.GetOrCompute(t.Context(), key, time.Minute, compute)
		})
	}
	close(start)
	wg.Wait()
	for i := range callers {
		if errs[i] != nil || string(values[i]) != "value" {
			t.Errorf("caller %d: %q, %v", i, values[i], errs[i])
		}
	}
	if n := computes.Load(); n != 1 {
		t.Errorf("computed %d times, want once", n)
	}
}

func TestGetOrComputeServesStaleDuringRecompute(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{ComputeTime: 30 * time.Second}})
	key := readTestKey("ts")
	putTuple(t, mc, key, 0, time.Now().Add(-time.Second), "old")

	started := make(chan struct{})
	releaseCh := make(chan struct{})
	release := sync.OnceFunc(func() { close(releaseCh) })
	defer release()
	type result struct {
		v   []byte
		err error
	}
	recomputed := make(chan result, 1)
	go func() {
		v, err := r.GetOrCompute(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
			close(started)
			<-releaseCh
			return []byte("new"), nil
		})
		recomputed <- result{v, err}
	}()
	<-started

	// The claim keeps the stale value and pushes the soft expiry ahead.
	claim := storedTuple(t, mc, key)
	if claim.state != tupleRecomputing || string(claim.value) != "old" || claim.softExpiry <= time.Now().UnixMilli() {
		t.Fatalf("claimed tuple %+v", claim)
	}

	// While the recompute is blocked, every other caller returns the stale
	// value without computing.
	const readers = 10
	var unexpected atomic.Int32
	values := make(chan result, readers)
	for range readers {
		go func() {
			v, err := r.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) {
				unexpected.Add(1)
				return []byte("duplicate"), nil
			})
			values <- result{v, err}
		}()
	}
	hangGuard := time.After(30 * time.Second)
	for range readers {
		select {
		case res := <-values:
			if res.err != nil || string(res.v) != "old" {
				t.Errorf("reader during recompute got %q, %v; want the stale value", res.v, res.err)
			}
		case <-hangGuard:
			t.Fatal("readers blocked behind the recompute instead of serving the stale value")
		}
	}
	if n := unexpected.Load(); n != 0 {
		t.Errorf("%d duplicate computations during the recompute", n)
	}

	release()
	if res := <-recomputed; res.err != nil || string(res.v) != "new" {
		t.Fatalf("recompute returned %q, %v", res.v, res.err)
	}
	v, err := r.GetOrCompute(t.Context(), key, time.Minute, func(context.Context) ([]byte, error) {
		t.Error("fresh value recomputed")
		return nil, nil
	})
	if err != nil || string(v) != "new" {
		t.Fatalf("after the recompute: %q, %v", v, err)
	}
}

func TestGetOrComputeWaitsAndRetriesOnce(t *testing.T) {
	mc := readTestClient(t)
	key := readTestKey("ts")
	// A long compute time keeps the claim alive however slowly the waiter
	// goroutine gets scheduled on a loaded machine.
	computer := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{ComputeTime: time.Minute}})

	started := make(chan struct{})
	release := make(chan struct{})
	computed := make(chan error, 1)
	go func() {
		_, err := computer.GetOrCompute(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
			close(started)
			<-release
			return []byte("value"), nil
		})
		computed <- err
	}()
	<-started

	sawClaim := make(chan struct{}, 1)
	rc := &countingReadClient{Client: mc, afterGet: func(_ string, it *memcache.Item, err error) {
		if err == nil {
			if tup, err := decodeTuple(it.Value); err == nil && !tup.hasValue() {
				sawClaim <- struct{}{}
			}
		}
	}}
	waiter := NewReader(rc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{Wait: 2 * time.Second}})
	type result struct {
		v   []byte
		err error
	}
	waited := make(chan result, 1)
	go func() {
		v, err := waiter.GetOrCompute(context.Background(), key, time.Minute, func(context.Context) ([]byte, error) {
			return []byte("duplicate"), nil
		})
		waited <- result{v, err}
	}()
	// The waiter found the computation claimed and no value; let the
	// computation finish and store its value while the waiter waits.
	<-sawClaim
	close(release)
	if err := <-computed; err != nil {
		t.Fatal(err)
	}
	res := <-waited
	if res.err != nil || string(res.v) != "value" {
		t.Fatalf("waiter got %q, %v; want the value computed by the other caller", res.v, res.err)
	}
	if n := rc.gets.Load(); n != 2 {
		t.Errorf("waiter read %d times, want 2 (look, retry)", n)
	}
}

func TestGetOrComputeGivesUpAfterOneRetry(t *testing.T) {
	mc := readTestClient(t)
	rc := &countingReadClient{Client: mc}
	key := readTestKey("ts")
	// Another client holds the claim on a value that does not exist yet.
	putTuple(t, mc, key, tupleRecomputing|tupleNoValue, time.Now().Add(time.Minute), "")
	never := func(context.Context) ([]byte, error) {
		t.Error("computed while another client holds the claim")
		return nil, nil
	}

	r := NewReader(rc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{Wait: 10 * time.Millisecond}})
	if _, err := r.GetOrCompute(t.Context(), key, time.Minute, never); !errors.Is(err, ErrStillComputing) {
		t.Fatalf("err = %v, want ErrStillComputing", err)
	}
	if n := rc.gets.Load(); n != 2 {
		t.Errorf("%d reads, want 2 (look, one retry)", n)
	}

	rc.gets.Store(0)
	impatient := NewReader(rc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{Wait: -1}})
	if _, err := impatient.GetOrCompute(t.Context(), key, time.Minute, never); !errors.Is(err, ErrStillComputing) {
		t.Fatalf("err = %v, want ErrStillComputing", err)
	}
	if n := rc.gets.Load(); n != 1 {
		t.Errorf("%d reads with a negative wait, want 1", n)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.GetOrCompute(ctx, key, time.Minute, never); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
}

func TestGetOrComputeWaitHook(t *testing.T) {
	mc := readTestClient(t)
	key := readTestKey("ts")
	putTuple(t, mc, key, tupleRecomputing|tupleNoValue, time.Now().Add(time.Minute), "")
	never := func(context.Context) ([]byte, error) {
		t.Error("computed while another client holds the claim")
		return nil, nil
	}

	var hooked []string
	r := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{
		WaitHook: func(ctx context.Context, k string, retry func(context.Context) ([]byte, error)) ([]byte, error) {
			hooked = append(hooked, k)
			if _, err := retry(ctx); !errors.Is(err, ErrStillComputing) {
				t.Errorf("retry while still computing: %v", err)
			}
			// The other client finishes; the next retry finds its value.
			putTuple(t, mc, key, 0, time.Now().Add(time.Minute), "theirs")
			return retry(ctx)
		},
	}})
	v, err := r.GetOrCompute(t.Context(), key, time.Minute, never)
	if err != nil || string(v) != "theirs" {
		t.Fatalf("GetOrCompute = %q, %v", v, err)
	}
	if !slices.Equal(hooked, []string{key}) {
		t.Errorf("hook calls: %q", hooked)
	}

	// A hook may also answer on its own, without retrying.
	other := readTestKey("ts")
	putTuple(t, mc, other, tupleRecomputing|tupleNoValue, time.Now().Add(time.Minute), "")
	fallback := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{
		WaitHook: func(context.Context, string, func(context.Context) ([]byte, error)) ([]byte, error) {
			return []byte("fallback"), nil
		},
	}})
	if v, err := fallback.GetOrCompute(t.Context(), other, time.Minute, never); err != nil || string(v) != "fallback" {
		t.Fatalf("GetOrCompute with a fallback hook = %q, %v", v, err)
	}
	// Fresh values never reach the hook.
	if v, err := fallback.GetOrCompute(t.Context(), key, time.Minute, never); err != nil || string(v) != "theirs" {
		t.Fatalf("fresh value = %q, %v", v, err)
	}
}

func TestGetOrComputeTakesOverLapsedClaims(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{})
	past := time.Now().Add(-time.Millisecond)
	cases := []struct {
		name  string
		prime func(key string)
	}{
		{"placeholder whose computer died", func(key string) {
			putTuple(t, mc, key, tupleRecomputing|tupleNoValue, past, "")
		}},
		{"stale claim whose computer died", func(key string) {
			putTuple(t, mc, key, tupleRecomputing, past, "old")
		}},
		{"item in another format", func(key string) {
			if err := mc.Set(&memcache.Item{Key: key, Value: []byte("+a +b "), Expiration: 60}); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key := readTestKey("ts")
			tc.prime(key)
			v, err := r.GetOrCompute(t.Context(), key, time.Minute, computeValue("new"))
			if err != nil || string(v) != "new" {
				t.Fatalf("GetOrCompute = %q, %v", v, err)
			}
			if tup := storedTuple(t, mc, key); tup.state != 0 || string(tup.value) != "new" {
				t.Fatalf("stored %+v", tup)
			}
		})
	}
}

func TestGetOrComputeMultiMixed(t *testing.T) {
	mc := readTestClient(t)
	rc := &countingReadClient{Client: mc}
	r := NewReader(rc, readTestLogger(t), ReaderOptions{})
	fresh1, stale, missing1, fresh2, missing2 := readTestKey("f1"), readTestKey("s"), readTestKey("m1"), readTestKey("f2"), readTestKey("m2")
	putTuple(t, mc, fresh1, 0, time.Now().Add(time.Minute), "cached1")
	putTuple(t, mc, fresh2, 0, time.Now().Add(time.Minute), "cached2")
	putTuple(t, mc, stale, 0, time.Now().Add(-time.Second), "stale")

	var computeCalls [][]string
	compute := func(_ context.Context, keys []string) ([][]byte, error) {
		computeCalls = append(computeCalls, slices.Clone(keys))
		out := make([][]byte, len(keys))
		for i, k := range keys {
			out[i] = []byte("new:" + k)
		}
		return out, nil
	}
	keys := []TurnstileKey{{fresh1, time.Minute}, {stale, time.Minute}, {missing1, time.Minute}, {fresh2, time.Minute}, {missing2, time.Minute}, {fresh1, time.Hour}}
	got, err := r.GetOrComputeMulti(t.Context(), keys, compute)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		fresh1: "cached1", fresh2: "cached2",
		stale: "new:" + stale, missing1: "new:" + missing1, missing2: "new:" + missing2,
	}
	if len(got) != len(want) {
		t.Errorf("got %d values, want %d", len(got), len(want))
	}
	for k, w := range want {
		if string(got[k]) != w {
			t.Errorf("%s = %q, want %q", k, got[k], w)
		}
	}
	if len(computeCalls) != 1 || !slices.Equal(computeCalls[0], []string{stale, missing1, missing2}) {
		t.Errorf("compute calls: %q; want one with the stale and missing keys", computeCalls)
	}
	counts := fmt.Sprintf("getmulti=%d get=%d add=%d cas=%d set=%d",
		rc.getMultis.Load(), rc.gets.Load(), rc.adds.Load(), rc.cass.Load(), rc.sets.Load())
	if counts != "getmulti=1 get=0 add=2 cas=1 set=3" {
		t.Errorf("round trips: %s; want one GetMulti, a claim per computed key and a set per computed key", counts)
	}
	for _, k := range []string{stale, missing1, missing2} {
		if tup := storedTuple(t, mc, k); tup.state != 0 || string(tup.value) != "new:"+k || tup.due(time.Now().UnixMilli()) {
			t.Errorf("%s stored as %+v", k, tup)
		}
	}
}

func TestGetOrComputeMultiWaits(t *testing.T) {
	mc := readTestClient(t)
	rc := &countingReadClient{Client: mc}
	claimed, fresh := readTestKey("claimed"), readTestKey("fresh")
	putTuple(t, mc, claimed, tupleRecomputing|tupleNoValue, time.Now().Add(time.Minute), "")
	putTuple(t, mc, fresh, 0, time.Now().Add(time.Minute), "cached")
	keys := []TurnstileKey{{claimed, time.Minute}, {fresh, time.Minute}}
	never := func(context.Context, []string) ([][]byte, error) {
		t.Error("computed while another client holds the claim")
		return nil, nil
	}

	r := NewReader(rc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{Wait: 10 * time.Millisecond}})
	got, err := r.GetOrComputeMulti(t.Context(), keys, never)
	if !errors.Is(err, ErrStillComputing) || !strings.Contains(err.Error(), claimed) {
		t.Fatalf("err = %v, want ErrStillComputing naming %s", err, claimed)
	}
	if len(got) != 1 || string(got[fresh]) != "cached" {
		t.Errorf("values obtained: %q", got)
	}
	if n := rc.getMultis.Load(); n != 2 {
		t.Errorf("%d GetMulti round trips, want 2 (look, one retry of the missing key)", n)
	}

	var hooked [][]string
	hookReader := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{
		MultiWaitHook: func(ctx context.Context, keys []string, retry func(context.Context) (map[string][]byte, error)) (map[string][]byte, error) {
			hooked = append(hooked, keys)
			if m, err := retry(ctx); !errors.Is(err, ErrStillComputing) || len(m) != 0 {
				t.Errorf("retry while still computing: %q, %v", m, err)
			}
			putTuple(t, mc, claimed, 0, time.Now().Add(time.Minute), "theirs")
			return retry(ctx)
		},
	}})
	got, err = hookReader.GetOrComputeMulti(t.Context(), keys, never)
	if err != nil || len(got) != 2 || string(got[claimed]) != "theirs" || string(got[fresh]) != "cached" {
		t.Fatalf("with hook: %q, %v", got, err)
	}
	if len(hooked) != 1 || !slices.Equal(hooked[0], []string{claimed}) {
		t.Errorf("hook calls: %q", hooked)
	}

	boom := errors.New("backend down")
	missing := readTestKey("missing")
	got, err = r.GetOrComputeMulti(t.Context(), []TurnstileKey{{fresh, time.Minute}, {missing, time.Minute}},
		func(context.Context, []string) ([][]byte, error) { return nil, boom })
	if !errors.Is(err, boom) || string(got[fresh]) != "cached" || got[missing] != nil {
		t.Fatalf("compute error: %q, %v", got, err)
	}
}

func TestGetOrComputeMultiHerd(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{Turnstile: TurnstileOptions{ComputeTime: 2 * time.Second, Wait: time.Second}})
	keys := []TurnstileKey{{readTestKey("a"), time.Minute}, {readTestKey("b"), time.Minute}, {readTestKey("c"), time.Minute}}

	var mu sync.Mutex
	computed := map[string]int{}
	compute := func(_ context.Context, ks []string) ([][]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		out := make([][]byte, len(ks))
		for i, k := range ks {
			computed[k]++
			out[i] = []byte("v:" + k)
		}
		return out, nil
	}
	const callers = 20
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			<-start
			got, err := r.GetOrComputeMulti(t.Context(), keys, compute)
			if err != nil {
				t.Error(err)
				return
			}
			for _, k := range keys {
				if string(got[k.Key]) != "v:"+k.Key {
					t.Errorf("%s = %q", k.Key, got[k.Key])
				}
			}
		})
	}
	close(start)
	wg.Wait()
	for _, k := range keys {
		if computed[k.Key] != 1 {
			t.Errorf("%s computed %d times, want once", k.Key, computed[k.Key])
		}
	}
}

func BenchmarkGetOrComputeFresh(b *testing.B) {
	mc := memcache.New(testsvc.Memcached(b))
	r := NewReader(mc, nil, ReaderOptions{})
	key := readTestKey("bench")
	value := bytes.Repeat([]byte("v"), 512)
	if _, err := r.GetOrCompute(b.Context(), key, time.Hour, func(context.Context) ([]byte, error) { return value, nil }); err != nil {
		b.Fatal(err)
	}
	recompute := func(context.Context) ([]byte, error) { return nil, errors.New("fresh value recomputed") }
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.GetOrCompute(b.Context(), key, time.Hour, recompute); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkGetOrComputeMulti(b *testing.B) {
	mc := memcache.New(testsvc.Memcached(b))
	r := NewReader(mc, nil, ReaderOptions{})
	keys := make([]TurnstileKey, 50)
	for i := range keys {
		keys[i] = TurnstileKey{Key: readTestKey("bench" + strconv.Itoa(i)), Expiration: time.Hour}
	}
	compute := func(_ context.Context, ks []string) ([][]byte, error) {
		out := make([][]byte, len(ks))
		for i := range out {
			out[i] = bytes.Repeat([]byte("v"), 128)
		}
		return out, nil
	}
	if _, err := r.GetOrComputeMulti(b.Context(), keys, compute); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.GetOrComputeMulti(b.Context(), keys, compute); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(keys)), "ns/key")
}
