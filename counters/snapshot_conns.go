package counters

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
)

// snapshotConnMaxIdle is how long a snapshot connection may wait unused
// before it is closed instead of reused: servers (wait_timeout) and
// proxies close idle sessions, and a recount should not be the first to
// find out.
const snapshotConnMaxIdle = 30 * time.Second

// snapshotConnMaxStmts bounds the recount queries one snapshot connection
// keeps prepared; past it they are all closed and prepared again as used.
// Recount queries come from rule files, so a daemon has a few.
const snapshotConnMaxStmts = 64

// snapshotConns holds the connections CountInSnapshot counts on, out of
// the pool: each session is REPEATABLE READ from its start (so no SET
// TRANSACTION precedes a snapshot) and keeps the recount queries it has
// prepared (so a count is one execution). A recount in a snapshot takes
// four round trips: START TRANSACTION, the snapshot's position, the
// count, COMMIT.
//
// At most cap(slots) connections exist, half the pool's (at least one):
// the other half stays for set loads and plain recounts, which use the
// pool. Recounts in snapshots beyond that wait for a connection. A pool
// of one connection cannot spare it: each recount then takes the
// connection from the pool and gives it back, setting the session's
// isolation level and preparing the query each time. Safe for concurrent
// use.
type snapshotConns struct {
	db *sql.DB
	// keep: connections stay out of the pool between recounts.
	keep bool
	once sync.Once
	// maxAge closes connections older than this (the pool's
	// ConnMaxLifetime, which does not apply to connections held out of
	// it); 0 means no limit.
	maxAge time.Duration
	// slots holds the idle connections; a nil entry is room for one
	// more connection.
	slots chan *snapshotConn
}

// snapshotConn is a connection of snapshotConns with its prepared queries.
type snapshotConn struct {
	conn       *sql.Conn
	stmts      map[string]*sql.Stmt
	born, used time.Time
	// reused: the connection served an earlier recount, so a broken
	// connection found now may have died while idle.
	reused bool
}

func newSnapshotConns(db *sql.DB, maxOpen int, maxAge time.Duration) *snapshotConns {
	n := max(1, maxOpen/2)
	p := &snapshotConns{db: db, keep: maxOpen > 1, maxAge: maxAge, slots: make(chan *snapshotConn, n)}
	for range n {
		p.slots <- nil
	}
	return p
}

// ready makes c, taken from slots (nil: room for a new connection), ready
// for a snapshot: a fresh idle connection is returned as it is, a stale
// one closed and, like room, replaced by a new connection. On error the
// slot is given back.
func (p *snapshotConns) ready(ctx context.Context, c *snapshotConn) (*snapshotConn, error) {
	now := time.Now()
	if c != nil && (now.Sub(c.used) > snapshotConnMaxIdle || p.maxAge > 0 && now.Sub(c.born) > p.maxAge) {
		c.discard()
		c = nil
	}
	if c != nil {
		c.reused = true
		return c, nil
	}
	conn, err := p.db.Conn(ctx)
	if err != nil {
		p.slots <- nil
		return nil, fmt.Errorf("connect: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ"); err != nil {
		(&snapshotConn{conn: conn}).discard()
		p.slots <- nil
		return nil, fmt.Errorf("set isolation level: %w", err)
	}
	return &snapshotConn{conn: conn, stmts: make(map[string]*sql.Stmt), born: now}, nil
}

// put gives c back; a broken c (an error left its session in doubt) is
// closed and its slot freed.
func (p *snapshotConns) put(c *snapshotConn, broken bool) {
	if broken {
		c.discard()
		p.slots <- nil
		return
	}
	if !p.keep {
		c.closeStmts()
		c.conn.Close()
		p.slots <- nil
		return
	}
	c.used = time.Now()
	p.slots <- c
}

// close waits for the connections in use and closes them all; later
// calls do nothing.
func (p *snapshotConns) close() {
	p.once.Do(func() {
		for range cap(p.slots) {
			if c := <-p.slots; c != nil {
				c.discard()
			}
		}
	})
}

// stmt returns query prepared on c.
func (c *snapshotConn) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	if s := c.stmts[query]; s != nil {
		return s, nil
	}
	if len(c.stmts) >= snapshotConnMaxStmts {
		c.closeStmts()
	}
	s, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	c.stmts[query] = s
	return s, nil
}

func (c *snapshotConn) closeStmts() {
	for q, s := range c.stmts {
		s.Close()
		delete(c.stmts, q)
	}
}

// discard closes c's statements and its connection, which does not go
// back to the pool: its session has this package's isolation level, or
// may hold a transaction.
func (c *snapshotConn) discard() {
	c.closeStmts()
	c.conn.Raw(func(any) error { return driver.ErrBadConn })
	c.conn.Close()
}

// diedIdle reports whether err is a connection found broken on a
// connection that served earlier recounts: it may have been closed by the
// server or a proxy while idle, and the recount (read only) can be tried
// again on another one.
func (c *snapshotConn) diedIdle(err error) bool {
	var killed *mysql.MySQLError
	return c.reused && (errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.As(err, &killed) && killed.Number == mysqlConnectionKilled)
}

// mysqlConnectionKilled is ER_CONNECTION_KILLED, what a server answers on
// a connection it killed.
const mysqlConnectionKilled = 1927

// maxSnapshotAsks is the most recounts one snapshot answers.
const maxSnapshotAsks = 256

// snapshotAsk is one recount waiting for a snapshot.
type snapshotAsk struct {
	query string
	args  []any
	gtid  bool // the snapshot's GTID position is wanted too
	done  chan snapshotAnswer
}

type snapshotAnswer struct {
	sc  SnapshotCount
	err error
}

func (a *snapshotAsk) answer(sc SnapshotCount, err error) { a.done <- snapshotAnswer{sc, err} }

// snapshotAsks queues the recounts waiting for a snapshot. Whoever gets a
// connection takes every recount waiting (up to maxSnapshotAsks) and
// counts them all in one snapshot: the snapshot starts after each of them
// was asked, so each count is as exact as in a snapshot of its own, and
// the snapshot's position fences them all. Its methods are safe for
// concurrent use.
type snapshotAsks struct {
	mu      sync.Mutex
	pending []*snapshotAsk
}

func (q *snapshotAsks) push(a *snapshotAsk) {
	q.mu.Lock()
	q.pending = append(q.pending, a)
	q.mu.Unlock()
}

// pushAll queues the asks of asks that are not nil, together.
func (q *snapshotAsks) pushAll(asks []*snapshotAsk) {
	q.mu.Lock()
	for _, a := range asks {
		if a != nil {
			q.pending = append(q.pending, a)
		}
	}
	q.mu.Unlock()
}

// take removes and returns the oldest waiting asks.
func (q *snapshotAsks) take() []*snapshotAsk {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := min(len(q.pending), maxSnapshotAsks)
	if n == 0 {
		return nil
	}
	asks := make([]*snapshotAsk, n)
	copy(asks, q.pending)
	q.pending = append(q.pending[:0], q.pending[n:]...)
	return asks
}

// remove takes a out of the queue and reports whether it was waiting
// there (false: a snapshot has it and will answer it).
func (q *snapshotAsks) remove(a *snapshotAsk) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, p := range q.pending {
		if p == a {
			q.pending = append(q.pending[:i], q.pending[i+1:]...)
			return true
		}
	}
	return false
}

// getOr returns a connection, opening one when no idle one is fresh, or
// the answer that arrives on done first; it waits while every connection
// is in use. Give a connection back with put.
func (p *snapshotConns) getOr(ctx context.Context, done <-chan snapshotAnswer) (*snapshotConn, *snapshotAnswer, error) {
	select {
	case a := <-done: // first: a free slot must not win over an answer
		return nil, &a, nil
	default:
	}
	select {
	case a := <-done:
		return nil, &a, nil
	case c := <-p.slots:
		c, err := p.ready(ctx, c)
		return c, nil, err
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// connLost reports whether err means the connection cannot be used any
// more (as opposed to an error of the query alone).
func connLost(err error) bool {
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}
