package cacheops

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
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

// countingReadClient counts the round trips a Reader makes to a real
// memcached and lets a test observe its reads.
type countingReadClient struct {
	*memcache.Client
	gets, getMultis, adds, sets, cass atomic.Int64
	afterGet                          func(key string, it *memcache.Item, err error)
}

func newCountingReadClient(t *testing.T) *countingReadClient {
	return &countingReadClient{Client: readTestClient(t)}
}

func (c *countingReadClient) Get(key string) (*memcache.Item, error) {
	c.gets.Add(1)
	it, err := c.Client.Get(key)
	if c.afterGet != nil {
		c.afterGet(key, it, err)
	}
	return it, err
}

func (c *countingReadClient) GetMulti(keys []string) (map[string]*memcache.Item, error) {
	c.getMultis.Add(1)
	return c.Client.GetMulti(keys)
}

func (c *countingReadClient) Add(it *memcache.Item) error {
	c.adds.Add(1)
	return c.Client.Add(it)
}

func (c *countingReadClient) Set(it *memcache.Item) error {
	c.sets.Add(1)
	return c.Client.Set(it)
}

func (c *countingReadClient) CompareAndSwap(it *memcache.Item) error {
	c.cass.Add(1)
	return c.Client.CompareAndSwap(it)
}

func TestKeyMatchesDaemonKeys(t *testing.T) {
	long := strings.Repeat("x", 300)
	cases := []struct {
		name, prefix, template string
		values                 map[string]string
	}{
		{"plain", "app:", "user:{id}", map[string]string{"id": "12543"}},
		{"escaped", "app:", "tag:{name}:{id}", map[string]string{"name": "a b%c\x7f\n", "id": "7"}},
		{"hashed", "app:", "doc:{body}", map[string]string{"body": long}},
		{"no placeholders", "", "global", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			want, err := rules.Key(tc.prefix, tc.template, tc.values)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Key(tc.prefix, tc.template, tc.values)
			if err != nil || got != want {
				t.Fatalf("Key = %q, %v; want %q", got, err, want)
			}
			kt, err := ParseKeyTemplate(tc.prefix, tc.template)
			if err != nil {
				t.Fatal(err)
			}
			got, err = kt.Key(tc.values)
			if err != nil || got != want {
				t.Fatalf("KeyTemplate.Key = %q, %v; want %q", got, err, want)
			}
			if len(got) > rules.MaxKeyLen {
				t.Fatalf("key of %d bytes exceeds memcached's limit", len(got))
			}
		})
	}
}

func TestKeyErrors(t *testing.T) {
	if _, err := ParseKeyTemplate("p:", "user:{id"); err == nil {
		t.Error("unclosed placeholder parsed")
	}
	kt, err := ParseKeyTemplate("p:", "user:{id}")
	if err != nil {
		t.Fatal(err)
	}
	if k, err := kt.Key(map[string]string{"other": "1"}); err == nil || !strings.Contains(err.Error(), `"id"`) {
		t.Errorf("missing column: got %q, %v", k, err)
	}
	if got := EscapeKeyPart("a b%"); got != "a%20b%25" {
		t.Errorf("EscapeKeyPart = %q", got)
	}
}

func TestReadExpiration(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	cases := []struct {
		d    time.Duration
		want int32
	}{
		{0, 0},
		{-time.Second, 0},
		{time.Nanosecond, 2},
		{time.Second, 2},
		{1500 * time.Millisecond, 3},
		{time.Minute, 61},
		{30*24*time.Hour - time.Second, 30 * 24 * 3600},
		// One more second would be read as an absolute time in 1970.
		{30 * 24 * time.Hour, int32(1_800_000_000 + 30*24*3600 + 1)},
		{31 * 24 * time.Hour, int32(1_800_000_000 + 31*24*3600 + 1)},
	}
	for _, tc := range cases {
		if got := readExpiration(tc.d, now); got != tc.want {
			t.Errorf("readExpiration(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestNewReaderDefaults(t *testing.T) {
	r := NewReader(nil, nil, ReaderOptions{})
	if r.opts.CompactRatio != defaultCompactRatio || r.opts.LockPoll != defaultLockPoll {
		t.Errorf("defaults not applied: %+v", r.opts)
	}
	if ts := r.opts.Turnstile; ts.ComputeTime != defaultComputeTime || ts.Wait != defaultWait {
		t.Errorf("turnstile defaults: %+v", ts)
	}
	// An explicit compute time is also the default wait, as a generous
	// bound on how long another client's computation takes.
	r = NewReader(nil, nil, ReaderOptions{Turnstile: TurnstileOptions{ComputeTime: 5 * time.Second}})
	if r.opts.Turnstile.Wait != 5*time.Second {
		t.Errorf("wait = %v, want the compute time", r.opts.Turnstile.Wait)
	}
	r = NewReader(nil, nil, ReaderOptions{Turnstile: TurnstileOptions{Wait: -1}})
	if r.opts.Turnstile.Wait != -1 {
		t.Errorf("negative wait (no waiting) was replaced by %v", r.opts.Turnstile.Wait)
	}
}
