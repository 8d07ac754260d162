package metaproto

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/itemformat"
)

// Client sends memcached meta commands for the read side (package
// client): mg with the lease flags that GetOrCompute builds on, ms with a
// cas, md with invalidation. It speaks the protocol of the pipelined
// writer (cacheops' meta transport) over its own connection pool, routes every key with
// the selector it is given (the daemon's), and sends the commands of one
// call for one server in one write. It is safe for concurrent use.
type Client struct {
	pool *Pool
}

// NewClient returns a Client that sends each key to the server sel
// picks for it, over a Pool of cfg's connections. Close it to close its
// connections.
func NewClient(sel memcache.ServerSelector, cfg PoolConfig) *Client {
	return &Client{pool: NewPool(sel, cfg)}
}

// Close closes the idle connections, and the others when their exchanges
// end.
func (c *Client) Close() { c.pool.Close() }

// Get asks for one item with mg: its value, cas id and remaining
// lifetime.
type Get struct {
	Key string
	// Vivify, when positive, makes a miss create an empty item living
	// this long (rounded up to whole seconds) and hands this reader the
	// win (Item.Won); readers that come while it exists get it with
	// Item.WinSent (flag N).
	Vivify time.Duration
	// Recache, when positive, hands the win to the first reader that
	// finds less than this left of the item's lifetime (flag R).
	Recache time.Duration
}

// Item is memcached's answer to one Get.
type Item struct {
	// Found is false when the item is missing (and was not vivified).
	Found bool
	Value []byte
	CAS   uint64
	// TTL is the remaining lifetime in seconds; -1 when the item never
	// expires.
	TTL int64
	// Won: this reader won the right to recompute the item (flag W).
	Won bool
	// Stale: the item was invalidated (md with I) and is being served
	// stale (flag X).
	Stale bool
	// WinSent: another reader already won (flag Z).
	WinSent bool
}

// Get sends gets (pipelined, one exchange per server, servers at once)
// and returns one item per get, in order. The error joins the failures of
// the servers that could not answer; the items of the others are filled.
func (c *Client) Get(ctx context.Context, gets []Get) ([]Item, error) {
	cmds := make([]Cmd, len(gets))
	for i, g := range gets {
		cmds[i] = Cmd{Verb: VerbGet, Key: g.Key, ReturnTTL: true}
		if g.Vivify > 0 {
			cmds[i].Vivify, cmds[i].TTL = true, int64(itemformat.Expiration(g.Vivify, time.Now()))
		}
		if g.Recache > 0 {
			cmds[i].Recache = int64((g.Recache + time.Second - 1) / time.Second)
		}
	}
	replies, err := c.pool.Do(ctx, cmds)
	// A restarted memcached leaves the pooled connections dead: each
	// failed exchange closes its connection, and a read is safe to send
	// again on another or a new one. Only the failed reads go again: a
	// vivifying read another server answered has won or lost its lease,
	// and sent again it would find its own placeholder.
	for range c.pool.ConnsPerServer() {
		if err == nil || !connectionClosed(err) || ctx.Err() != nil {
			break
		}
		var again []int
		for i := range replies {
			if replies[i].Status == Failed {
				again = append(again, i)
			}
		}
		resend := make([]Cmd, len(again))
		for j, i := range again {
			resend[j] = cmds[i]
		}
		var sent []Reply
		sent, err = c.pool.Do(ctx, resend)
		for j, i := range again {
			replies[i] = sent[j]
		}
	}
	items := make([]Item, len(gets))
	for i := range replies {
		rep := &replies[i]
		switch rep.Status {
		case VA:
			items[i] = Item{Found: true, Value: rep.Value, CAS: rep.CAS, TTL: rep.TTL,
				Won: rep.Won, Stale: rep.Stale, WinSent: rep.WinSent}
		case EN:
		default:
			err = errors.Join(err, fmt.Errorf("metaproto: mg %q: %w", gets[i].Key, ReplyError(rep)))
		}
	}
	return items, err
}

// connectionClosed reports whether err is what an exchange on a
// connection the server closed returns.
func connectionClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// Set stores one item with ms.
type Set struct {
	Key   string
	Value []byte
	// TTL is the item's lifetime (Expiration's rules); 0: no expiry.
	TTL time.Duration
	// CAS, when not 0, stores only over the item with this cas id.
	CAS uint64
	// Add stores only when the item is missing.
	Add bool
}

// Set stores sets (pipelined as Get) and returns one error per set, nil
// when stored: memcache.ErrCASConflict when the cas id did not match,
// memcache.ErrCacheMiss when a cas found no item, memcache.ErrNotStored
// when an add found one.
func (c *Client) Set(ctx context.Context, sets []Set) []error {
	cmds := make([]Cmd, len(sets))
	now := time.Now()
	for i, st := range sets {
		cmds[i] = Cmd{Verb: VerbSet, Key: st.Key, Data: string(st.Value), CAS: st.CAS}
		if e := itemformat.Expiration(st.TTL, now); e > 0 {
			cmds[i].TTL, cmds[i].HasTTL = int64(e), true
		}
		if st.Add {
			cmds[i].Mode = ModeAdd
		}
	}
	replies, _ := c.pool.Do(ctx, cmds)
	errs := make([]error, len(sets))
	for i := range replies {
		errs[i] = storeError("ms", sets[i].Key, &replies[i])
	}
	return errs
}

// Invalidate marks each key's item stale (md with I) for at most ttl
// (rounded up to whole seconds; 0 keeps the item's lifetime): readers get
// the value flagged stale, and the first of them the win to recompute it.
// It returns one error per key, nil when marked or missing.
func (c *Client) Invalidate(ctx context.Context, keys []string, ttl time.Duration) []error {
	cmds := make([]Cmd, len(keys))
	now := time.Now()
	for i, k := range keys {
		cmds[i] = Cmd{Verb: VerbDelete, Key: k, Invalidate: true}
		if e := itemformat.Expiration(ttl, now); e > 0 {
			cmds[i].TTL, cmds[i].HasTTL = int64(e), true
		}
	}
	replies, _ := c.pool.Do(ctx, cmds)
	errs := make([]error, len(keys))
	for i := range replies {
		if replies[i].Status == NF {
			continue
		}
		errs[i] = storeError("md", keys[i], &replies[i])
	}
	return errs
}

// DeleteIf deletes key if its cas id is still cas (md with C): nil when
// deleted or missing, memcache.ErrCASConflict when the item changed.
func (c *Client) DeleteIf(ctx context.Context, key string, cas uint64) error {
	replies, _ := c.pool.Do(ctx, []Cmd{{Verb: VerbDelete, Key: key, CAS: cas}})
	if replies[0].Status == NF {
		return nil
	}
	return storeError("md", key, &replies[0])
}

// storeError turns the reply to an ms or md into an error; nil for HD.
func storeError(verb, key string, rep *Reply) error {
	var err error
	switch rep.Status {
	case HD:
		return nil
	case EX:
		err = memcache.ErrCASConflict
	case NF:
		err = memcache.ErrCacheMiss
	case NS:
		err = memcache.ErrNotStored
	default:
		err = ReplyError(rep)
	}
	return fmt.Errorf("metaproto: %s %q: %w", verb, key, err)
}
