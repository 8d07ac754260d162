package client

import (
	"context"
	"errors"
	"fmt"
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
// When the set is missing, Members runs the rule's load query through
// Config.DB with the row's values for the rule's args, adds the loaded set
// (members escaped, duplicates dropped) with the rule's TTL, and returns
// the loaded members. If another client added the set first, the add
// fails harmlessly. A set is never created partially: a query error is
// returned and nothing is stored. Without a load query or a DB a missing
// set is an error matching ErrMissing.
//
// Errors writing the cache (compaction, the add) are logged, not
// returned: the caller still gets correct members. One round trip for a
// clean set, two for a dirty or missing one.
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
	it, err := c.mc.Get(key)
	if err == nil {
		st := itemformat.DecodeSet(it.Value)
		c.compactSet(it, st, r.rule.TTL)
		return unescapeMembers(st.Members), nil
	}
	if !errors.Is(err, memcache.ErrCacheMiss) {
		return nil, fmt.Errorf("client: members %q: %w", key, err)
	}
	if r.rule.Query == "" || c.db == nil {
		return nil, fmt.Errorf("client: members %q: %w", key, ErrMissing)
	}
	args, err := r.args(row)
	if err != nil {
		return nil, err
	}
	loaded, err := queryMembers(ctx, c.db, r.rule.Query, args)
	if err != nil {
		return nil, fmt.Errorf("client: members %q: load: %w", key, err)
	}
	members, escaped := dedupeMembers(loaded)
	if err := checkContext(ctx, "members "+key); err != nil {
		return members, nil // the members are correct; only the add is skipped
	}
	err = c.mc.Add(&memcache.Item{Key: key, Value: itemformat.EncodeSet(escaped), Expiration: readExpiration(r.rule.TTL, time.Now())})
	switch {
	case err == nil:
	case errors.Is(err, memcache.ErrNotStored):
		c.log.Debug("set added by another client first", "key", key)
	default:
		c.log.Warn("cannot add loaded set", "key", key, "members", len(members), "err", err)
	}
	return members, nil
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
		Value:      itemformat.EncodeSet(st.Members),
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
