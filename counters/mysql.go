package counters

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/rules"
)

// Defaults for DBConfig fields left at zero.
const (
	DefaultMaxOpenConns    = 8
	DefaultConnMaxLifetime = 3 * time.Minute
	DefaultQueryTimeout    = 5 * time.Second
)

// DBConfig bounds the MySQL connection pool and each query.
type DBConfig struct {
	// MaxOpenConns caps open connections; 0 means DefaultMaxOpenConns (8).
	// Half of them (at least one) are kept for recounts in consistent
	// snapshots (MySQL.CountInSnapshot).
	MaxOpenConns int
	// MaxIdleConns caps idle connections kept for reuse; 0 means
	// MaxOpenConns, negative means none are kept.
	MaxIdleConns int
	// ConnMaxLifetime closes connections older than this; 0 means
	// DefaultConnMaxLifetime (3m, below common server and proxy idle
	// timeouts), negative means no limit.
	ConnMaxLifetime time.Duration
	// QueryTimeout bounds one query, connecting included; 0 means
	// DefaultQueryTimeout (5s), negative means only the caller's context
	// applies.
	QueryTimeout time.Duration
}

func (c DBConfig) withDefaults() DBConfig {
	if c.MaxOpenConns <= 0 {
		c.MaxOpenConns = DefaultMaxOpenConns
	}
	if c.MaxIdleConns == 0 {
		c.MaxIdleConns = c.MaxOpenConns
	}
	if c.ConnMaxLifetime == 0 {
		c.ConnMaxLifetime = DefaultConnMaxLifetime
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = DefaultQueryTimeout
	}
	return c
}

// MySQL runs recount and set-load queries. Every value from an event is
// bound to a '?' placeholder (see bindArgs), never written into SQL text.
//
// A MySQL is safe for concurrent use.
type MySQL struct {
	db      *sql.DB
	timeout time.Duration
	log     *slog.Logger
	// snapshots remembers that the server cannot name a snapshot's
	// binary log position (CountInSnapshot).
	snapshots snapshotSupport
	// snapConns are the connections CountInSnapshot counts on, snapAsks
	// the recounts waiting for one, snapshotsTaken how many snapshots
	// they took.
	snapConns      *snapshotConns
	snapAsks       snapshotAsks
	snapshotsTaken atomic.Int64
	// stmts are the queries prepared for Count and LoadMembers.
	stmtsMu sync.Mutex
	stmts   map[string]*sql.Stmt
	// noStatusTable: the server has no information_schema.SESSION_STATUS.
	noStatusTable atomic.Bool
	// noCombine holds the recount queries the server refused to run
	// several at once in one statement (countAsks).
	noCombine sync.Map
}

// OpenMySQL opens a pool for a go-sql-driver DSN. It does not connect: a
// database that is down at start-up only makes queries fail (and counters
// that need it are deleted) until it is back. The DSN's password is never
// logged nor put into an error.
func OpenMySQL(dsn string, cfg DBConfig, logger *slog.Logger) (*MySQL, error) {
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		// ParseDSN's errors name the malformed part, never the password.
		return nil, fmt.Errorf("counters: parse MySQL DSN: %w", err)
	}
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	mcfg.Logger = DriverLogger(logger)
	connector, err := mysql.NewConnector(mcfg)
	if err != nil {
		return nil, fmt.Errorf("counters: MySQL %s@%s/%s: %w", mcfg.User, mcfg.Addr, mcfg.DBName, err)
	}
	m := NewMySQL(sql.OpenDB(connector), cfg, logger)
	m.log.Info("MySQL pool configured", "addr", mcfg.Addr, "user", mcfg.User, "database", mcfg.DBName,
		"max_open_conns", m.db.Stats().MaxOpenConnections, "query_timeout", m.timeout)
	return m, nil
}

// NewMySQL wraps an open pool and applies cfg's limits to it. A nil logger
// discards.
func NewMySQL(db *sql.DB, cfg DBConfig, logger *slog.Logger) *MySQL {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg = cfg.withDefaults()
	db.SetMaxOpenConns(cfg.MaxOpenConns)
	db.SetMaxIdleConns(cfg.MaxIdleConns)
	db.SetConnMaxLifetime(max(cfg.ConnMaxLifetime, 0))
	return &MySQL{db: db, timeout: cfg.QueryTimeout, log: logger,
		snapConns: newSnapshotConns(db, cfg.MaxOpenConns, max(cfg.ConnMaxLifetime, 0)),
		stmts:     make(map[string]*sql.Stmt)}
}

// SnapshotsTaken returns how many consistent snapshots CountInSnapshot
// has counted in (several recounts may share one).
func (m *MySQL) SnapshotsTaken() int64 { return m.snapshotsTaken.Load() }

// DB returns the underlying pool.
func (m *MySQL) DB() *sql.DB { return m.db }

func (m *MySQL) queryContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if m.timeout > 0 {
		return context.WithTimeout(ctx, m.timeout)
	}
	return ctx, func() {}
}

// Count runs a count rule's recount query with its '?' placeholders bound
// to args. The query must return exactly one row with one column holding
// a non-NULL integer (COUNT(*) does; wrap a SUM in COALESCE).
func (m *MySQL) Count(ctx context.Context, query string, args []rules.Value) (int64, error) {
	bound, err := bindArgs(args)
	if err != nil {
		return 0, fmt.Errorf("counters: recount: %w", err)
	}
	ctx, cancel := m.queryContext(ctx)
	defer cancel()
	return scanCount(m.query(ctx, query, bound))
}

// maxPreparedQueries bounds the queries a MySQL keeps prepared; queries
// past it run as database/sql runs them by itself (prepare, execute,
// close). Recount and load queries come from rule files, so a daemon has
// a few.
const maxPreparedQueries = 64

// query runs query with args as a statement prepared once (database/sql
// prepares it again on each connection it runs on, once): one round trip
// per run instead of three.
func (m *MySQL) query(ctx context.Context, query string, args []any) (*sql.Rows, error) {
	m.stmtsMu.Lock()
	stmt, full := m.stmts[query], len(m.stmts) >= maxPreparedQueries
	m.stmtsMu.Unlock()
	if stmt == nil {
		if full {
			return m.db.QueryContext(ctx, query, args...)
		}
		s, err := m.db.PrepareContext(ctx, query)
		if err != nil {
			return nil, err
		}
		m.stmtsMu.Lock()
		if stmt = m.stmts[query]; stmt != nil {
			s.Close() // prepared meanwhile
		} else {
			m.stmts[query], stmt = s, s
		}
		m.stmtsMu.Unlock()
	}
	return stmt.QueryContext(ctx, args...)
}

// scanCount reads the one integer a recount query must return.
func scanCount(rows *sql.Rows, err error) (int64, error) {
	if err != nil {
		return 0, fmt.Errorf("counters: recount query: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, fmt.Errorf("counters: recount query: %w", err)
	}
	if len(cols) != 1 {
		return 0, fmt.Errorf("counters: recount query returned %d columns, want 1", len(cols))
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, fmt.Errorf("counters: recount query: %w", err)
		}
		return 0, errors.New("counters: recount query returned no row, want 1")
	}
	var raw sql.RawBytes
	if err := rows.Scan(&raw); err != nil {
		return 0, fmt.Errorf("counters: recount query: %w", err)
	}
	n, err := parseCount(raw)
	if err != nil {
		return 0, err
	}
	if rows.Next() {
		return 0, errors.New("counters: recount query returned more than one row, want 1")
	}
	if err := rows.Err(); err != nil {
		return 0, fmt.Errorf("counters: recount query: %w", err)
	}
	return n, nil
}

// LoadMembers runs a set rule's load query with its '?' placeholders bound
// to args and returns the first column of every row as text, in row order.
// Rows whose first column is NULL are skipped (a NULL never makes a
// member). Extra columns are ignored.
func (m *MySQL) LoadMembers(ctx context.Context, query string, args []rules.Value) ([]string, error) {
	bound, err := bindArgs(args)
	if err != nil {
		return nil, fmt.Errorf("counters: load members: %w", err)
	}
	ctx, cancel := m.queryContext(ctx)
	defer cancel()
	rows, err := m.query(ctx, query, bound)
	if err != nil {
		return nil, fmt.Errorf("counters: load members query: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("counters: load members query: %w", err)
	}
	if len(cols) == 0 {
		return nil, errors.New("counters: load members query returned no columns")
	}
	var first sql.RawBytes
	dest := make([]any, len(cols))
	dest[0] = &first
	for i := 1; i < len(dest); i++ {
		dest[i] = new(sql.RawBytes)
	}
	members := []string{}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, fmt.Errorf("counters: load members query: %w", err)
		}
		if first == nil {
			continue
		}
		members = append(members, string(first))
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("counters: load members query: %w", err)
	}
	return members, nil
}

// Ping checks that the database answers within the query timeout.
func (m *MySQL) Ping(ctx context.Context) error {
	ctx, cancel := m.queryContext(ctx)
	defer cancel()
	if err := m.db.PingContext(ctx); err != nil {
		return fmt.Errorf("counters: ping MySQL: %w", err)
	}
	return nil
}

// Close closes the pool, after the recounts under way.
func (m *MySQL) Close() error {
	m.snapConns.close()
	m.stmtsMu.Lock()
	for q, s := range m.stmts {
		s.Close()
		delete(m.stmts, q)
	}
	m.stmtsMu.Unlock()
	return m.db.Close()
}

// bindArgs converts event values to driver arguments for '?'
// placeholders, as rules.Value.SQLArg describes.
func bindArgs(args []rules.Value) ([]any, error) { return rules.SQLArgs(args) }

// parseCount reads one count a recount query returned.
func parseCount(raw sql.RawBytes) (int64, error) {
	if raw == nil {
		return 0, errors.New("counters: recount query returned NULL, want an integer")
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("counters: recount query returned %q, want an integer", raw)
	}
	return n, nil
}

// DriverLogger routes what go-sql-driver/mysql prints about a connection
// (a packet cut short, a connection the server closed) into logger as
// warnings of component "mysql-driver", instead of its own
// "[mysql] ..." lines on standard error, which a JSON log would not parse.
// Safe for concurrent use.
func DriverLogger(logger *slog.Logger) mysql.Logger {
	return driverLogger{logger.With("component", "mysql-driver")}
}

type driverLogger struct{ log *slog.Logger }

func (l driverLogger) Print(v ...any) {
	l.log.Warn(strings.TrimSpace(fmt.Sprint(v...)))
}
