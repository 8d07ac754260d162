package check

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultConnectTimeout bounds the TCP connect to the server and each
// read from it (its handshake first) when the DSN sets no timeout or
// readTimeout of its own: an address that is not a MySQL server (memcached
// waits for the client to speak) or that never answers is reported then.
const DefaultConnectTimeout = 5 * time.Second

// server is a pool of at most two connections to the server a DSN names.
type server struct {
	db *sql.DB
	// where names the server and user for messages (never the password).
	where string
	addr  string
	// dialTimeout and readTimeout are the driver's bounds in effect.
	dialTimeout, readTimeout time.Duration
	// last is the latest TCP connection dialed; nil before the first or
	// after a dial that failed.
	last atomic.Pointer[countingConn]
}

// openServer opens a pool for dsn, bounding the connect and every read by
// DefaultConnectTimeout where the DSN sets no bound. Nothing is dialed
// yet. log receives the driver's notes at debug level; nil discards.
func openServer(dsn string, log *slog.Logger) (*server, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("--dsn: %v", err) // names the malformed part, not the password
	}
	s := &server{where: fmt.Sprintf("%s@%s/%s", mcfg.User, mcfg.Addr, mcfg.DBName), addr: mcfg.Addr}
	// One statement at a time, and placeholders bound by the server.
	mcfg.MultiStatements = false
	mcfg.InterpolateParams = false
	if mcfg.Timeout <= 0 {
		mcfg.Timeout = DefaultConnectTimeout
	}
	if mcfg.ReadTimeout <= 0 {
		mcfg.ReadTimeout = DefaultConnectTimeout
	}
	s.dialTimeout, s.readTimeout = mcfg.Timeout, mcfg.ReadTimeout
	mcfg.DialFunc = s.dial
	mcfg.Logger = driverLog{log}
	conn, err := mysql.NewConnector(mcfg)
	if err != nil {
		return nil, fmt.Errorf("--dsn: MySQL %s: %v", s.where, err)
	}
	s.db = sql.OpenDB(conn)
	s.db.SetMaxOpenConns(2)
	return s, nil
}

// dial connects as the driver would and remembers the connection, so that
// a connect that fails can tell a server that sent nothing from one that
// could not be reached.
func (s *server) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		s.last.Store(nil)
		return nil, err
	}
	cc := &countingConn{Conn: c}
	s.last.Store(cc)
	return cc, nil
}

// connect takes a connection (left in the pool for the check) and says
// plainly why none could be had.
func (s *server) connect(ctx context.Context) error {
	err := s.db.PingContext(ctx)
	if err == nil || ctx.Err() != nil {
		return err
	}
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return fmt.Errorf("MySQL %s refuses the connection: %s (MySQL error %d)", s.where, me.Message, me.Number)
	}
	var ne net.Error
	last := s.last.Load()
	switch {
	case last == nil && errors.As(err, &ne) && ne.Timeout():
		return fmt.Errorf("MySQL %s: no answer from %s within %v (the TCP connect; the DSN's timeout= sets this bound): a wrong host, or a firewall dropping packets",
			s.where, s.addr, s.dialTimeout)
	case last == nil:
		return fmt.Errorf("MySQL %s: cannot connect to %s: %w", s.where, s.addr, err)
	case last.read.Load() == 0:
		return fmt.Errorf("MySQL %s: is this a MySQL server? got no MySQL handshake from %s within %v of connecting (the DSN's readTimeout= sets this bound; memcached, for one, waits for the client to speak first)",
			s.where, s.addr, s.readTimeout)
	}
	return fmt.Errorf("MySQL %s: is this a MySQL server? the handshake with %s failed after %d bytes from it: %v",
		s.where, s.addr, last.read.Load(), err)
}

func (s *server) close() error { return s.db.Close() }

// countingConn counts the bytes read from a connection.
type countingConn struct {
	net.Conn
	read atomic.Int64
}

func (c *countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// driverLog receives what go-sql-driver/mysql would print about a broken
// connection on standard error; the check reports the failure itself, so
// these notes go to the log at debug level.
type driverLog struct{ log *slog.Logger }

func (l driverLog) Print(v ...any) { l.log.Debug(fmt.Sprint(v...), "component", "mysql-driver") }
