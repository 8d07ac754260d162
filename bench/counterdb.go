package bench

import (
	"context"
	"database/sql"
	"fmt"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// counterRowsPerStatement is how many rows one INSERT of the counter
// database's seed carries.
const counterRowsPerStatement = 1000

// CounterDB is the database of the counter workload: a database of the
// harness's own on the MySQL/MariaDB server of the DSN, holding the
// comments table that the comment counter's recount query counts.
type CounterDB struct {
	// DSN is the data source name the daemon connects with (mysql.dsn).
	DSN string
	// Name is the database the harness created (dropped by Close).
	Name string
	// Source is the server's binary log as the counter workload's events
	// name it: the server's @@server_id and a file of the same base name
	// after the server's current one, so that every event comes after
	// every recount's snapshot (fences cost their reads and writes, and
	// skip no delta).
	Source BinlogSource
	// Version is the server's version string.
	Version string
	db      *sql.DB
}

// SetupCounterDB creates a database named name on the server of dsn, with
// a comments table holding one approved comment per post 1..keys, and
// reads the server's identity. The server must have its binary log on
// (fenced recounts need it).
func SetupCounterDB(ctx context.Context, dsn, name string, keys int) (*CounterDB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("bench: mysql dsn: %w", err)
	}
	cfg.DBName = ""
	cfg.MultiStatements = false
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return nil, fmt.Errorf("bench: mysql: %w", err)
	}
	c := &CounterDB{DSN: dsn, Name: name, db: db}
	var logBin int
	if err := db.QueryRowContext(ctx, "SELECT @@server_id, @@log_bin, @@version").Scan(&c.Source.ServerID, &logBin, &c.Version); err != nil {
		db.Close()
		return nil, fmt.Errorf("bench: mysql %s: %w", cfg.Addr, err)
	}
	if logBin != 1 {
		db.Close()
		return nil, fmt.Errorf("bench: mysql %s: the binary log is off (log_bin): recounts cannot be fenced", cfg.Addr)
	}
	file, err := currentBinlogFile(ctx, db)
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("bench: mysql %s: %w", cfg.Addr, err)
	}
	base, _, ok := strings.Cut(file, ".")
	if !ok {
		db.Close()
		return nil, fmt.Errorf("bench: mysql %s: unexpected binary log file name %q", cfg.Addr, file)
	}
	c.Source.File, c.Source.Pos = base+".999999", 4
	for _, stmt := range []string{
		"CREATE DATABASE `" + name + "`",
		"CREATE TABLE `" + name + "`.comments (id BIGINT PRIMARY KEY, post_id BIGINT NOT NULL, approved TINYINT NOT NULL, KEY post_approved (post_id, approved))",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: mysql: %s: %w", stmt, err)
		}
	}
	var b strings.Builder
	args := make([]any, 0, 2*counterRowsPerStatement)
	for lo := 1; lo <= keys; lo += counterRowsPerStatement {
		b.Reset()
		args = args[:0]
		b.WriteString("INSERT INTO `" + name + "`.comments (id, post_id, approved) VALUES ")
		for id := lo; id < lo+counterRowsPerStatement && id <= keys; id++ {
			if id > lo {
				b.WriteByte(',')
			}
			b.WriteString("(?, ?, 1)")
			args = append(args, id, id)
		}
		if _, err := db.ExecContext(ctx, b.String(), args...); err != nil {
			c.Close()
			return nil, fmt.Errorf("bench: mysql: seed %s.comments: %w", name, err)
		}
	}
	return c, nil
}

// currentBinlogFile returns the server's current binary log file: the first
// column of SHOW MASTER STATUS (SHOW BINARY LOG STATUS from MySQL 8.4).
func currentBinlogFile(ctx context.Context, db *sql.DB) (string, error) {
	var lastErr error
	for _, stmt := range []string{"SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"} {
		rows, err := db.QueryContext(ctx, stmt)
		if err != nil {
			lastErr = fmt.Errorf("%s: %w", stmt, err)
			continue
		}
		defer rows.Close()
		cols, err := rows.Columns()
		if err != nil {
			return "", fmt.Errorf("%s: %w", stmt, err)
		}
		if !rows.Next() {
			return "", fmt.Errorf("%s: no row (is the binary log on?): %v", stmt, rows.Err())
		}
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return "", fmt.Errorf("%s: %w", stmt, err)
		}
		return string(vals[0]), nil
	}
	return "", lastErr
}

// RecountQuery is the comment counter's recount query.
func (c *CounterDB) RecountQuery() string {
	return "SELECT COUNT(*) FROM `" + c.Name + "`.comments WHERE post_id = ? AND approved = 1"
}

// Close drops the database and closes the connection.
func (c *CounterDB) Close() error {
	_, err := c.db.Exec("DROP DATABASE IF EXISTS `" + c.Name + "`")
	if cerr := c.db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("bench: mysql: drop %s: %w", c.Name, err)
	}
	return nil
}

// CounterRulesYAML is the benchmark's rule file with a recount query on
// the comment counter (the counter workload's rules).
func CounterRulesYAML(query string) ([]byte, error) {
	const anchor = "      key: \"comments:{post_id}\"\n"
	s := string(RulesYAML)
	if !strings.Contains(s, anchor) {
		return nil, fmt.Errorf("bench: rules.yaml has no comment counter key line %q", strings.TrimSpace(anchor))
	}
	quoted := strings.ReplaceAll(query, `"`, `\"`)
	return []byte(strings.Replace(s, anchor, anchor+"      recount: \""+quoted+"\"\n", 1)), nil
}
