package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Count returns the named count rule's counter for row.
//
// A counter is ASCII decimal (memcached pads one that a decrement
// shortened with spaces, which are ignored). When it is missing, or holds
// something that is not a count, Count runs the rule's recount query
// through Config.DB with the row's values for the rule's args, stores the
// result (add on a miss, so a value the daemon stored meanwhile wins; set
// over a non-numeric item) with the rule's TTL and returns it. When
// memcached fails the count comes from the query and nothing is stored.
// Without a recount query or a DB a missing counter is an error matching
// ErrMissing.
//
// Reads are exact: a counter the daemon keeps holds its fenced recount
// plus the deltas after it (docs/exact-counters.md), and Count returns it
// as it is. Count's own recount runs no snapshot and writes no fence, so
// the counter it stores is marked as a reader's count (flags
// itemformat.ReaderCountFlags): a daemon with exact counters on never
// increments it but recounts it, fenced, at the next change, so a change
// both in Count's query and still on its way to the daemon is never
// counted twice. With fencing off the daemon applies deltas to it as to
// any counter (docs/exact-counters.md, "What readers get").
func (c *Client) Count(ctx context.Context, rule string, row Row) (int64, error) {
	r, err := c.ruleOf(rule, rules.CountRule)
	if err != nil {
		return 0, err
	}
	return r.Count(ctx, row)
}

// Count is Client.Count for this rule, which must be a count rule.
func (r *Rule) Count(ctx context.Context, row Row) (int64, error) {
	if r.rule.Kind != rules.CountRule {
		return 0, fmt.Errorf("%w: %q is a %s rule, not a count rule", ErrUnknownRule, r.rule.Name, r.rule.Kind)
	}
	key, err := r.Key(row)
	if err != nil {
		return 0, err
	}
	c := r.c
	if err := checkContext(ctx, "count "+key); err != nil {
		return 0, err
	}
	it, err := c.mc.Get(key)
	store := c.mc.Add
	switch {
	case err == nil:
		if n, ok := itemformat.ParseCount(it.Value); ok {
			return n, nil
		}
		c.log.Warn("counter read found a non-numeric value; counting in MySQL", "key", key, "value_bytes", len(it.Value))
		store = c.mc.Set
	case errors.Is(err, memcache.ErrCacheMiss):
	default:
		c.log.Debug("counter get failed; counting in the database", "key", key, "err", err)
		store = nil
	}
	if r.rule.Query == "" || c.db == nil {
		return 0, fmt.Errorf("client: count %q: %w", key, ErrMissing)
	}
	args, err := r.args(row)
	if err != nil {
		return 0, err
	}
	n, err := queryCount(ctx, c.db, r.rule.Query, args)
	if err != nil {
		return 0, fmt.Errorf("client: count %q: recount: %w", key, err)
	}
	if store != nil && ctx.Err() == nil {
		err := store(&memcache.Item{Key: key, Value: strconv.AppendInt(nil, n, 10), Flags: itemformat.ReaderCountFlags,
			Expiration: readExpiration(r.rule.TTL, time.Now())})
		if err != nil && !errors.Is(err, memcache.ErrNotStored) {
			c.log.Debug("counter store failed", "key", key, "err", err)
		}
	}
	return n, nil
}
