package cacheops

import (
	"log/slog"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// readTestClient connects to the test memcached (see internal/testsvc).
func readTestClient(t *testing.T) *memcache.Client {
	t.Helper()
	mc := memcache.New(testsvc.Memcached(t))
	mc.MaxIdleConns = 64
	mc.Timeout = 2 * time.Second
	if err := mc.Ping(); err != nil {
		t.Fatalf("memcached does not answer: %v", err)
	}
	return mc
}

// readTestLogger logs to the test's output, shown for failed or verbose
// runs.
func readTestLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// readTestKey returns a key no other test or run uses.
func readTestKey(name string) string {
	return "cwtest:read:" + testsvc.Unique() + ":" + name
}
