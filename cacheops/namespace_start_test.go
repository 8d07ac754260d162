package cacheops

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

// TestNamespaceVersionsNeverRecur bumps a namespace 100,000 times, evicts
// it and creates it again through each writer: every new
// start is above every version the first incarnation handed out, so no key
// built under an old version is read again. (With Unix milliseconds as the
// start, as before itemformat.NamespaceStart, the second incarnation started about
// 100,000 below the first one's last version.)
func TestNamespaceVersionsNeverRecur(t *testing.T) {
	e := newPLEnv(t)
	now := time.Now
	pw := e.writer(t, nil, nil, Config{Now: now})
	tw := NewTextApplier(e.mc, nil, nil, Config{Now: now}, readTestLogger(t))
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
