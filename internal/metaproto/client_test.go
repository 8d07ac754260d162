package metaproto

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestGetResendsOnlyFailedReads: when one server of two restarted, its
// pooled connection is dead and the reads sent to it fail; Get sends
// those again, and only those: a vivifying read the other server already
// answered keeps its win (sent again, it would find its own placeholder
// and lose it).
func TestGetResendsOnlyFailedReads(t *testing.T) {
	a := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{})
	b := testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{})
	var sl memcache.ServerList
	if err := sl.SetServers(a.Addr, b.Addr); err != nil {
		t.Fatal(err)
	}
	c := NewClient(&sl, PoolConfig{ConnsPerServer: 1})
	t.Cleanup(func() { c.Close() })
	// One key on each server.
	keys := map[string]string{}
	for i := 0; len(keys) < 2; i++ {
		k := fmt.Sprintf("cwresend:%s:%d", testsvc.Unique(), i)
		addr, err := sl.PickServer(k)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := keys[addr.String()]; !ok {
			keys[addr.String()] = k
		}
	}
	onA, onB := keys[a.Addr], keys[b.Addr]
	ctx := context.Background()
	// A connection to each server in the pool.
	if _, err := c.Get(ctx, []Get{{Key: onA}, {Key: onB}}); err != nil {
		t.Fatal(err)
	}
	b.Kill()
	b.Start()
	items, err := c.Get(ctx, []Get{{Key: onA, Vivify: time.Minute}, {Key: onB, Vivify: time.Minute}})
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range []string{onA, onB} {
		if !items[i].Won {
			t.Errorf("%s: %+v, want the win of the only reader", k, items[i])
		}
	}
}

// TestPoolConfigDefaults: a zero PoolConfig gets metaproto's defaults, and
// what a caller sets is kept; the pool is where its users read them.
func TestPoolConfigDefaults(t *testing.T) {
	var sl memcache.ServerList
	p := NewPool(&sl, PoolConfig{})
	if p.ConnsPerServer() != DefaultConnsPerServer || p.cfg.Timeout != DefaultTimeout || p.cfg.Dial == nil {
		t.Errorf("zero PoolConfig: %d conns, timeout %v, dial set %v; want %d, %v, true",
			p.ConnsPerServer(), p.cfg.Timeout, p.cfg.Dial != nil, DefaultConnsPerServer, DefaultTimeout)
	}
	p = NewPool(&sl, PoolConfig{ConnsPerServer: 3, Timeout: time.Second})
	if p.ConnsPerServer() != 3 || p.cfg.Timeout != time.Second {
		t.Errorf("set PoolConfig: %d conns, timeout %v; want 3, 1s", p.ConnsPerServer(), p.cfg.Timeout)
	}
}
