package cacheops_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// articleStore is the application's database access.
type articleStore interface {
	ArticleTitles(ctx context.Context, userID string) ([]string, error)
	ArticleTags(ctx context.Context, articleID string) ([]string, error)
}

// articleCache is an application's cached data layer. cachewarden's rules
// for it (with key prefix "blog:") keep
//
//   - a namespace version at "ns:user:{id}", bumped whenever one of the
//     user's articles changes, and
//   - a set at "tags:{article_id}" with the tags of each article.
type articleCache struct {
	cache  *cacheops.Reader
	db     articleStore
	prefix string
}

// UserArticleTitles returns a user's article titles. The cache key embeds
// the user's namespace version: when the daemon bumps it, the old entry is
// simply never read again. GetOrCompute makes sure that only one process
// at a time runs the query for a key.
func (a *articleCache) UserArticleTitles(ctx context.Context, userID string) ([]string, error) {
	nsKey, err := cacheops.Key(a.prefix, "ns:user:{id}", map[string]string{"id": userID})
	if err != nil {
		return nil, err
	}
	version, err := a.cache.Namespace(nsKey)
	if err != nil {
		return nil, err
	}
	key, err := cacheops.Key(a.prefix, "titles:{id}:v{version}", map[string]string{
		"id":      userID,
		"version": strconv.FormatUint(version, 10),
	})
	if err != nil {
		return nil, err
	}
	raw, err := a.cache.GetOrCompute(ctx, key, 10*time.Minute, func(ctx context.Context) ([]byte, error) {
		titles, err := a.db.ArticleTitles(ctx, userID)
		if err != nil {
			return nil, err
		}
		return json.Marshal(titles)
	})
	if err != nil {
		return nil, err
	}
	var titles []string
	err = json.Unmarshal(raw, &titles)
	return titles, err
}

// ArticleTags returns an article's tags from the set the daemon maintains,
// loading it from the database when it is missing.
func (a *articleCache) ArticleTags(ctx context.Context, articleID string) ([]string, error) {
	key, err := cacheops.Key(a.prefix, "tags:{article_id}", map[string]string{"article_id": articleID})
	if err != nil {
		return nil, err
	}
	return a.cache.Members(ctx, key, func(ctx context.Context) ([]string, error) {
		return a.db.ArticleTags(ctx, articleID)
	})
}

// RebuildFeed regenerates a shared feed, but only in one process at a time.
func (a *articleCache) RebuildFeed(ctx context.Context, rebuild func(context.Context) error) (ran bool, err error) {
	lock, ok, err := a.cache.TryLock(a.prefix+"lock:feed-rebuild", time.Minute)
	if err != nil || !ok {
		return false, err // another process is on it
	}
	defer lock.Unlock()
	return true, rebuild(ctx)
}

// Example shows an application reading through the helpers; the test
// below runs the same code against a real memcached.
func Example() {
	mc := memcache.New("127.0.0.1:11211")
	reader := cacheops.NewReader(mc, slog.Default(), cacheops.ReaderOptions{
		SetTTL: 24 * time.Hour, // the set rule's ttl
		Turnstile: cacheops.TurnstileOptions{
			ComputeTime: 3 * time.Second, // the slowest query, generously
			Wait:        200 * time.Millisecond,
		},
	})
	app := &articleCache{cache: reader, db: newMemoryStore(), prefix: "blog:"}

	ctx := context.Background()
	titles, err := app.UserArticleTitles(ctx, "12543")
	if err != nil {
		fmt.Println("cache unavailable, reading the database:", err)
		return
	}
	fmt.Println(titles)
}

// memoryStore is an in-memory articleStore that counts its queries.
type memoryStore struct {
	mu      sync.Mutex
	titles  map[string][]string
	tags    map[string][]string
	queries int
}

func newMemoryStore() *memoryStore {
	return &memoryStore{
		titles: map[string][]string{"12543": {"Caching sets", "Namespaces"}},
		tags:   map[string][]string{"7": {"memcached", "go lang"}},
	}
}

func (s *memoryStore) ArticleTitles(_ context.Context, userID string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries++
	return slices.Clone(s.titles[userID]), nil
}

func (s *memoryStore) ArticleTags(_ context.Context, articleID string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queries++
	return slices.Clone(s.tags[articleID]), nil
}

func (s *memoryStore) queryCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queries
}

func TestExampleApplication(t *testing.T) {
	mc := memcache.New(testsvc.Memcached(t))
	db := newMemoryStore()
	reader := cacheops.NewReader(mc, slog.New(slog.NewTextHandler(t.Output(), nil)), cacheops.ReaderOptions{SetTTL: time.Minute})
	prefix := "cwtest:example:" + testsvc.Unique() + ":"
	app := &articleCache{cache: reader, db: db, prefix: prefix}
	ctx := t.Context()

	titles, err := app.UserArticleTitles(ctx, "12543")
	if err != nil || !slices.Equal(titles, []string{"Caching sets", "Namespaces"}) {
		t.Fatalf("titles = %q, %v", titles, err)
	}
	if _, err := app.UserArticleTitles(ctx, "12543"); err != nil || db.queryCount() != 1 {
		t.Fatalf("second read queried the database: %d queries, %v", db.queryCount(), err)
	}

	// The user publishes an article; the daemon bumps the namespace.
	db.mu.Lock()
	db.titles["12543"] = append(db.titles["12543"], "Thundering herds")
	db.mu.Unlock()
	if _, err := mc.Increment(prefix+"ns:user:12543", 1); err != nil {
		t.Fatal(err)
	}
	titles, err = app.UserArticleTitles(ctx, "12543")
	if err != nil || len(titles) != 3 || db.queryCount() != 2 {
		t.Fatalf("after the bump: %q, %v, %d queries", titles, err, db.queryCount())
	}

	tags, err := app.ArticleTags(ctx, "7")
	if err != nil || !slices.Equal(tags, []string{"memcached", "go lang"}) {
		t.Fatalf("tags = %q, %v", tags, err)
	}
	// A tag is added; the daemon appends it to the set.
	if err := mc.Append(&memcache.Item{Key: prefix + "tags:7", Value: cacheops.AppendToken(nil, true, "cache invalidation")}); err != nil {
		t.Fatal(err)
	}
	tags, err = app.ArticleTags(ctx, "7")
	if err != nil || !slices.Equal(tags, []string{"memcached", "go lang", "cache invalidation"}) || db.queryCount() != 3 {
		t.Fatalf("tags after the append = %q, %v, %d queries", tags, err, db.queryCount())
	}

	// While one process rebuilds the feed, another does not.
	inner := false
	ran, err := app.RebuildFeed(ctx, func(ctx context.Context) error {
		ranInner, err := app.RebuildFeed(ctx, func(context.Context) error { return nil })
		inner = ranInner
		return err
	})
	if !ran || err != nil || inner {
		t.Fatalf("rebuild ran=%v err=%v, nested rebuild ran=%v", ran, err, inner)
	}
	if ran, err := app.RebuildFeed(ctx, func(context.Context) error { return nil }); !ran || err != nil {
		t.Fatalf("rebuild after release: ran=%v err=%v", ran, err)
	}
}
