package cacheops

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/itemformat"
)

// MetaClient sends memcached meta commands for the read side (package
// client): mg with the lease flags that GetOrCompute builds on, ms with a
// cas, md with invalidation. It speaks the protocol of the pipelined
// writer (meta.go) over its own connection pools, routes every key with
// the selector it is given (the daemon's), and sends the commands of one
// call for one server in one write. It is safe for concurrent use.
type MetaClient struct {
	pool    *metaPool
	timeout time.Duration
}

// MetaClientConfig tunes a MetaClient. The zero value gives the
// documented defaults.
type MetaClientConfig struct {
	// ConnsPerServer bounds the connections to each server; calls wait
	// for a free one. Default 8.
	ConnsPerServer int
	// Timeout bounds dialing and each exchange with a server. Default
	// 500ms.
	Timeout time.Duration
	// Dial opens a connection; default net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

const (
	metaClientDefaultConns   = 8
	metaClientDefaultTimeout = 500 * time.Millisecond
)

// NewMetaClient returns a MetaClient that sends each key to the server sel
// picks for it. Close it to close its connections.
func NewMetaClient(sel memcache.ServerSelector, cfg MetaClientConfig) *MetaClient {
	if cfg.ConnsPerServer <= 0 {
		cfg.ConnsPerServer = metaClientDefaultConns
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = metaClientDefaultTimeout
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	pool := &metaPool{sel: sel, connsPerServer: cfg.ConnsPerServer, timeout: cfg.Timeout, dial: cfg.Dial,
		servers: make(map[string]*metaServer), byAddr: make(map[net.Addr]*metaServer)}
	return &MetaClient{pool: pool, timeout: cfg.Timeout}
}

// Close closes the idle connections, and the others when their exchanges
// end.
func (c *MetaClient) Close() { c.pool.close() }

// MetaGet asks for one item with mg: its value, cas id and remaining
// lifetime.
type MetaGet struct {
	Key string
	// Vivify, when positive, makes a miss create an empty item living
	// this long (rounded up to whole seconds) and hands this reader the
	// win (MetaItem.Won); readers that come while it exists get it with
	// MetaItem.WinSent (flag N).
	Vivify time.Duration
	// Recache, when positive, hands the win to the first reader that
	// finds less than this left of the item's lifetime (flag R).
	Recache time.Duration
}

// MetaItem is memcached's answer to one MetaGet.
type MetaItem struct {
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
func (c *MetaClient) Get(ctx context.Context, gets []MetaGet) ([]MetaItem, error) {
	cmds := make([]metaCmd, len(gets))
	for i, g := range gets {
		cmds[i] = metaCmd{verb: metaGet, key: g.Key, returnTTL: true}
		if g.Vivify > 0 {
			cmds[i].vivify, cmds[i].ttl = true, int64(itemformat.Expiration(g.Vivify, time.Now()))
		}
		if g.Recache > 0 {
			cmds[i].recache = int64((g.Recache + time.Second - 1) / time.Second)
		}
	}
	replies, err := c.pool.do(ctx, c.timeout, cmds)
	// A restarted memcached leaves the pooled connections dead: each
	// failed exchange closes its connection, and a read is safe to send
	// again on another or a new one.
	for range c.pool.connsPerServer {
		if err == nil || !metaConnectionClosed(err) || ctx.Err() != nil {
			break
		}
		replies, err = c.pool.do(ctx, c.timeout, cmds)
	}
	items := make([]MetaItem, len(gets))
	for i := range replies {
		rep := &replies[i]
		switch rep.status {
		case metaVA:
			items[i] = MetaItem{Found: true, Value: rep.value, CAS: rep.cas, TTL: rep.ttl,
				Won: rep.won, Stale: rep.stale, WinSent: rep.winSent}
		case metaEN:
		case metaFailed:
			err = errors.Join(err, fmt.Errorf("cacheops: mg %q: %w", gets[i].Key, rep.err))
		default:
			err = errors.Join(err, fmt.Errorf("cacheops: mg %q: %w: status %d", gets[i].Key, errMetaProtocol, rep.status))
		}
	}
	return items, err
}

// metaConnectionClosed reports whether err is what an exchange on a
// connection the server closed returns.
func metaConnectionClosed(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// MetaSet stores one item with ms.
type MetaSet struct {
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
func (c *MetaClient) Set(ctx context.Context, sets []MetaSet) []error {
	cmds := make([]metaCmd, len(sets))
	now := time.Now()
	for i, st := range sets {
		cmds[i] = metaCmd{verb: metaSet, key: st.Key, data: string(st.Value), cas: st.CAS}
		if e := itemformat.Expiration(st.TTL, now); e > 0 {
			cmds[i].ttl, cmds[i].hasTTL = int64(e), true
		}
		if st.Add {
			cmds[i].mode = metaModeAdd
		}
	}
	replies, _ := c.pool.do(ctx, c.timeout, cmds)
	errs := make([]error, len(sets))
	for i := range replies {
		errs[i] = metaStoreError("ms", sets[i].Key, &replies[i])
	}
	return errs
}

// Invalidate marks each key's item stale (md with I) for at most ttl
// (rounded up to whole seconds; 0 keeps the item's lifetime): readers get
// the value flagged stale, and the first of them the win to recompute it.
// It returns one error per key, nil when marked or missing.
func (c *MetaClient) Invalidate(ctx context.Context, keys []string, ttl time.Duration) []error {
	cmds := make([]metaCmd, len(keys))
	now := time.Now()
	for i, k := range keys {
		cmds[i] = metaCmd{verb: metaDelete, key: k, invalidate: true}
		if e := itemformat.Expiration(ttl, now); e > 0 {
			cmds[i].ttl, cmds[i].hasTTL = int64(e), true
		}
	}
	replies, _ := c.pool.do(ctx, c.timeout, cmds)
	errs := make([]error, len(keys))
	for i := range replies {
		if replies[i].status == metaNF {
			continue
		}
		errs[i] = metaStoreError("md", keys[i], &replies[i])
	}
	return errs
}

// DeleteIf deletes key if its cas id is still cas (md with C): nil when
// deleted or missing, memcache.ErrCASConflict when the item changed.
func (c *MetaClient) DeleteIf(ctx context.Context, key string, cas uint64) error {
	replies, _ := c.pool.do(ctx, c.timeout, []metaCmd{{verb: metaDelete, key: key, cas: cas}})
	if replies[0].status == metaNF {
		return nil
	}
	return metaStoreError("md", key, &replies[0])
}

// metaStoreError turns the reply to an ms or md into an error; nil for HD.
func metaStoreError(verb, key string, rep *metaReply) error {
	var err error
	switch rep.status {
	case metaHD:
		return nil
	case metaEX:
		err = memcache.ErrCASConflict
	case metaNF:
		err = memcache.ErrCacheMiss
	case metaNS:
		err = memcache.ErrNotStored
	case metaFailed:
		err = rep.err
	default:
		err = fmt.Errorf("%w: status %d", errMetaProtocol, rep.status)
	}
	return fmt.Errorf("cacheops: %s %q: %w", verb, key, err)
}

// do sends cmds, one exchange per server, the servers at once, and
// returns their replies in order. timeout bounds each exchange. The error
// joins the failures of exchanges (their commands' replies are
// metaFailed).
func (p *metaPool) do(ctx context.Context, timeout time.Duration, cmds []metaCmd) ([]metaReply, error) {
	replies := make([]metaReply, len(cmds))
	type batch struct {
		server *metaServer
		idx    []int
	}
	var batches []batch
	for i := range cmds {
		s, err := p.server(cmds[i].key)
		if err != nil {
			replies[i] = metaReply{status: metaFailed, err: err}
			continue
		}
		j := 0
		for j < len(batches) && batches[j].server != s {
			j++
		}
		if j == len(batches) {
			batches = append(batches, batch{server: s})
		}
		batches[j].idx = append(batches[j].idx, i)
	}
	errs := make([]error, len(batches))
	var wg sync.WaitGroup
	for b := range batches {
		wg.Go(func() {
			bt := batches[b]
			sub := make([]metaCmd, len(bt.idx))
			subReplies := make([]metaReply, len(bt.idx))
			for k, i := range bt.idx {
				sub[k] = cmds[i]
			}
			errs[b] = p.exchangeWith(ctx, timeout, bt.server, sub, subReplies)
			for k, i := range bt.idx {
				replies[i] = subReplies[k]
			}
		})
	}
	wg.Wait()
	return replies, errors.Join(errs...)
}

// exchangeWith runs one exchange with s.
func (p *metaPool) exchangeWith(ctx context.Context, timeout time.Duration, s *metaServer, cmds []metaCmd, replies []metaReply) error {
	conn, _, err := p.acquire(ctx, s)
	if err != nil {
		for i := range replies {
			replies[i] = metaReply{status: metaFailed, err: err}
		}
		return fmt.Errorf("cacheops: memcached %s: %w", s.addr, err)
	}
	_, err = conn.exchange(ctx, cmds, replies, timeout)
	p.release(s, conn, err != nil)
	if err != nil {
		return fmt.Errorf("cacheops: memcached %s: %w", s.addr, err)
	}
	return nil
}
