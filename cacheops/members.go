package cacheops

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/rules"
)

// MemberLoader returns the complete, current list of a set's members, raw
// (unescaped), typically from the database the set mirrors. It is called
// only when the set is missing from memcached.
type MemberLoader func(ctx context.Context) ([]string, error)

// Members returns the raw (unescaped) members of the set stored at key, in
// order of their surviving addition.
//
// When the item is dirty (see ReaderOptions.CompactRatio) Members also
// rewrites it in compact form with a compare-and-swap against the version
// it read, so a token appended in between makes the rewrite fail instead of
// being lost; a failed rewrite is ignored and the next read tries again.
//
// When the set is missing, Members calls load, adds the loaded set (members
// escaped, duplicates dropped) with lifetime ReaderOptions.SetTTL, and
// returns the loaded members. If another client added the set first, the
// add fails harmlessly and the loaded members are still returned. With a
// nil load a missing set yields an error that matches memcache.ErrCacheMiss
// under errors.Is. A set is never created partially: a load error is
// returned and nothing is stored.
//
// Errors writing the cache (compaction, the add) are logged, not returned:
// the caller still gets correct members. Safe for concurrent use; one round
// trip for a clean set, two for a dirty or missing one.
func (r *Reader) Members(ctx context.Context, key string, load MemberLoader) ([]string, error) {
	it, err := r.mc.Get(key)
	if err == nil {
		st := DecodeSet(it.Value)
		r.compactSet(it, st)
		return unescapeMembers(st.Members), nil
	}
	if !errors.Is(err, memcache.ErrCacheMiss) {
		return nil, fmt.Errorf("cacheops: members %q: %w", key, err)
	}
	if load == nil {
		return nil, fmt.Errorf("cacheops: members %q: %w", key, err)
	}
	loaded, err := load(ctx)
	if err != nil {
		return nil, fmt.Errorf("cacheops: members %q: load: %w", key, err)
	}
	members, escaped := dedupeMembers(loaded)
	err = r.mc.Add(&memcache.Item{
		Key:        key,
		Value:      EncodeSet(escaped),
		Expiration: readExpiration(r.opts.SetTTL, time.Now()),
	})
	switch {
	case err == nil:
	case errors.Is(err, memcache.ErrNotStored):
		r.log.Debug("set added by another client first", "key", key)
	default:
		r.log.Warn("cannot add loaded set", "key", key, "members", len(members), "err", err)
	}
	return members, nil
}

// compactSet rewrites a dirty set item it (as read, with its CAS id) in
// compact form. It reports whether the rewrite was stored.
func (r *Reader) compactSet(it *memcache.Item, st SetState) bool {
	if r.opts.CompactRatio > 1 || !st.Dirty(r.opts.CompactRatio) {
		return false
	}
	compacted := &memcache.Item{
		Key:        it.Key,
		Value:      EncodeSet(st.Members),
		Flags:      it.Flags,
		Expiration: readExpiration(r.opts.SetTTL, time.Now()),
		CasID:      it.CasID,
	}
	err := r.mc.CompareAndSwap(compacted)
	switch {
	case err == nil:
		r.log.Debug("compacted set", "key", it.Key, "tokens", st.Tokens, "members", len(st.Members))
		return true
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored):
		// Changed or evicted since the read; the next read retries.
		r.log.Debug("set compaction lost a race", "key", it.Key)
	default:
		r.log.Warn("cannot compact set", "key", it.Key, "err", err)
	}
	return false
}

func unescapeMembers(escaped []string) []string {
	out := make([]string, len(escaped))
	for i, m := range escaped {
		out[i] = Unescape(m)
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
