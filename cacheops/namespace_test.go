package cacheops

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

func TestNamespaceConcurrentCreate(t *testing.T) {
	mc := readTestClient(t)
	r := NewReader(mc, readTestLogger(t), ReaderOptions{NamespaceTTL: time.Minute})
	key := readTestKey("ns")

	const callers = 32
	before := uint64(time.Now().UnixMilli())
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
	after := uint64(time.Now().UnixMilli())

	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		if versions[i] != versions[0] {
			t.Fatalf("caller %d saw version %d, caller 0 saw %d", i, versions[i], versions[0])
		}
	}
	if v := versions[0]; v < before || v > after {
		t.Errorf("new version %d is not the Unix ms time of creation (between %d and %d)", v, before, after)
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
