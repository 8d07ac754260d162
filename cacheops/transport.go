package cacheops

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
)

// transport carries an Applier's commands to memcached. Commands and
// replies are metaproto's: the meta transport sends them as they are, the
// text transport as the text protocol's requests.
type transport interface {
	// send sends one round of commands, no two for the same key, and
	// fills replies[i] (zeroed by the caller) with the answer to cmds[i].
	send(ctx context.Context, cmds []metaproto.Cmd, replies []metaproto.Reply)
	// vivify: an increment can create a missing item (ma N J), so a bump
	// is one command. quiet: a command can go without a reply on success.
	vivify() bool
	quiet() bool
	stats() transportStats
	probe(ctx context.Context) error
	close() error
}

// transportStats are a transport's cumulative counts (see ApplierStats).
type transportStats struct {
	roundTrips, commands, dials, brokenConns uint64
}

// metaTransport sends rounds over the meta protocol, pipelined: each
// server's commands in one write per connection (metaproto.Conn), the
// servers and connections at once.
type metaTransport struct {
	pool               *metaproto.Pool
	minCommandsPerConn int
	observe            RoundTripObserver
	log                *slog.Logger

	roundTrips, commands, dials, brokenConns atomic.Uint64

	// scratch holds *metaScratch, reused by the next round.
	scratch sync.Pool
}

// metaScratch is the memory of one round of the meta transport.
type metaScratch struct {
	byServer  []serverCmds
	exchanges []metaExchange
	cmds      []metaproto.Cmd
	replies   []metaproto.Reply
	idx       []int
}

// serverCmds are the indexes of a round's commands for one server.
type serverCmds struct {
	server *metaproto.Server
	idx    []int
}

// metaExchange is one connection's share of a round.
type metaExchange struct {
	server  *metaproto.Server
	cmds    []metaproto.Cmd
	replies []metaproto.Reply
}

func (t *metaTransport) vivify() bool { return true }
func (t *metaTransport) quiet() bool  { return true }
func (t *metaTransport) close() error { t.pool.Close(); return nil }

func (t *metaTransport) probe(ctx context.Context) error { return t.pool.Probe(ctx) }

func (t *metaTransport) stats() transportStats {
	return transportStats{roundTrips: t.roundTrips.Load(), commands: t.commands.Load(),
		dials: t.dials.Load(), brokenConns: t.brokenConns.Load()}
}

func (t *metaTransport) send(ctx context.Context, cmds []metaproto.Cmd, replies []metaproto.Reply) {
	sc, _ := t.scratch.Get().(*metaScratch)
	if sc == nil {
		sc = &metaScratch{}
	}
	defer func() {
		for i := range sc.byServer {
			sc.byServer[i].idx = sc.byServer[i].idx[:0]
		}
		clear(sc.exchanges[:cap(sc.exchanges)])
		clear(sc.cmds[:cap(sc.cmds)])
		clear(sc.replies[:cap(sc.replies)])
		t.scratch.Put(sc)
	}()
	byServer := sc.byServer[:0]
	total := 0
	for i := range cmds {
		s, err := t.pool.Server(cmds[i].Key)
		if err != nil {
			replies[i] = metaproto.Reply{Status: metaproto.Failed, Err: err}
			continue
		}
		total++
		j := 0
		for j < len(byServer) && byServer[j].server != s {
			j++
		}
		if j == len(byServer) {
			if j < cap(byServer) {
				byServer = byServer[:j+1]
				byServer[j].server, byServer[j].idx = s, byServer[j].idx[:0]
			} else {
				byServer = append(byServer, serverCmds{server: s, idx: make([]int, 0, len(cmds))})
			}
		}
		byServer[j].idx = append(byServer[j].idx, i)
	}
	sc.byServer = byServer
	if total == 0 {
		return
	}
	if cap(sc.cmds) < total {
		sc.cmds = make([]metaproto.Cmd, total)
		sc.replies = make([]metaproto.Reply, total)
		sc.idx = make([]int, total)
	}
	gcmds, greplies, order := sc.cmds[:total], sc.replies[:total], sc.idx[:total]
	exchanges := sc.exchanges[:0]
	k := 0
	for _, so := range byServer {
		n := len(so.idx)
		for _, i := range so.idx {
			gcmds[k], order[k] = cmds[i], i
			k++
		}
		conns := max(1, min(t.pool.ConnsPerServer(), n/t.minCommandsPerConn))
		per := (n + conns - 1) / conns
		base := k - n
		for start := 0; start < n; start += per {
			end := min(start+per, n)
			exchanges = append(exchanges, metaExchange{server: so.server,
				cmds: gcmds[base+start : base+end], replies: greplies[base+start : base+end]})
		}
	}
	sc.exchanges = exchanges
	var wg sync.WaitGroup
	for i := range exchanges {
		if i == len(exchanges)-1 {
			t.exchange(ctx, &exchanges[i])
		} else {
			wg.Go(func() { t.exchange(ctx, &exchanges[i]) })
		}
	}
	wg.Wait()
	for k, i := range order {
		replies[i] = greplies[k]
	}
}

// exchange runs one connection's share of a round.
func (t *metaTransport) exchange(ctx context.Context, x *metaExchange) {
	clear(x.replies)
	conn, dialed, err := t.pool.Acquire(ctx, x.server)
	if dialed {
		t.dials.Add(1)
	}
	if err != nil {
		// Nothing was sent.
		for j := range x.replies {
			x.replies[j] = metaproto.Reply{Status: metaproto.Failed, Err: err}
		}
		return
	}
	if err := CheckGuard(ctx); err != nil {
		// Asked again right before the write: Acquire may have waited,
		// or the process may have been stopped since the round's check.
		t.pool.Release(x.server, conn, false)
		for j := range x.replies {
			x.replies[j] = metaproto.Reply{Status: metaproto.Failed, Err: err}
		}
		return
	}
	start := time.Now()
	sent, err := conn.Exchange(ctx, x.cmds, x.replies)
	t.observe.Since(start)
	t.pool.Release(x.server, conn, err != nil)
	t.roundTrips.Add(1)
	t.commands.Add(uint64(sent))
	if err != nil {
		t.brokenConns.Add(1)
		t.log.Debug("memcached exchange failed; connection closed",
			"server", x.server.Addr().String(), "commands", sent, "err", err)
	}
}

// textTransport sends each command as a text-protocol request through a
// gomemcache client, a round's requests concurrently (at most
// concurrency at a time). It never sends quiet and cannot vivify: a bump
// is incr, add on a miss.
type textTransport struct {
	mc          *memcache.Client
	concurrency int
	observe     RoundTripObserver

	commands atomic.Uint64
}

func newTextTransport(mc *memcache.Client, concurrency int, observe RoundTripObserver) *textTransport {
	return &textTransport{mc: mc, concurrency: concurrency, observe: observe}
}

func (t *textTransport) vivify() bool                { return false }
func (t *textTransport) quiet() bool                 { return false }
func (t *textTransport) close() error                { return nil }
func (t *textTransport) probe(context.Context) error { return nil }

func (t *textTransport) stats() transportStats {
	n := t.commands.Load()
	return transportStats{roundTrips: n, commands: n}
}

func (t *textTransport) send(ctx context.Context, cmds []metaproto.Cmd, replies []metaproto.Reply) {
	workers := min(t.concurrency, len(cmds))
	if workers <= 1 {
		for i := range cmds {
			t.do(ctx, &cmds[i], &replies[i])
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(cmds) {
					return
				}
				t.do(ctx, &cmds[i], &replies[i])
			}
		})
	}
	wg.Wait()
}

// do sends one command as its text-protocol request and fills rep. It
// asks ctx's guard (WithGuard) right before the request: the round's
// requests go one after another on each worker.
func (t *textTransport) do(ctx context.Context, cmd *metaproto.Cmd, rep *metaproto.Reply) {
	if err := itemformat.CheckKey(cmd.Key); err != nil {
		*rep = metaproto.Reply{Status: metaproto.Failed, Err: err}
		return
	}
	if err := CheckGuard(ctx); err != nil {
		*rep = metaproto.Reply{Status: metaproto.Failed, Err: err}
		return
	}
	t.commands.Add(1)
	defer t.observe.Since(time.Now())
	switch cmd.Verb {
	case metaproto.VerbGet:
		// gomemcache's get sends gets: the item carries its cas id.
		it, err := t.mc.Get(cmd.Key)
		switch {
		case err == nil:
			*rep = metaproto.Reply{Status: metaproto.VA, Value: it.Value, CAS: it.CasID, Flags: it.Flags}
		case errors.Is(err, memcache.ErrCacheMiss):
			*rep = metaproto.Reply{Status: metaproto.EN}
		default:
			*rep = metaproto.Reply{Status: metaproto.Failed, Err: err}
		}
	case metaproto.VerbSet:
		it := &memcache.Item{Key: cmd.Key, Value: []byte(cmd.Data), Flags: cmd.Flags}
		if cmd.HasTTL {
			it.Expiration = int32(cmd.TTL)
		}
		var err error
		switch {
		case cmd.Mode == metaproto.ModeAppend:
			err = t.mc.Append(it)
		case cmd.Mode == metaproto.ModeAdd:
			err = t.mc.Add(it)
		case cmd.CAS != 0:
			it.CasID = cmd.CAS
			err = t.mc.CompareAndSwap(it)
		default:
			err = t.mc.Set(it)
		}
		*rep = textReply(err)
	case metaproto.VerbArith:
		var n uint64
		var err error
		if cmd.Mode == metaproto.ModeDecr {
			n, err = t.mc.Decrement(cmd.Key, cmd.Delta)
		} else {
			n, err = t.mc.Increment(cmd.Key, cmd.Delta)
		}
		if err == nil && cmd.ReturnValue {
			*rep = metaproto.Reply{Status: metaproto.VA, Value: strconv.AppendUint(nil, n, 10)}
			return
		}
		*rep = textReply(err)
	case metaproto.VerbDelete:
		*rep = textReply(t.mc.Delete(cmd.Key))
	}
}

// textReply turns gomemcache's answer to a store, an increment or a
// delete into the reply the meta protocol gives.
func textReply(err error) metaproto.Reply {
	switch {
	case err == nil:
		return metaproto.Reply{Status: metaproto.HD}
	case errors.Is(err, memcache.ErrNotStored):
		return metaproto.Reply{Status: metaproto.NS}
	case errors.Is(err, memcache.ErrCASConflict):
		return metaproto.Reply{Status: metaproto.EX}
	case errors.Is(err, memcache.ErrCacheMiss):
		return metaproto.Reply{Status: metaproto.NF}
	}
	return metaproto.Reply{Status: metaproto.Failed, Err: err}
}
