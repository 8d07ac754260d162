package cacheops

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/itemformat"
)

// TokenLog keeps the daemon's own bookkeeping in memcached items of the
// set format ("+m1 +m2 -m1 ", members escaped): members are added and
// removed by appending tokens, never by a read-modify-write, and items
// are compacted with gets/cas, where a lost cas is fine. Unlike a rule's
// set, a missing item is an empty log: the first append creates it (add).
// Items never expire; memcached may still evict them. The daemon keeps
// its pending delayed bumps in such items (docs/operations.md). Safe for
// concurrent use.
type TokenLog struct {
	mc  *memcache.Client
	log *slog.Logger
}

// NewTokenLog returns a TokenLog over mc. logger may be nil.
func NewTokenLog(mc *memcache.Client, logger *slog.Logger) *TokenLog {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	return &TokenLog{mc: mc, log: logger}
}

// tokenLogAttempts bounds the append, add and compaction rounds of one
// Append.
const tokenLogAttempts = 3

// Append appends tokens (one or more "+m " or "-m " tokens, members
// escaped) to the log at key, creating the log when it is missing. When
// memcached refuses the append because the item would exceed its size
// limit, the log is rewritten compacted with the tokens applied (gets and
// cas), so that removals always go through; when the live members, the
// tokens applied, still do not fit, the error wraps ErrTooLarge. Errors are
// classified by Retryable.
func (l *TokenLog) Append(key string, tokens []byte) error {
	if err := itemformat.CheckKey(key); err != nil {
		return fmt.Errorf("cacheops: token log %q: %w", key, err)
	}
	if err := itemformat.CheckSetTokens(string(tokens)); err != nil {
		return fmt.Errorf("cacheops: token log %q: %w", key, err)
	}
	full := false
	for range tokenLogAttempts {
		err := l.mc.Append(&memcache.Item{Key: key, Value: tokens})
		switch {
		case err == nil:
			return nil
		case isItemTooLarge(err):
			full = true
		case !errors.Is(err, memcache.ErrNotStored):
			return fmt.Errorf("cacheops: append %q: %w", key, err)
		}
		// Refused: missing, or full (memcached answers NOT_STORED for
		// both). Look at the item.
		it, err := l.mc.Get(key)
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			err = l.mc.Add(&memcache.Item{Key: key, Value: tokens})
			switch {
			case err == nil:
				return nil
			case errors.Is(err, memcache.ErrNotStored):
				continue // created meanwhile: append to it
			case isItemTooLarge(err):
				return fmt.Errorf("cacheops: add %q: %d bytes of tokens: %w", key, len(tokens), ErrTooLarge)
			}
			return fmt.Errorf("cacheops: add %q: %w", key, err)
		case err != nil:
			return fmt.Errorf("cacheops: gets %q: %w", key, err)
		}
		full = true
		done, err := l.compactWith(it, tokens)
		switch {
		case done:
			return nil
		case err != nil:
			return fmt.Errorf("cacheops: append %q: %d bytes of tokens to %d bytes compacted: %w", key, len(tokens), len(it.Value), err)
		}
	}
	if full {
		return fmt.Errorf("cacheops: append %q: the log cannot take %d more bytes even compacted: %w", key, len(tokens), ErrTooLarge)
	}
	return fmt.Errorf("cacheops: append %q: %w", key, memcache.ErrNotStored)
}

// Members returns the escaped members of the logs at keys that exist (a
// missing log has none), and compacts those holding removed tokens.
func (l *TokenLog) Members(keys []string) (map[string][]string, error) {
	items, err := l.mc.GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("cacheops: token logs: get %d items: %w", len(keys), err)
	}
	out := make(map[string][]string, len(items))
	for key, it := range items {
		st := itemformat.DecodeSet(it.Value)
		out[key] = st.Members
		if st.Tokens > len(st.Members) {
			l.compact(it, st)
		}
	}
	return out, nil
}

// Compact rewrites the log at key without its removed tokens when it
// holds any, and returns the size in bytes of its value as compacted (0
// when it is missing). A lost cas is no error: the log changed meanwhile.
func (l *TokenLog) Compact(key string) (int, error) {
	it, err := l.mc.Get(key)
	switch {
	case errors.Is(err, memcache.ErrCacheMiss):
		return 0, nil
	case err != nil:
		return 0, fmt.Errorf("cacheops: gets %q: %w", key, err)
	}
	st := itemformat.DecodeSet(it.Value)
	if st.Tokens == len(st.Members) {
		return len(it.Value), nil
	}
	return l.compact(it, st), nil
}

// compactWith rewrites the log it (as read, with its cas id) without its
// removed tokens and with tokens applied. It reports whether the rewrite
// was stored; a lost cas is no error (the caller tries again), a rewrite
// that is still too large is ErrTooLarge.
func (l *TokenLog) compactWith(it *memcache.Item, tokens []byte) (bool, error) {
	value := make([]byte, 0, len(it.Value)+len(tokens))
	value = append(append(value, it.Value...), tokens...)
	st := itemformat.DecodeSet(value)
	err := l.mc.CompareAndSwap(&memcache.Item{Key: it.Key, Value: st.Compact(), Flags: it.Flags, CasID: it.CasID})
	switch {
	case err == nil:
		l.log.Debug("compacted a token log", "key", it.Key, "tokens", st.Tokens, "members", len(st.Members))
		return true, nil
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
		return false, nil
	case isItemTooLarge(err):
		return false, fmt.Errorf("%d live members: %w", len(st.Members), ErrTooLarge)
	}
	return false, err
}

// compact rewrites the log it (as read, with its cas id) without its
// removed tokens and returns the size of the value written; a lost cas
// means the log changed since, and the next compaction tries again.
func (l *TokenLog) compact(it *memcache.Item, st itemformat.SetState) int {
	value := st.Compact()
	err := l.mc.CompareAndSwap(&memcache.Item{Key: it.Key, Value: value, Flags: it.Flags, CasID: it.CasID})
	switch {
	case err == nil:
		l.log.Debug("compacted a token log", "key", it.Key, "tokens", st.Tokens, "members", len(st.Members))
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
	default:
		l.log.Warn("cannot compact a token log", "key", it.Key, "err", err)
	}
	return len(value)
}
