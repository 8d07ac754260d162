package cacheops

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/rules"
)

func TestNamespaceConcurrentCreate(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{NamespaceTTL: time.Minute})
	key := readTestKey("ns")

	const callers = 32
	before := NamespaceStart(time.Now())
	start := make(chan struct{})
	versions := make([]uint64, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			<-start
			versions[i], errs[i] = r.Namespace(key)
		})
	}
	close(start)
	wg.Wait()
	after := NamespaceStart(time.Now())

	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if versions[i] != versions[0] {
			t.Fatalf("caller %d saw version %d, caller 0 saw %d", i, versions[i], versions[0])
		}
	}
	if v := versions[0]; v < before || v > after {
		t.Errorf("new version %d is not NamespaceStart of the time of creation (between %d and %d)", v, before, after)
	}
	it, err := mc.Get(key)
	if err != nil || string(it.Value) != strconv.FormatUint(versions[0], 10) {
		t.Fatalf("stored version: %v, %v", it, err)
	}
}

func TestNamespaceFollowsBumps(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{})
	key := readTestKey("ns")
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("100"), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Namespace(key); err != nil || v != 100 {
		t.Fatalf("Namespace = %d, %v; want 100", v, err)
	}
	// The daemon bumps with incr.
	if _, err := mc.Increment(key, 1); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Namespace(key); err != nil || v != 101 {
		t.Fatalf("after a bump Namespace = %d, %v; want 101", v, err)
	}
	// memcached pads a number that a decrement shortened with spaces.
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("99 "), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Namespace(key); err != nil || v != 99 {
		t.Fatalf("padded version: Namespace = %d, %v; want 99", v, err)
	}
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("+a +b "), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	if v, err := r.Namespace(key); err == nil {
		t.Fatalf("non-numeric version accepted as %d", v)
	}
}

func TestNamespaces(t *testing.T) {
	mc := newCountingReadClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{NamespaceTTL: time.Minute})
	present, missing := readTestKey("ns-present"), readTestKey("ns-missing")
	if err := mc.Client.Set(&memcache.Item{Key: present, Value: []byte("7"), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	got, err := r.Namespaces([]string{present, missing, present})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[present] != 7 || got[missing] == 0 {
		t.Fatalf("Namespaces = %v", got)
	}
	if n := mc.getMultis.Load(); n != 1 {
		t.Errorf("%d GetMulti round trips, want 1", n)
	}
	if again, err := r.Namespace(missing); err != nil || again != got[missing] {
		t.Errorf("created version %d not kept: %d, %v", got[missing], again, err)
	}
}

// TestNamespaceVersionsNeverRecur bumps a namespace 100,000 times, evicts
// it and creates it again through each writer and the read side: every new
// start is above every version the first incarnation handed out, so no key
// built under an old version is read again. (With Unix milliseconds as the
// start, as before NamespaceStart, the second incarnation started about
// 100,000 below the first one's last version.)
func TestNamespaceVersionsNeverRecur(t *testing.T) {
	e := newPLEnv(t)
	now := time.Now
	pw := e.writer(t, nil, nil, PipelineConfig{WriterConfig: WriterConfig{Now: now}})
	tw := NewWriter(e.mc, nil, WriterConfig{Now: now}, readTestLogger(t))
	reader := NewReader(e.mc, readTestLogger(t), ReaderOptions{})
	key := e.key("ns:recur")
	ctx := context.Background()

	const bumps = 100_000
	batch := make([]rules.Op, 1000)
	for i := range batch {
		batch[i] = plBump(key)
	}
	results := make([]Result, len(batch))
	for done := 0; done < bumps; done += len(batch) {
		if err := pw.Apply(ctx, batch, results); err != nil {
			t.Fatal(err)
		}
	}
	v, ok := e.value(t, key)
	if !ok {
		t.Fatal("namespace missing after the bumps")
	}
	last, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	creators := []struct {
		name   string
		create func() error
	}{
		{"pipelined writer", func() error { return pw.Apply(ctx, []rules.Op{plBump(key)}, results[:1]) }},
		{"text writer", func() error { return tw.Apply(ctx, []rules.Op{plBump(key)}, results[:1]) }},
		{"read side", func() error { _, err := reader.Namespace(key); return err }},
	}
	for _, c := range creators {
		if err := e.mc.Delete(key); err != nil {
			t.Fatalf("evict: %v", err)
		}
		if err := c.create(); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		v, _ := e.value(t, key)
		start, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s: %q: %v", c.name, v, err)
		}
		if start <= last {
			t.Errorf("%s recreated the namespace at %d, not above %d, the last version of the first incarnation (%d bumps)", c.name, start, last, bumps)
		}
	}
}
