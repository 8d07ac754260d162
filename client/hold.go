package client

import (
	"sync"
	"time"
)

// holdCacheMax bounds the items a holdCache keeps; when it is full, the
// expired ones are dropped, and if none is, all of them.
const holdCacheMax = 1 << 16

// holdCache keeps values read from memcached in process for a fixed time
// (Config.NamespaceHold). The nil *holdCache holds nothing. It is safe for
// concurrent use.
type holdCache struct {
	d     time.Duration
	mu    sync.Mutex
	items map[string]heldValue
}

type heldValue struct {
	v     any
	until time.Time
}

// newHoldCache returns a cache holding values for d; nil when d <= 0.
func newHoldCache(d time.Duration) *holdCache {
	if d <= 0 {
		return nil
	}
	return &holdCache{d: d, items: make(map[string]heldValue)}
}

func (h *holdCache) get(key string) (any, bool) {
	if h == nil {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	it, ok := h.items[key]
	if !ok || time.Now().After(it.until) {
		return nil, false
	}
	return it.v, true
}

func (h *holdCache) put(key string, v any) {
	if h == nil {
		return
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.items) >= holdCacheMax {
		for k, it := range h.items {
			if now.After(it.until) {
				delete(h.items, k)
			}
		}
		if len(h.items) >= holdCacheMax {
			clear(h.items)
		}
	}
	h.items[key] = heldValue{v: v, until: now.Add(h.d)}
}
