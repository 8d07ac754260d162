package metaproto

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
)

// Conn is one connection to a memcached server.
type Conn struct {
	nc   net.Conn
	r    *bufio.Reader
	wbuf []byte
	// timeout bounds each exchange: the Pool's Timeout.
	timeout time.Duration
	// closed is set once nc is closed; the connection is then discarded.
	closed bool
}

// maxKeptBuffer bounds the write buffer a connection keeps between
// exchanges.
const maxKeptBuffer = 4 << 20

// Exchange sends cmds and reads their replies into replies (len(replies)
// >= len(cmds)). The Pool's Timeout bounds the whole exchange; a
// cancelled ctx ends it at once. A non-nil error means the connection is broken and must be
// closed; then every command without a settled reply has a Failed
// reply with unknown set.
func (c *Conn) Exchange(ctx context.Context, cmds []Cmd, replies []Reply) (sent int, err error) {
	buf, sent := appendPipeline(c.wbuf[:0], cmds, replies)
	if cap(buf) <= maxKeptBuffer {
		c.wbuf = buf[:0]
	} else {
		c.wbuf = nil
	}
	if sent == 0 {
		return 0, nil
	}
	if err := c.nc.SetDeadline(time.Now().Add(c.timeout)); err != nil {
		failPending(replies[:len(cmds)], err)
		return sent, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	written := make(chan error, 1)
	go func() {
		_, err := c.nc.Write(buf)
		written <- err
	}()
	err = readReplies(c.r, cmds, replies[:len(cmds)])
	if err != nil {
		// Unblocks a write that waits for the server to read.
		c.close()
	}
	if werr := <-written; err == nil && werr != nil {
		// The server sent every reply, so it read every command; a
		// write error now is a failure to report all the same.
		err = werr
	}
	if !stop() {
		// ctx was cancelled during the exchange; the deadline may be in
		// the past, and the callback may still be running.
		c.close()
		if err == nil {
			return sent, nil // done before the cancellation took effect
		}
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			err = fmt.Errorf("no complete reply within %v: %w", c.timeout, err)
		}
		failPending(replies[:len(cmds)], err)
	}
	return sent, err
}

func (c *Conn) close() {
	if !c.closed {
		c.closed = true
		c.nc.Close()
	}
}

// failPending marks the replies still pending as failed with unknown
// outcome.
func failPending(replies []Reply, err error) {
	for i := range replies {
		if replies[i].Status == Pending {
			replies[i] = Reply{Status: Failed, Err: err, Unknown: true}
		}
	}
}

// Server is the connection pool of one memcached server: at most
// len(slots) connections exist, each either idle in slots or used by one
// exchange.
type Server struct {
	addr  net.Addr
	slots chan *Conn // nil entries: a connection may be dialed
}

// Addr is the server's address.
func (s *Server) Addr() net.Addr { return s.addr }

func newServer(addr net.Addr, conns int) *Server {
	s := &Server{addr: addr, slots: make(chan *Conn, conns)}
	for range conns {
		s.slots <- nil
	}
	return s
}

// PoolConfig tunes a Pool: the settings of the connections to memcached,
// kept once, in the Pool (its users read them back from it). The zero
// value gives the documented defaults.
type PoolConfig struct {
	// ConnsPerServer is the most connections to one server that exist at
	// once; exchanges wait for a free one. Default DefaultConnsPerServer.
	ConnsPerServer int
	// Timeout bounds dialing, the probe of each server and each exchange
	// (writing its commands and reading their replies). Default
	// DefaultTimeout.
	Timeout time.Duration
	// Dial opens a connection to a server; default
	// net.Dialer.DialContext.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Defaults of PoolConfig: of every meta-protocol connection to memcached
// (the pipelined writer's, the counters' recount stores, the read side's
// leases). The daemon's memcached.timeout defaults to DefaultTimeout.
const (
	// DefaultConnsPerServer is the number of connections to each server:
	// the daemon applies the batches of several partitions at once, and
	// with 2 each batch of a round took both while the others waited.
	DefaultConnsPerServer = 8
	// DefaultTimeout bounds dialing and each exchange with a server.
	DefaultTimeout = 500 * time.Millisecond
)

// withDefaults returns cfg with the documented defaults filled in.
func (cfg PoolConfig) withDefaults() PoolConfig {
	if cfg.ConnsPerServer <= 0 {
		cfg.ConnsPerServer = DefaultConnsPerServer
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = d.DialContext
	}
	return cfg
}

// NewPool returns a Pool over the servers sel names. Close it to close
// its connections.
func NewPool(sel memcache.ServerSelector, cfg PoolConfig) *Pool {
	return &Pool{sel: sel, cfg: cfg.withDefaults(),
		servers: make(map[string]*Server), byAddr: make(map[net.Addr]*Server)}
}

// ConnsPerServer returns the most connections to one server
// (PoolConfig.ConnsPerServer, defaults filled in).
func (p *Pool) ConnsPerServer() int { return p.cfg.ConnsPerServer }

// Pool holds the connection pools of the servers a selector names.
// It is safe for concurrent use.
type Pool struct {
	sel memcache.ServerSelector
	cfg PoolConfig // defaults filled in

	mu sync.Mutex
	// servers holds the pools by network and address; byAddr caches them
	// by the net.Addr values the selector returns.
	servers map[string]*Server
	byAddr  map[net.Addr]*Server
	closed  bool
}

// maxAddrs bounds Pool.byAddr.
const maxAddrs = 1024

// Server returns the pool of the server that key lives on: the one the
// selector picks, exactly as gomemcache's client does.
func (p *Pool) Server(key string) (*Server, error) {
	addr, err := p.sel.PickServer(key)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.byAddr[addr]; s != nil {
		return s, nil
	}
	// A selector may return new net.Addr values for the same servers
	// (memcache.ServerList after SetServers): pools go by address.
	name := addr.Network() + "://" + addr.String()
	s := p.servers[name]
	if s == nil {
		s = newServer(addr, p.cfg.ConnsPerServer)
		p.servers[name] = s
	}
	if len(p.byAddr) >= maxAddrs {
		clear(p.byAddr)
	}
	p.byAddr[addr] = s
	return s, nil
}

// Acquire takes a connection of s, dialing one if needed; it waits while
// every connection is in use. Give it back with release.
func (p *Pool) Acquire(ctx context.Context, s *Server) (c *Conn, dialed bool, err error) {
	select {
	case c = <-s.slots:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if c != nil {
		return c, false, nil
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		s.slots <- nil
		return nil, false, fmt.Errorf("metaproto: pool closed: %w", net.ErrClosed)
	}
	dctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	nc, err := p.cfg.Dial(dctx, s.addr.Network(), s.addr.String())
	cancel()
	if err != nil {
		s.slots <- nil
		return nil, false, fmt.Errorf("dial memcached %s: %w", s.addr, err)
	}
	return &Conn{nc: nc, r: bufio.NewReaderSize(nc, readBuffer), timeout: p.cfg.Timeout}, true, nil
}

// Release gives c back to s; a broken c is closed and its slot freed.
func (p *Pool) Release(s *Server, c *Conn, broken bool) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if broken || closed || c.closed {
		c.close()
		c = nil
	}
	s.slots <- c
}

// Close closes the idle connections; connections in use are closed when
// released.
func (p *Pool) Close() {
	p.mu.Lock()
	p.closed = true
	servers := make([]*Server, 0, len(p.servers))
	for _, s := range p.servers {
		servers = append(servers, s)
	}
	p.mu.Unlock()
	for _, s := range servers {
		taken := 0
	drain:
		for range cap(s.slots) {
			select {
			case c := <-s.slots:
				taken++
				if c != nil {
					c.close()
				}
			default:
				break drain
			}
		}
		for range taken {
			s.slots <- nil
		}
	}
}

// Do sends cmds, one exchange per server, the servers at once, and
// returns their replies in order. The Pool's Timeout bounds each
// exchange. The error
// joins the failures of exchanges (their commands' replies are
// Failed).
func (p *Pool) Do(ctx context.Context, cmds []Cmd) ([]Reply, error) {
	replies := make([]Reply, len(cmds))
	type batch struct {
		server *Server
		idx    []int
	}
	var batches []batch
	for i := range cmds {
		s, err := p.Server(cmds[i].Key)
		if err != nil {
			replies[i] = Reply{Status: Failed, Err: err}
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
			sub := make([]Cmd, len(bt.idx))
			subReplies := make([]Reply, len(bt.idx))
			for k, i := range bt.idx {
				sub[k] = cmds[i]
			}
			errs[b] = p.exchangeWith(ctx, bt.server, sub, subReplies)
			for k, i := range bt.idx {
				replies[i] = subReplies[k]
			}
		})
	}
	wg.Wait()
	return replies, errors.Join(errs...)
}

// exchangeWith runs one exchange with s.
func (p *Pool) exchangeWith(ctx context.Context, s *Server, cmds []Cmd, replies []Reply) error {
	conn, _, err := p.Acquire(ctx, s)
	if err != nil {
		for i := range replies {
			replies[i] = Reply{Status: Failed, Err: err}
		}
		return fmt.Errorf("metaproto: memcached %s: %w", s.addr, err)
	}
	_, err = conn.Exchange(ctx, cmds, replies)
	p.Release(s, conn, err != nil)
	if err != nil {
		return fmt.Errorf("metaproto: memcached %s: %w", s.addr, err)
	}
	return nil
}

// ErrNoMetaProtocol marks a server that does not answer the meta commands
// the meta transport needs (memcached older than 1.6, or a proxy that does
// not route them); memcached.protocol text serves such servers.
var ErrNoMetaProtocol = errors.New("memcached does not speak the meta protocol the pipelined writer needs; set memcached.protocol: text")

// probeKey is the item the probe creates (for one second).
const probeKey = "cachewarden:meta-probe"

// Probe checks that every server answers what the writer sends: an
// arithmetic command that creates a missing item (ma with N and J) and
// the no-op that ends a pipelined round (mn), with opaque tokens. It
// returns an error wrapping ErrNoMetaProtocol, naming the server and its
// answer, when a server answers otherwise; a network error as it is.
func (p *Pool) Probe(ctx context.Context) error {
	return p.sel.Each(func(addr net.Addr) error {
		return p.probeServer(ctx, addr)
	})
}

func (p *Pool) probeServer(ctx context.Context, addr net.Addr) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout)
	defer cancel()
	conn, err := p.cfg.Dial(ctx, addr.Network(), addr.String())
	if err != nil {
		return fmt.Errorf("metaproto: probe %s: %w", addr, err)
	}
	defer conn.Close()
	if d, ok := ctx.Deadline(); ok {
		conn.SetDeadline(d)
	}
	if _, err := io.WriteString(conn, "ma "+probeKey+" N1 J0 D0 O7\r\nmn\r\n"); err != nil {
		return fmt.Errorf("metaproto: probe %s: %w", addr, err)
	}
	r := bufio.NewReader(conn)
	first, err := r.ReadString('\n')
	if err != nil {
		return fmt.Errorf("metaproto: probe %s: %w", addr, err)
	}
	first = strings.TrimRight(first, "\r\n")
	ok := (strings.HasPrefix(first, "HD ") || strings.HasPrefix(first, "VA ")) && strings.Contains(first+" ", " O7 ")
	if ok && strings.HasPrefix(first, "VA ") {
		// The value line follows.
		if _, err := r.ReadString('\n'); err != nil {
			return fmt.Errorf("metaproto: probe %s: %w", addr, err)
		}
	}
	if ok {
		second, err := r.ReadString('\n')
		if err != nil {
			return fmt.Errorf("metaproto: probe %s: %w", addr, err)
		}
		if strings.TrimRight(second, "\r\n") == "MN" {
			return nil
		}
		first = strings.TrimRight(second, "\r\n")
	}
	return fmt.Errorf("metaproto: probe %s: answered %q to %q: %w", addr, first, "ma "+probeKey+" N1 J0 D0 O7", ErrNoMetaProtocol)
}
