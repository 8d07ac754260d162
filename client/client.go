// Package client is what applications import to read the cache that
// cachewarden maintains: namespace versions, sets and counters, addressed
// by the names of the rules that maintain them, plus GetOrCompute
// (thundering-herd protection on memcached's meta protocol) and advisory
// locks.
//
// A Client is built from the daemon's own rule set and memcached servers,
// so every key it reads is byte for byte the key the daemon writes, on the
// server the daemon writes it to:
//
//	rs, _ := rulefile.LoadPaths("rules/")      // or rules.NewRuleSet
//	c, _ := client.New(client.Config{
//		Servers: []itemformat.Server{{Addr: "10.0.0.1:11211"}},
//		Rules:   rs,
//		DB:      db, // *sql.DB: runs the rules' load and recount queries
//	}, logger)
//	v, _ := c.Namespace(ctx, "user", client.Row{"id": 42})
//	interests, _ := c.Members(ctx, "user-interests", client.Row{"user_id": 42})
//	n, _ := c.Count(ctx, "post-comments", client.Row{"post_id": 9})
//
// The package links neither the daemon nor Kafka, a SQL driver or a YAML
// parser (rule files are loaded by package rulefile, which the application
// may import or not). docs/formats.md describes every item it reads.
//
// It is not the daemon's writer: it applies no change events and no cache
// ops (packages cacheops and counters do); item formats are package
// itemformat's.
package client

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Config describes the cache a Client reads. Servers, Distribution and
// Rules must be the daemon's; the zero values of the other fields give the
// documented defaults.
type Config struct {
	// Servers are the memcached servers exactly as the daemon's
	// memcached.servers lists them: same order, same text, same weights.
	Servers []itemformat.Server
	// Distribution is the daemon's memcached.distribution; "" means
	// itemformat.DefaultDistribution.
	Distribution string
	// Rules is the daemon's rule set: rulefile.LoadPaths of its rule
	// files, or rules.NewRuleSet.
	Rules *rules.RuleSet
	// DB runs the rules' load queries (Members) and recount queries
	// (Count) when a set or counter is missing. nil: a missing set or
	// counter is an error matching ErrMissing (unless Replica is set).
	DB Querier
	// Replica, when set, makes fills read a replica, fenced by the
	// daemon's source positions: the computations of GetOrComputeFrom
	// and GetOrComputeMultiFrom and the load and recount queries of
	// Members and Count (then DB is not used). GetOrCompute and
	// GetOrComputeMulti, whose computations read what they like, are not
	// fenced. README, "Reading from applications", and docs/formats.md,
	// "Source positions". nil: no replica.
	Replica *ReplicaConfig

	// Timeout bounds each memcached round trip (and dialing). Default
	// 500ms (metaproto.DefaultTimeout, the daemon's memcached.timeout).
	Timeout time.Duration
	// MaxIdleConns is the number of connections per server the client
	// keeps, and for the lease commands of GetOrCompute and
	// GetOrComputeMulti (meta protocol) also the most it has open at
	// once: those calls wait for a free connection beyond it. The other
	// reads (text protocol) open more when they need them and keep this
	// many idle. Default 8 (metaproto.DefaultConnsPerServer).
	MaxIdleConns int
	// Dial opens connections to memcached (for TLS, say); default
	// net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)

	// CompactRatio is the share of a set's tokens that compaction would
	// drop (removals and the additions they cancel, repeated additions)
	// at or above which Members rewrites the set in compact form. Default
	// 0.5; a value above 1 turns compaction on read off.
	CompactRatio float64
	// LockPoll is the mean interval between attempts of the blocking
	// Lock; each sleep is jittered by ±50%. Default 20ms.
	LockPoll time.Duration
	// Turnstile tunes GetOrCompute and GetOrComputeMulti.
	Turnstile TurnstileOptions

	// NamespaceHold, when positive, keeps every namespace version (and
	// master item) the client reads in process for this long: reads of it
	// within that time make no round trip. It is the staleness the
	// application accepts for namespaces: a bump is seen up to
	// NamespaceHold late, on top of the daemon's own delay. A master item
	// is held whole, version and bitmap together. Default 0: every read
	// goes to memcached.
	NamespaceHold time.Duration
}

// Querier runs SQL for the client. *sql.DB, *sql.Conn and *sql.Tx satisfy
// it with the application's own driver; the client imports none. Values
// from rows are always bound to '?' placeholders, never written into the
// query text.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// Row holds the column values a rule's key template (and, for Members and
// Count, its query arguments) needs, by column name: string, []byte, bool,
// any integer or float type, or rules.Value. They render into keys exactly
// as the same values in a change event do (rules.ValueOf).
type Row map[string]any

// ErrMissing matches (errors.Is) the error of Members or Count when the
// item is missing from memcached and cannot be rebuilt: the rule has no
// query or the Config no DB. It also matches memcache.ErrCacheMiss.
var ErrMissing = fmt.Errorf("client: not cached and no query to rebuild it: %w", memcache.ErrCacheMiss)

// ErrUnknownRule matches the error of an accessor given a rule name the
// rule set does not have, or a rule of another kind.
var ErrUnknownRule = errors.New("client: no such rule")

// readClient is the part of gomemcache's client the Client uses; tests
// wrap it to count round trips.
type readClient interface {
	Get(key string) (*memcache.Item, error)
	GetMulti(keys []string) (map[string]*memcache.Item, error)
	Add(item *memcache.Item) error
	Set(item *memcache.Item) error
	CompareAndSwap(item *memcache.Item) error
}

// Client reads the items cachewarden maintains. It is safe for concurrent
// use by any number of goroutines; Close it to close its connections.
type Client struct {
	mc    readClient
	gomc  *memcache.Client
	meta  *metaproto.Client
	sel   *itemformat.Selector
	rules map[string]*Rule
	hold  *holdCache
	db    Querier
	log   *slog.Logger
	cfg   Config
	// replica is Config.Replica with its defaults; nil without one.
	replica      *ReplicaConfig
	replicaStats replicaCounters
	// source is the replica's source server_id, read from the replica
	// when ReplicaConfig.SourceServerID is 0.
	source sourceCache
	// gens holds the last generation read per generation key (uint64
	// values), so that a counter is read with its generation in one
	// round trip (counterAt).
	gens sync.Map
}

const (
	defaultLockPoll = 20 * time.Millisecond
)

// New returns a Client for cfg. A nil logger discards log output. It
// fails when the servers, distribution or rules are missing or unusable;
// it does not connect.
func New(cfg Config, logger *slog.Logger) (*Client, error) {
	if cfg.Rules == nil {
		return nil, errors.New("client: Config.Rules is nil; load the daemon's rule files (rulefile.LoadPaths)")
	}
	sel, err := itemformat.NewSelector(cfg.Distribution, cfg.Servers)
	if err != nil {
		return nil, fmt.Errorf("client: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	replica, err := cfg.Replica.withDefaults()
	if err != nil {
		return nil, err
	}
	if replica != nil {
		if ct := cfg.Turnstile.ComputeTime; ct > 0 && ct <= replica.MaxWait {
			return nil, fmt.Errorf("client: Turnstile.ComputeTime %v must exceed Replica.MaxWait %v: the wait for the replica is part of each computation", ct, replica.MaxWait)
		}
		if cfg.Turnstile.ComputeTime <= 0 {
			cfg.Turnstile.ComputeTime = replica.MaxWait + defaultComputeTime
		}
	}
	cfg = cfg.withDefaults()
	mc := memcache.NewFromSelector(sel)
	mc.Timeout = cfg.Timeout
	mc.MaxIdleConns = cfg.MaxIdleConns
	if cfg.Dial != nil {
		mc.DialContext = cfg.Dial
	}
	c := &Client{
		mc:   &redialingClient{Client: mc, attempts: cfg.MaxIdleConns + 1},
		gomc: mc,
		meta: metaproto.NewClient(sel, metaproto.PoolConfig{
			ConnsPerServer: cfg.MaxIdleConns, Timeout: cfg.Timeout, Dial: cfg.Dial}),
		sel:     sel,
		rules:   make(map[string]*Rule, len(cfg.Rules.Rules())),
		hold:    newHoldCache(cfg.NamespaceHold),
		db:      cfg.DB,
		log:     logger,
		cfg:     cfg,
		replica: replica,
	}
	for _, r := range cfg.Rules.Rules() {
		c.rules[r.Name] = &Rule{c: c, rule: r}
	}
	return c, nil
}

func (cfg Config) withDefaults() Config {
	if cfg.Timeout <= 0 {
		cfg.Timeout = metaproto.DefaultTimeout
	}
	if cfg.MaxIdleConns <= 0 {
		cfg.MaxIdleConns = metaproto.DefaultConnsPerServer
	}
	if cfg.CompactRatio <= 0 {
		cfg.CompactRatio = itemformat.DefaultCompactRatio
	}
	if cfg.LockPoll <= 0 {
		cfg.LockPoll = defaultLockPoll
	}
	cfg.Turnstile = cfg.Turnstile.withDefaults()
	return cfg
}

// Close closes the client's connections. Calls after Close fail.
func (c *Client) Close() error {
	c.meta.Close()
	return c.gomc.Close()
}

// Memcache returns the gomemcache client the Client reads with. It routes
// keys as the daemon does, so the application may store and read its own
// items (those it builds from namespace versions, say) through it.
func (c *Client) Memcache() *memcache.Client { return c.gomc }

// Rule returns the read side of the named rule, or an error matching
// ErrUnknownRule.
func (c *Client) Rule(name string) (*Rule, error) {
	r := c.rules[name]
	if r == nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownRule, name)
	}
	return r, nil
}

// Key returns the memcached key of the named rule's item for row: the
// namespace version key of a bump rule, the set key, the counter key.
func (c *Client) Key(rule string, row Row) (string, error) {
	r, err := c.Rule(rule)
	if err != nil {
		return "", err
	}
	return r.Key(row)
}

// Rule is the read side of one rule: it renders the rule's keys and reads
// its items. It is safe for concurrent use.
type Rule struct {
	c    *Client
	rule *rules.Rule
}

// Name returns the rule's name.
func (r *Rule) Name() string { return r.rule.Name }

// Key returns the memcached key of the rule's item for row, byte for byte
// the key the daemon writes for a row change with these values (prefix,
// escaping and long-key hashing included). It fails when row lacks a
// placeholder column, holds NULL (nil) for one (the daemon makes no key of
// a NULL) or a value of an unsupported type.
//
// For a rule with copies it is the key the copies' keys derive from, not
// an item itself (CopyKeys lists those); for a rule with evidence, the
// entity's own namespace.
func (r *Rule) Key(row Row) (string, error) {
	raw, err := r.rendered(row)
	if err != nil {
		return "", err
	}
	return rules.FinishKey(raw), nil
}

// rendered renders the rule's prefix and key template for row, before
// the 250-byte rule.
func (r *Rule) rendered(row Row) ([]byte, error) {
	t := r.rule.Key
	buf := append(make([]byte, 0, len(r.rule.Prefix)+64), r.rule.Prefix...)
	var bad error
	buf, missing, ok := t.AppendRendered(buf, func(column string) (string, bool) {
		raw, found := row[column]
		if !found {
			return "", false
		}
		v, err := rules.ValueOf(raw)
		if err == nil && v.IsNull() {
			err = errors.New("NULL makes no key")
		}
		if err != nil && bad == nil {
			bad = fmt.Errorf("client: key %q: column %q: %w", t.String(), column, err)
		}
		return v.Text, true
	})
	switch {
	case bad != nil:
		return nil, bad
	case !ok:
		return nil, fmt.Errorf("client: key %q: row has no column %q", t.String(), missing)
	}
	return buf, nil
}

// args returns the values bound to the rule's query for row.
func (r *Rule) args(row Row) ([]any, error) {
	values := make([]rules.Value, len(r.rule.Args))
	for i, col := range r.rule.Args {
		raw, ok := row[col]
		if !ok {
			return nil, fmt.Errorf("client: rule %q: row has no column %q for the query", r.rule.Name, col)
		}
		v, err := rules.ValueOf(raw)
		if err != nil {
			return nil, fmt.Errorf("client: rule %q: column %q: %w", r.rule.Name, col, err)
		}
		values[i] = v
	}
	return rules.SQLArgs(values)
}

// ruleOf returns the named rule, which must be of kind.
func (c *Client) ruleOf(name string, kind rules.RuleKind) (*Rule, error) {
	r, err := c.Rule(name)
	if err != nil {
		return nil, err
	}
	if r.rule.Kind != kind {
		return nil, fmt.Errorf("%w: %q is a %s rule, not a %s rule", ErrUnknownRule, name, r.rule.Kind, kind)
	}
	return r, nil
}

// checkContext returns ctx's error, wrapped, when ctx is done. gomemcache
// takes no context: the Client checks ctx before each round trip, and
// Config.Timeout bounds each one.
func checkContext(ctx context.Context, what string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("client: %s: %w", what, err)
	}
	return nil
}

// atLeast returns the lifetime to give memcached (whose itemformat.Expiration
// rounds up to whole seconds) for an item that must live at least d:
// memcached counts whole seconds on its own clock and drops an item once
// that clock reaches the deadline, so an expiration of n seconds lasts
// between n-1 and n seconds; one second more, and the item lives at least
// d and less than d+2s (less than d+1s when d is whole seconds). d <= 0
// (no expiry) stays 0.
func atLeast(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d + time.Second
}

// readExpiration converts a lifetime into memcached's expiration field,
// for an item that must live at least d (atLeast). d <= 0 means no
// expiry (0).
func readExpiration(d time.Duration, now time.Time) int32 {
	return itemformat.Expiration(atLeast(d), now)
}

// sleepContext waits for d or until ctx ends, returning ctx's error then.
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
