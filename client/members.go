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

// Members returns the members (raw, unescaped) of the named set rule's
// set for row, in order of their surviving addition.
//
// When the item is dirty (see Config.CompactRatio) Members also rewrites
// it in compact form with a compare-and-swap against the version it read,
// so a token appended in between makes the rewrite fail instead of being
// lost; a failed rewrite is ignored and the next read tries again.
//
// A set is valid only under its table's current generation, read in the
// same round trip (docs/formats.md, "Generations"); a set of another
// generation is treated as missing and replaced (with cas) by the load.
//
// When the set is missing, Members runs the rule's load query through
// Config.DB (with Config.Replica: on the replica once it has applied the
// daemon's source position, see ReplicaConfig) with the row's values for
// the rule's args, adds the loaded set
// (members escaped, duplicates dropped) with the rule's TTL, and returns
// the loaded members. If another client added the set first, the add
// fails harmlessly. A set is never created partially: a query error is
// returned and nothing is stored. Without a load query or a DB a missing
// set is an error matching ErrMissing.
//
// Errors writing the cache (compaction, the add) are logged, not
// returned: the caller still gets correct members. One round trip for a
// clean set, two for a dirty, missing or stale one (three when the
// generation item is missing too).
func (c *Client) Members(ctx context.Context, rule string, row Row) ([]string, error) {
	r, err := c.ruleOf(rule, rules.SetRule)
	if err != nil {
		return nil, err
	}
	return r.Members(ctx, row)
}

// Members is Client.Members for this rule, which must be a set rule.
func (r *Rule) Members(ctx context.Context, row Row) ([]string, error) {
	if r.rule.Kind != rules.SetRule {
		return nil, fmt.Errorf("%w: %q is a %s rule, not a set rule", ErrUnknownRule, r.rule.Name, r.rule.Kind)
	}
	key, err := r.Key(row)
	if err != nil {
		return nil, err
	}
	c := r.c
	if err := checkContext(ctx, "members "+key); err != nil {
		return nil, err
	}
	// The set and its table's generation in one round trip
	// (docs/formats.md, "Generations").
	genKey := r.rule.Generation
	items, err := c.mc.GetMulti([]string{key, genKey})
	if err != nil {
		return nil, fmt.Errorf("client: members %q: %w", key, err)
	}
	it, gi := items[key], items[genKey]
	gen, genOK := uint64(0), false
	if gi != nil {
		gen, genOK = itemformat.ParseGeneration(gi.Value)
	}
	if it != nil {
		st := itemformat.DecodeSet(it.Value)
		if genOK && st.ValidAt(gen) {
			c.compactSet(it, st, r.rule.TTL)
			return unescapeMembers(st.Members), nil
		}
		// Loaded under another generation (a change of its table was
		// lost since, or the generation was evicted): as good as missing.
		c.log.Debug("set of another generation; loading it again", "key", key, "generation_key", genKey)
	}
	if r.rule.Query == "" || !c.canFill() {
		return nil, fmt.Errorf("client: members %q: %w", key, ErrMissing)
	}
	return r.loadMembers(ctx, row, key, it, gi, gen, genOK)
}

// loadMembers runs the set rule's load query for row and stores the
// loaded set at key under the table's generation gen (read from gi when
// genOK is false), over it (the stale item read, nil when missing). It
// returns the loaded members, also when they could not be stored.
func (r *Rule) loadMembers(ctx context.Context, row Row, key string, it, gi *memcache.Item, gen uint64, genOK bool) ([]string, error) {
	c := r.c
	args, err := r.args(row)
	if err != nil {
		return nil, err
	}
	// The generation is known before the load query runs, so that a
	// change lost during the load leaves the loaded set stale.
	store := true
	if !genOK {
		if gen, err = c.generation(ctx, r.rule.Generation, gi); err != nil {
			c.log.Warn("cannot read or create the generation; the loaded set is not stored", "key", key, "generation_key", r.rule.Generation, "err", err)
			store = false
		}
	}
	src, err := c.fillFrom(ctx, "members "+strconv.Quote(key))
	if err != nil {
		return nil, err
	}
	defer src.release()
	loaded, err := queryMembers(ctx, src.db, r.rule.Query, args)
	if err != nil {
		return nil, fmt.Errorf("client: members %q: load: %w", key, err)
	}
	members, escaped := dedupeMembers(loaded)
	if !store || checkContext(ctx, "members "+key) != nil {
		return members, nil // the members are correct; only the store is skipped
	}
	item := &memcache.Item{Key: key, Value: itemformat.EncodeSetAt(gen, escaped), Expiration: readExpiration(src.lifetime(c, r.rule.TTL), time.Now())}
	c.storeLoadedSet(item, it, len(members))
	return members, nil
}

// storeLoadedSet stores item, a loaded set of n members: added when the
// set was missing (stale is nil), else swapped over the stale item read.
// A lost race is logged at debug level, another failure as a warning.
func (c *Client) storeLoadedSet(item, stale *memcache.Item, n int) {
	var err error
	if stale == nil {
		err = c.mc.Add(item)
	} else {
		// Over the stale set, only if no token was appended to it since
		// it was read: such a token may be missing from the load.
		item.CasID = stale.CasID
		err = c.mc.CompareAndSwap(item)
	}
	switch {
	case err == nil:
	case errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCASConflict):
		c.log.Debug("set stored or changed by another client first", "key", item.Key)
	default:
		c.log.Warn("cannot store loaded set", "key", item.Key, "members", n, "err", err)
	}
}

// generation returns the generation of the table whose generation item
// is genKey, read as gi (nil when missing): a missing one is created
// (with add; a lost race reads the winner's), and one that holds no
// generation is replaced by a new one. A new generation never repeats an
// earlier one, so no set or counter of the table is valid under it.
func (c *Client) generation(ctx context.Context, genKey string, gi *memcache.Item) (uint64, error) {
	if gi == nil {
		return c.version(ctx, genKey, 0)
	}
	c.log.Warn("generation item holds no generation; replacing it", "key", genKey, "value_bytes", len(gi.Value))
	gen := itemformat.NewGeneration(time.Now())
	if err := c.mc.Set(&memcache.Item{Key: genKey, Value: strconv.AppendUint(nil, gen, 10)}); err != nil {
		return 0, fmt.Errorf("client: generation %q: set: %w", genKey, err)
	}
	return gen, nil
}

// compactSet rewrites a dirty set item it (as read, with its cas id) in
// compact form with lifetime ttl. It reports whether the rewrite was
// stored.
func (c *Client) compactSet(it *memcache.Item, st itemformat.SetState, ttl time.Duration) bool {
	if c.cfg.CompactRatio > 1 || !st.Dirty(c.cfg.CompactRatio) {
		return false
	}
	err := c.mc.CompareAndSwap(&memcache.Item{
		Key:        it.Key,
		Value:      st.Compact(),
		Flags:      it.Flags,
		Expiration: readExpiration(ttl, time.Now()),
		CasID:      it.CasID,
	})
	switch {
	case err == nil:
		c.log.Debug("compacted set", "key", it.Key, "tokens", st.Tokens, "members", len(st.Members))
		return true
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored):
		// Changed or evicted since the read; the next read retries.
		c.log.Debug("set compaction lost a race", "key", it.Key)
	default:
		c.log.Warn("cannot compact set", "key", it.Key, "err", err)
	}
	return false
}

func unescapeMembers(escaped []string) []string {
	out := make([]string, len(escaped))
	for i, m := range escaped {
		out[i] = itemformat.Unescape(m)
	}
	return out
}

// dedupeMembers drops repeated members, keeping the first occurrence, and
// returns the raw members with their escaped forms.
func dedupeMembers(raw []string) (members, escaped []string) {
	seen := make(map[string]struct{}, len(raw))
	members = make([]string, 0, len(raw))
	escaped = make([]string, 0, len(raw))
	for _, m := range raw {
		if _, dup := seen[m]; dup {
			continue
		}
		seen[m] = struct{}{}
		members = append(members, m)
		escaped = append(escaped, rules.Escape(m))
	}
	return members, escaped
}
