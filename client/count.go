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
// through Config.DB (with Config.Replica: on the replica once it has
// applied the daemon's source position, see ReplicaConfig) with the row's
// values for the rule's args, stores the result (add on a miss, so a
// value the daemon stored meanwhile wins; set over a non-numeric item)
// with the rule's TTL and returns it. When
// memcached fails the count comes from the query and nothing is stored.
// Without a recount query or a DB a missing counter is an error matching
// ErrMissing.
//
// A counter lives at itemformat.CounterKey of its rendered key and its
// table's current generation, read in the same round trip as the counter
// at the generation the Client saw last (a second read when it moved):
// a counter of an earlier generation, which may have missed a lost
// change, is never read (docs/formats.md, "Generations").
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
	it, key, _, err := c.counterAt(ctx, key, r.rule.Generation)
	store := c.mc.Add
	switch {
	case err == nil && it != nil:
		if n, ok := itemformat.ParseCount(it.Value); ok {
			return n, nil
		}
		c.log.Warn("counter read found a non-numeric value; counting in MySQL", "key", key, "value_bytes", len(it.Value))
		store = c.mc.Set
	case err == nil:
	default:
		c.log.Debug("counter get failed; counting in the database", "key", key, "err", err)
		store = nil
	}
	if r.rule.Query == "" || !c.canFill() {
		return 0, fmt.Errorf("client: count %q: %w", key, ErrMissing)
	}
	args, err := r.args(row)
	if err != nil {
		return 0, err
	}
	src, err := c.fillFrom(ctx, "count "+strconv.Quote(key))
	if err != nil {
		return 0, err
	}
	defer src.release()
	n, err := queryCount(ctx, src.db, r.rule.Query, args)
	if err != nil {
		return 0, fmt.Errorf("client: count %q: recount: %w", key, err)
	}
	if store != nil && ctx.Err() == nil {
		err := store(&memcache.Item{Key: key, Value: strconv.AppendInt(nil, n, 10), Flags: itemformat.ReaderCountFlags,
			Expiration: readExpiration(src.lifetime(c, r.rule.TTL), time.Now())})
		if err != nil && !errors.Is(err, memcache.ErrNotStored) {
			c.log.Debug("counter store failed", "key", key, "err", err)
		}
	}
	return n, nil
}

// counterAt reads the counter whose rendered key is key under its
// table's current generation (docs/formats.md, "Generations"): it returns
// the counter item (nil when missing), the counter's key under that
// generation and the generation. It reads the generation item and the
// counter at the generation this Client saw last in one round trip; only
// when the generation has moved since (or is not known yet) is the
// counter read again. A missing generation is created (Client.generation)
// before anything is counted. err is a memcached failure; key is then the
// rendered key.
func (c *Client) counterAt(ctx context.Context, key, genKey string) (it *memcache.Item, counterKey string, gen uint64, err error) {
	guess, guessed := c.gens.Load(genKey)
	keys := []string{genKey}
	if guessed {
		keys = append(keys, itemformat.CounterKey(key, guess.(uint64)))
	}
	items, err := c.mc.GetMulti(keys)
	if err != nil {
		return nil, key, 0, err
	}
	gi := items[genKey]
	gen, ok := uint64(0), false
	if gi != nil {
		gen, ok = itemformat.ParseGeneration(gi.Value)
	}
	if !ok {
		if gen, err = c.generation(ctx, genKey, gi); err != nil {
			return nil, key, 0, err
		}
		// A new generation: no counter exists under it yet.
		c.gens.Store(genKey, gen)
		return nil, itemformat.CounterKey(key, gen), gen, nil
	}
	counterKey = itemformat.CounterKey(key, gen)
	if guessed && guess.(uint64) == gen {
		return items[counterKey], counterKey, gen, nil
	}
	c.gens.Store(genKey, gen)
	it, err = c.mc.Get(counterKey)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return nil, counterKey, gen, nil
	}
	return it, counterKey, gen, err
}
