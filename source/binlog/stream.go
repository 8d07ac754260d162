package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
	gosql "github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/rules"
)

// DefaultMaxEvents bounds the row changes one Txn holds when
// Config.MaxEvents is 0: a larger transaction comes in several Txns.
const DefaultMaxEvents = 10000

// Defaults of Config's durations.
const (
	DefaultConnectTimeout = 10 * time.Second
	DefaultHeartbeat      = 10 * time.Second
	DefaultQueryTimeout   = 10 * time.Second
)

// Config says which server a Stream reads, as which replica, and from
// where.
type Config struct {
	// DSN is a go-sql-driver/mysql DSN ("user:pass@tcp(host:3306)/"): its
	// address, user, password and TLS settings are used; its database is
	// not.
	DSN string
	// ServerID is the replica's server id: not 0, and unlike the
	// server's and its other replicas' (CheckServer checks).
	ServerID uint32
	// Flavor is mysql.MySQLFlavor ("mysql") or mysql.MariaDBFlavor
	// ("mariadb"); ServerReport.Flavor tells which.
	Flavor string
	// Start is where reading starts; the zero Start is the server's
	// current position.
	Start Start
	// ConnectTimeout bounds connecting (default DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// Heartbeat is how often the server sends a heartbeat when it has
	// no event (default DefaultHeartbeat); ReadTimeout bounds the wait
	// for any packet (default three heartbeats), after which Next fails.
	Heartbeat, ReadTimeout time.Duration
	// QueryTimeout bounds each information_schema query (default
	// DefaultQueryTimeout).
	QueryTimeout time.Duration
	// MaxEvents bounds the row changes of one Txn (default
	// DefaultMaxEvents).
	MaxEvents int
	// Skip, when set, is asked for every table a row change or TRUNCATE
	// names; true drops the change (the daemon's own checkpoint table).
	Skip func(database, table string) bool
}

// Start is a position in a server's binary log: a GTID set (MySQL
// "uuid:1-42", MariaDB "0-1-42"), else a file and position.
type Start struct {
	GTIDSet string
	File    string
	Pos     uint32
}

// IsZero reports whether s names no position.
func (s Start) IsZero() bool { return s.GTIDSet == "" && s.File == "" }

// Stream reads committed transactions from a server's binary log as a
// replica. It is not safe for concurrent use; Close may be called from
// another goroutine to end a waiting Next.
type Stream struct {
	cfg      Config
	log      *slog.Logger
	syncer   *replication.BinlogSyncer
	streamer *replication.BinlogStreamer
	columns  *columnCache
	maps     map[uint64]mappedTable

	// file and pos are where the next event starts; cur the transaction
	// being read; done the position after the last complete one; queue
	// the events of a compressed transaction payload still to handle.
	file  string
	pos   uint32
	cur   txnState
	done  Start
	queue []queuedEvent

	// keepEmpty makes Next return transactions without row changes too
	// (a RangeStream sees every boundary); atEnd, when set, is asked
	// between transactions whether reading is over: Next then fails
	// with errRangeEnd.
	keepEmpty bool
	atEnd     func() bool
}

// mappedTable caches the columns of the last table map of a table id.
type mappedTable struct {
	tm   *replication.TableMapEvent
	cols []column
	err  error
}

// Open connects to the server cfg.DSN names and starts reading its binary
// log from cfg.Start. db, a handle on the same server, reads the current
// position (for a zero Start) and information_schema (when the log has no
// column names). The connection is made within ConnectTimeout, the
// position read within QueryTimeout; logger (nil: none) gets go-mysql's
// and the stream's messages.
func Open(ctx context.Context, cfg Config, db *sql.DB, logger *slog.Logger) (*Stream, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	cfg, sc, err := syncerConfig(cfg, logger)
	if err != nil {
		return nil, err
	}
	start := cfg.Start
	if start.IsZero() {
		if db == nil {
			return nil, errors.New("binlog: no start position and no database handle to read the server's current one")
		}
		qctx, cancel := context.WithTimeout(ctx, cfg.QueryTimeout)
		start, err = currentPosition(qctx, db)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	s := &Stream{cfg: cfg, log: logger, columns: newColumnCache(db, cfg.QueryTimeout),
		maps: make(map[uint64]mappedTable), file: start.File, pos: start.Pos, done: start}
	s.syncer = replication.NewBinlogSyncer(sc)
	if start.GTIDSet != "" {
		set, err := mysql.ParseGTIDSet(cfg.Flavor, start.GTIDSet)
		if err != nil {
			s.syncer.Close()
			return nil, fmt.Errorf("binlog: start GTID set %q is not a %s GTID set: %w", start.GTIDSet, cfg.Flavor, err)
		}
		s.streamer, err = s.syncer.StartSyncGTID(set)
		if err != nil {
			s.syncer.Close()
			return nil, fmt.Errorf("binlog: start reading %s after GTID set %s: %w", sc.Host, start.GTIDSet, err)
		}
		return s, nil
	}
	s.streamer, err = s.syncer.StartSync(mysql.Position{Name: start.File, Pos: start.Pos})
	if err != nil {
		s.syncer.Close()
		return nil, fmt.Errorf("binlog: start reading %s at %s:%d: %w", sc.Host, start.File, start.Pos, err)
	}
	return s, nil
}

// syncerConfig checks cfg, fills its defaults and derives go-mysql's
// configuration.
func syncerConfig(cfg Config, logger *slog.Logger) (Config, replication.BinlogSyncerConfig, error) {
	var sc replication.BinlogSyncerConfig
	if cfg.ServerID == 0 {
		return cfg, sc, errors.New("binlog: server id 0 is not allowed for a replica; configure one between 1 and 4294967295")
	}
	if cfg.Flavor != mysql.MySQLFlavor && cfg.Flavor != mysql.MariaDBFlavor {
		return cfg, sc, fmt.Errorf("binlog: flavor %q is neither %q nor %q", cfg.Flavor, mysql.MySQLFlavor, mysql.MariaDBFlavor)
	}
	if cfg.Start.GTIDSet == "" && cfg.Start.File == "" && cfg.Start.Pos != 0 {
		return cfg, sc, fmt.Errorf("binlog: start position %d has no file name", cfg.Start.Pos)
	}
	dsn, err := gosql.ParseDSN(cfg.DSN)
	if err != nil {
		return cfg, sc, fmt.Errorf("binlog: DSN: %w", err)
	}
	host, portText, err := net.SplitHostPort(dsn.Addr)
	if err != nil || dsn.Net != "tcp" {
		return cfg, sc, fmt.Errorf("binlog: DSN address %s(%s): want tcp(host:port)", dsn.Net, dsn.Addr)
	}
	port, err := strconv.ParseUint(portText, 10, 16)
	if err != nil {
		return cfg, sc, fmt.Errorf("binlog: DSN port %q: %w", portText, err)
	}
	cfg.ConnectTimeout = orDefault(cfg.ConnectTimeout, DefaultConnectTimeout)
	cfg.Heartbeat = orDefault(cfg.Heartbeat, DefaultHeartbeat)
	cfg.ReadTimeout = orDefault(cfg.ReadTimeout, 3*cfg.Heartbeat)
	cfg.QueryTimeout = orDefault(cfg.QueryTimeout, DefaultQueryTimeout)
	if cfg.ReadTimeout <= cfg.Heartbeat {
		return cfg, sc, fmt.Errorf("binlog: read timeout %s must exceed the heartbeat period %s, or an idle server looks dead", cfg.ReadTimeout, cfg.Heartbeat)
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout}
	sc = replication.BinlogSyncerConfig{
		ServerID: cfg.ServerID, Flavor: cfg.Flavor,
		Host: host, Port: uint16(port), User: dsn.User, Password: dsn.Passwd,
		TLSConfig: dsn.TLS, Charset: "utf8mb4",
		TimestampStringLocation: time.UTC,
		HeartbeatPeriod:         cfg.Heartbeat, ReadTimeout: cfg.ReadTimeout,
		// A broken connection ends the stream: the caller reopens it from
		// its checkpoint, which is a transaction boundary.
		DisableRetrySync: true,
		FillZeroLogPos:   cfg.Flavor == mysql.MariaDBFlavor,
		Logger:           logger,
		Dialer:           dialer.DialContext,
		EventCacheCount:  1024,
	}
	return cfg, sc, nil
}

func orDefault(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// currentPosition reads the server's binary log file and position: SHOW
// MASTER STATUS, or SHOW BINARY LOG STATUS (MySQL 8.4).
func currentPosition(ctx context.Context, db *sql.DB) (Start, error) {
	var start Start
	for _, q := range []string{"SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"} {
		rows, err := db.QueryContext(ctx, q)
		if err != nil {
			continue
		}
		cols, err := rows.Columns()
		if err != nil || !rows.Next() {
			rows.Close()
			return start, fmt.Errorf("binlog: %s returned no position: is the binary log on (log_bin)? %v", q, err)
		}
		vals := make([]any, len(cols))
		vals[0], vals[1] = &start.File, &start.Pos
		for i := 2; i < len(vals); i++ {
			vals[i] = new(sql.RawBytes)
		}
		err = rows.Scan(vals...)
		rows.Close()
		if err != nil {
			return start, fmt.Errorf("binlog: read %s: %w", q, err)
		}
		return start, nil
	}
	return start, errors.New("binlog: neither SHOW MASTER STATUS nor SHOW BINARY LOG STATUS answered: grant REPLICATION CLIENT (MariaDB: BINLOG MONITOR)")
}

// Close ends the replication connection. Next then fails.
func (s *Stream) Close() { s.syncer.Close() }

// Position is where a stream opened anew would resume after the last
// complete transaction Next returned or passed over (one with no row
// change it returns, as when only skipped tables changed): its file and
// position, and its GTID set when reading started from one.
func (s *Stream) Position() Start { return s.done }

// Txn is a committed transaction's row changes, in the order of the log,
// or a part of them when the transaction has more than Config.MaxEvents.
type Txn struct {
	// Events are the row changes. Their Source names the binlog file,
	// the transaction's GTID, and the time and server id of their event;
	// BinlogPos is the position after the commit when Complete, else the
	// position after the change's row event.
	Events []rules.Event
	// Unmapped are row changes that could not be read, one per row
	// event or row, with the reason.
	Unmapped []Unmapped
	// Complete is true on the part that ends the transaction: only its
	// position (End) may be checkpointed.
	Complete bool
	// GTID is the transaction's GTID, "" when the server logs none.
	GTID string
	// End is the position after the transaction's commit when Complete.
	End Start
	// TsMs is the time of the transaction's first event (its start on
	// the source), in milliseconds since the Unix epoch; 0 when unknown.
	TsMs int64
}

// Unmapped is a row change of a table that could not be mapped to a
// rules.Event: the table's cached entries must be dropped upstream. Table
// is "" for a TRUNCATE whose table could not be read: any table of
// Database may have been emptied.
type Unmapped struct {
	Database, Table string
	Err             error
}
