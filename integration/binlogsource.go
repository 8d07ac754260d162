package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	gomysql "github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/source/binlog"
)

// BinlogSource is where a scenario's daemons read with `source: binlog`
// (ScenarioOptions.Source): the scenario's own server and database, whose
// binary log carries the workload's transactions; nothing is published.
type BinlogSource struct {
	// DSN is binlog.dsn: the scenario's DSN.
	DSN string
	// ServerID is the first replica server id the daemons read as
	// (binlog.server_id); a test running several daemons gives each its
	// own from here on.
	ServerID uint32
	// Name is binlog.name: the lease lock and the checkpoint row.
	Name string
	// CheckpointDatabase is the scenario's database; the checkpoint table
	// is binlog.DefaultCheckpointTable there.
	CheckpointDatabase string
	// Start is binlog.start: the server's GTID position after the initial
	// rows, before the workload's first change.
	Start string
	// Lease is binlog.lease; zero leaves the default.
	Lease time.Duration
}

// Checkpoint is a binary log checkpoint row as the daemons saved it.
type Checkpoint struct {
	Position string
	Epoch    int64
}

// newBinlogSource prepares a binary log source on the scenario's database:
// the daemons start reading at the server's present GTID position.
func newBinlogSource(ctx context.Context, db *sql.DB, dsn string, lease time.Duration) (*BinlogSource, error) {
	mcfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("integration: binlog source DSN: %w", err)
	}
	var pos string
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.gtid_binlog_pos").Scan(&pos); err != nil {
		return nil, fmt.Errorf("integration: binlog source: read gtid_binlog_pos (MariaDB with GTIDs is needed): %w", err)
	}
	if pos == "" {
		return nil, fmt.Errorf("integration: binlog source: the server at %s has logged no GTID yet", mcfg.Addr)
	}
	return &BinlogSource{
		DSN:                dsn,
		ServerID:           uint32(100_000 + rand.IntN(1_000_000)),
		Name:               "cw_" + mcfg.DBName,
		CheckpointDatabase: mcfg.DBName,
		Start:              "gtid:" + pos,
		Lease:              lease,
	}, nil
}

// ReadCheckpoint returns the source's checkpoint row, and false when no
// daemon has saved one yet.
func (s *Scenario) ReadCheckpoint(ctx context.Context) (Checkpoint, bool, error) {
	if s.Binlog == nil {
		return Checkpoint{}, false, errors.New("integration: the scenario's source is not the binary log")
	}
	var c Checkpoint
	err := s.MySQL.DB().QueryRowContext(ctx, "SELECT position, epoch FROM `"+binlog.DefaultCheckpointTable+"` WHERE name = ?",
		s.Binlog.Name).Scan(&c.Position, &c.Epoch)
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, sql.ErrNoRows), errors.As(err, &me) && me.Number == 1146: // no row, no table yet
		return Checkpoint{}, false, nil
	case err != nil:
		return Checkpoint{}, false, fmt.Errorf("integration: read checkpoint %s: %w", s.Binlog.Name, err)
	}
	return c, true, nil
}

// waitBinlogCaughtUp waits until the daemons' checkpoint covers the GTID
// of the last transaction made: a checkpoint is saved after its batch was
// applied, and transactions are applied in commit order.
func (s *Scenario) waitBinlogCaughtUp(ctx context.Context) error {
	var last string
	for i := len(s.Txs) - 1; i >= 0 && last == ""; i-- {
		last = s.Txs[i].GTID
	}
	if last == "" {
		return nil
	}
	want, err := gomysql.ParseMariadbGTIDSet(last)
	if err != nil {
		return fmt.Errorf("integration: transaction GTID %q: %w", last, err)
	}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	seen := "none"
	for {
		c, ok, err := s.ReadCheckpoint(ctx)
		if err != nil && ctx.Err() == nil {
			return err
		}
		if ok {
			seen = c.Position
			if covers(c.Position, want) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("integration: checkpoint %s (at %s) has not reached transaction %s: %w", s.Binlog.Name, seen, last, ctx.Err())
		case <-tick.C:
		}
	}
}

// covers reports whether a saved position's GTID set holds want.
func covers(position string, want gomysql.GTIDSet) bool {
	start, err := binlog.ParsePosition(position)
	if err != nil || start.GTIDSet == "" {
		return false
	}
	have, err := gomysql.ParseMariadbGTIDSet(start.GTIDSet)
	return err == nil && have.Contain(want)
}

// ruleTableRE matches a rule file's `table: shop.x` or `table: blog.x`.
var ruleTableRE = regexp.MustCompile(`(?m)^(\s*(?:-\s*)?table:\s*"?)(?:shop|blog)\.`)

// rulesForDatabase copies the rule files of paths (files or directories of
// .yaml files) into dir with the workload's logical databases (shop,
// blog) replaced by database, where the binary log finds the tables, and
// returns the copies' paths.
func rulesForDatabase(paths []string, dir, database string) ([]string, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("integration: rules: %w", err)
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		for _, ext := range []string{"*.yaml", "*.yml"} {
			m, _ := filepath.Glob(filepath.Join(p, ext))
			files = append(files, m...)
		}
	}
	out := make([]string, 0, len(files))
	for i, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("integration: rules: %w", err)
		}
		text := ruleTableRE.ReplaceAllString(string(data), "${1}"+database+".")
		dst := filepath.Join(dir, fmt.Sprintf("%02d-%s", i, filepath.Base(f)))
		if err := os.WriteFile(dst, []byte(text), 0o600); err != nil {
			return nil, fmt.Errorf("integration: rules: %w", err)
		}
		out = append(out, dst)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("integration: rules: no rule file in %s", strings.Join(paths, ", "))
	}
	return out, nil
}

// BinlogConfigFile is a config file's binlog section.
type BinlogConfigFile struct {
	DSN                string `yaml:"dsn"`
	ServerID           uint32 `yaml:"server_id"`
	Name               string `yaml:"name"`
	CheckpointDatabase string `yaml:"checkpoint_database"`
	Start              string `yaml:"start,omitempty"`
	Lease              string `yaml:"lease,omitempty"`
}

// configFile returns the binlog section of the daemons' config.
func (b *BinlogSource) configFile() *BinlogConfigFile {
	c := &BinlogConfigFile{DSN: b.DSN, ServerID: b.ServerID, Name: b.Name, CheckpointDatabase: b.CheckpointDatabase, Start: b.Start}
	if b.Lease > 0 {
		c.Lease = b.Lease.String()
	}
	return c
}
