package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// DefaultCheckpointTable is CheckpointConfig.Table when it is empty.
const DefaultCheckpointTable = "cachewarden_checkpoints"

// DefaultCheckpointTimeout is CheckpointConfig.Timeout when it is zero.
const DefaultCheckpointTimeout = 5 * time.Second

// maxIdentifier is the longest MySQL database or table name, in
// characters; maxCheckpointName that of a checkpoint's name (the primary
// key is VARCHAR(191): 191 four-byte characters fit InnoDB's 767-byte
// index prefix of older row formats).
const (
	maxIdentifier     = 64
	maxCheckpointName = 191
)

// ErrFenced is the error of a Save refused because another instance
// acquired the checkpoint, with a newer epoch, since this one did: this
// instance is no longer the active one and must stop.
var ErrFenced = errors.New("binlog: checkpoint fenced: a newer instance owns it")

// ErrNotAcquired is the error of a Save before Acquire.
var ErrNotAcquired = errors.New("binlog: checkpoint not acquired")

// CheckpointConfig names a checkpoint's row and table.
type CheckpointConfig struct {
	// Database holds the checkpoint table. Required: the operator names
	// it, and the daemon's user needs CREATE (once), SELECT, INSERT and
	// UPDATE on the table.
	Database string
	// Table is the checkpoint table's name. Default
	// DefaultCheckpointTable.
	Table string
	// Name is the checkpoint's row, the primary key: one per stream (at
	// most 191 characters). Required.
	Name string
	// Timeout bounds each query. Default DefaultCheckpointTimeout.
	Timeout time.Duration
}

// Checkpoint is the durable position of one stream: a row of a MySQL
// table, (name, position, epoch, updated_at), created if missing.
//
// The checkpoint lives in a MySQL table, on the server of the Lease (by
// default the source), rather than in memcached or a local file: it
// survives the loss of the daemon's machine, the standby that takes over
// reads the very position the active saved, and it is written on the
// same server as the lease, so one server's availability governs both.
// memcached is volatile and evicts; a local file is lost with the machine
// and invisible to the standby. The cost is write access on that server
// (CREATE once, then INSERT and UPDATE on this one table).
//
// Its writes go to that server's binary log, which the stream reads when
// the server is the source: the stream must skip events of the table
// Table names, or each save would come back as a change to apply.
//
// Acquire, on gaining the lease, raises the row's epoch; Save writes only
// while the epoch is still the one this instance acquired, so the saves
// of an instance that lost the lease (frozen, then resumed) fail with
// ErrFenced. Safe for concurrent use.
type Checkpoint struct {
	db       *sql.DB
	log      *slog.Logger
	database string
	table    string
	name     string
	timeout  time.Duration
	qualTab  string // quoted `database`.`table`

	mu    sync.Mutex
	epoch int64 // 0: not acquired
	// save is Save's statement, prepared at the first Save (closed with
	// the *sql.DB).
	save *sql.Stmt
}

// OpenCheckpoint returns the checkpoint cfg names on db's server, creating
// its table when missing (CREATE TABLE IF NOT EXISTS). A nil log
// discards.
func OpenCheckpoint(ctx context.Context, db *sql.DB, cfg CheckpointConfig, log *slog.Logger) (*Checkpoint, error) {
	if db == nil {
		return nil, errors.New("binlog: checkpoint: no database handle")
	}
	if cfg.Table == "" {
		cfg.Table = DefaultCheckpointTable
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultCheckpointTimeout
	}
	if err := checkIdentifier("database", cfg.Database); err != nil {
		return nil, err
	}
	if err := checkIdentifier("table", cfg.Table); err != nil {
		return nil, err
	}
	if cfg.Name == "" || utf8.RuneCountInString(cfg.Name) > maxCheckpointName || !utf8.ValidString(cfg.Name) {
		return nil, fmt.Errorf("binlog: checkpoint name %q: want 1 to %d characters of valid UTF-8", cfg.Name, maxCheckpointName)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("binlog: checkpoint %q: timeout %v is negative", cfg.Name, cfg.Timeout)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Checkpoint{
		db:       db,
		database: cfg.Database,
		table:    cfg.Table,
		name:     cfg.Name,
		timeout:  cfg.Timeout,
		qualTab:  quoteIdent(cfg.Database) + "." + quoteIdent(cfg.Table),
	}
	c.log = log.With("checkpoint", cfg.Name, "table", c.qualTab)
	qctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err := db.ExecContext(qctx, "CREATE TABLE IF NOT EXISTS "+c.qualTab+` (
  name VARCHAR(191) NOT NULL,
  position MEDIUMTEXT NOT NULL,
  epoch BIGINT NOT NULL,
  updated_at DATETIME(6) NOT NULL,
  PRIMARY KEY (name)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4`)
	if err != nil {
		return nil, fmt.Errorf("binlog: checkpoint: create table %s: %w", c.qualTab, err)
	}
	return c, nil
}

// Table returns the database and table that hold the checkpoint, as the
// binary log names them: the stream skips their events.
func (c *Checkpoint) Table() (database, table string) { return c.database, c.table }

// Epoch returns the epoch the last Acquire obtained (0 before any).
func (c *Checkpoint) Epoch() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.epoch
}

// Acquire takes the checkpoint over, on gaining the lease: it creates the
// row when missing (empty position, epoch 1) or raises its epoch by one,
// in one transaction, and returns the new epoch and the saved position
// ("" when none was saved yet). Saves of any earlier epoch fail with
// ErrFenced from then on.
func (c *Checkpoint) Acquire(ctx context.Context) (epoch int64, position string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	qctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	tx, err := c.db.BeginTx(qctx, nil)
	if err != nil {
		return 0, "", fmt.Errorf("binlog: checkpoint %q: acquire: begin: %w", c.name, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(qctx, "INSERT INTO "+c.qualTab+" (name, position, epoch, updated_at) VALUES (?, '', 1, UTC_TIMESTAMP(6))"+
		" ON DUPLICATE KEY UPDATE epoch = epoch + 1, updated_at = UTC_TIMESTAMP(6)", c.name)
	if err != nil {
		return 0, "", fmt.Errorf("binlog: checkpoint %q: acquire: raise epoch in %s: %w", c.name, c.qualTab, err)
	}
	// The row stays locked by the insert until commit: this reads our epoch.
	err = tx.QueryRowContext(qctx, "SELECT epoch, position FROM "+c.qualTab+" WHERE name = ?", c.name).Scan(&epoch, &position)
	if err != nil {
		return 0, "", fmt.Errorf("binlog: checkpoint %q: acquire: read back from %s: %w", c.name, c.qualTab, err)
	}
	if err := tx.Commit(); err != nil {
		return 0, "", fmt.Errorf("binlog: checkpoint %q: acquire: commit: %w", c.name, err)
	}
	c.epoch = epoch
	c.log.Info("checkpoint acquired", "epoch", epoch, "position", position)
	return epoch, position, nil
}

// Save stores position (the stream's serialized position, opaque here)
// if this instance's epoch is still the row's. It returns an error
// wrapping ErrFenced when a newer Acquire raised the epoch, and one
// wrapping ErrNotAcquired before Acquire.
func (c *Checkpoint) Save(ctx context.Context, position string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch == 0 {
		return fmt.Errorf("%w: checkpoint %q: call Acquire, on gaining the lease, before Save", ErrNotAcquired, c.name)
	}
	qctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var err error
	if c.save == nil {
		// Prepared once: a save is then one round trip, not three
		// (prepare, execute, close), after every applied batch.
		if c.save, err = c.db.PrepareContext(qctx, "UPDATE "+c.qualTab+" SET position = ?, updated_at = UTC_TIMESTAMP(6) WHERE name = ? AND epoch = ?"); err != nil {
			return fmt.Errorf("binlog: checkpoint %q: prepare the save: %w", c.name, err)
		}
	}
	res, err := c.save.ExecContext(qctx, position, c.name, c.epoch)
	if err != nil {
		return fmt.Errorf("binlog: checkpoint %q: save at epoch %d: %w", c.name, c.epoch, err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("binlog: checkpoint %q: save at epoch %d: rows affected: %w", c.name, c.epoch, err)
	}
	if n > 0 {
		return nil
	}
	return c.checkEpoch(qctx)
}

// checkEpoch tells a Save that changed no row whether it was fenced.
// MySQL counts changed rows, not matched ones: a row left as it was (the
// same position within the same microsecond) also gives 0. The epoch only
// grows, so finding ours now means the UPDATE matched. Called with mu
// held.
func (c *Checkpoint) checkEpoch(ctx context.Context) error {
	var now int64
	err := c.db.QueryRowContext(ctx, "SELECT epoch FROM "+c.qualTab+" WHERE name = ?", c.name).Scan(&now)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("%w: checkpoint %q: save at epoch %d: the row is gone from %s", ErrFenced, c.name, c.epoch, c.qualTab)
	case err != nil:
		return fmt.Errorf("binlog: checkpoint %q: save at epoch %d: read epoch: %w", c.name, c.epoch, err)
	case now != c.epoch:
		return fmt.Errorf("%w: checkpoint %q: save at epoch %d refused, the row's epoch is now %d", ErrFenced, c.name, c.epoch, now)
	}
	return nil
}

// checkIdentifier says why name is no MySQL database or table name.
func checkIdentifier(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("binlog: checkpoint %s name is empty", what)
	case !utf8.ValidString(name):
		return fmt.Errorf("binlog: checkpoint %s name %q is not valid UTF-8", what, name)
	case utf8.RuneCountInString(name) > maxIdentifier:
		return fmt.Errorf("binlog: checkpoint %s name %q: %d characters, MySQL allows at most %d", what, name, utf8.RuneCountInString(name), maxIdentifier)
	case strings.ContainsRune(name, 0):
		return fmt.Errorf("binlog: checkpoint %s name %q contains a NUL byte, which MySQL refuses", what, name)
	case strings.HasSuffix(name, " "):
		return fmt.Errorf("binlog: checkpoint %s name %q ends with a space, which MySQL refuses", what, name)
	}
	return nil
}
