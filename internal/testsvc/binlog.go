package testsvc

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// MySQLBinlogDSN returns a go-sql-driver DSN with no database name for a
// MariaDB/MySQL server meant to have its binary log on, for a user that
// may create databases: CACHEWARDEN_TEST_MYSQL_BINLOG_DSN (scripts/services.sh
// starts a private binlog-enabled MariaDB when the main one has no binary
// log), else whatever MySQLDSN finds (its container runs with --log-bin).
// MySQLBinlog checks that the binary log is really on.
func MySQLBinlogDSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv("CACHEWARDEN_TEST_MYSQL_BINLOG_DSN"); dsn != "" {
		return dsn
	}
	return MySQLDSN(t)
}

// MySQLBinlog creates a fresh database, dropped when the test ends, on the
// server MySQLBinlogDSN names and returns a handle to it and its DSN. It
// checks that the server's binary log is really on; when it is not, the
// test fails under CI=true and is skipped otherwise.
func MySQLBinlog(t testing.TB) (*sql.DB, string) {
	t.Helper()
	db, dsn := freshDatabase(t, MySQLBinlogDSN(t))
	requireBinlog(t, db, "a server with the binary log on (the one at CACHEWARDEN_TEST_MYSQL_BINLOG_DSN has log_bin OFF)")
	return db, dsn
}

// requireBinlog fails the test under CI=true, and skips it otherwise, with
// what as the missing service, when db's server has its binary log off.
func requireBinlog(t testing.TB, db *sql.DB, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var on int
	if err := db.QueryRowContext(ctx, "SELECT @@log_bin").Scan(&on); err != nil {
		t.Fatalf("testsvc: read log_bin: %v", err)
	}
	if on != 1 {
		missing(t, what)
	}
}

// MySQLSecondBinlog creates a database named name (a fresh name when
// empty; the name of a database of another server, to fail over to this
// one under the same DSN), dropped when the test ends, on a second server
// with its binary log on (CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN:
// scripts/services.sh starts a private MariaDB on port 3308, server_id 2,
// binary log base name mysql-bin), and returns a handle to it and its
// DSN: the failover target of tests that move a workload to another
// server whose binary log has the same base name. It fails under CI=true
// and is skipped otherwise when there is none, or when its binary log is
// off.
func MySQLSecondBinlog(t testing.TB, name string) (*sql.DB, string) {
	t.Helper()
	dsn := os.Getenv("CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN")
	if dsn == "" {
		missing(t, "a second MariaDB with the binary log on (CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN)")
	}
	if name == "" {
		name = "cwtest_" + Unique()
	}
	db, dsn := namedDatabase(t, dsn, name)
	requireBinlog(t, db, "a second server with the binary log on (the one at CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN has log_bin OFF)")
	return db, dsn
}

// LoggedTx says where a committed transaction sits in a MariaDB server's
// binary log, as a CDC connector reading that log would report it.
type LoggedTx struct {
	// GTID is the transaction's MariaDB GTID ("0-1-42").
	GTID string
	// File is the binary log file holding the transaction.
	File string
	// RowsPos and RowsEnd are where the transaction's first row event
	// starts (Debezium's source.pos) and ends (Maxwell's position).
	RowsPos, RowsEnd int64
	// CommitEnd is where its commit (Xid) event ends: the position the
	// next transaction starts at.
	CommitEnd int64
}

// ExecLogged runs one autocommitted row-changing statement on conn (a
// MariaDB connection with the binary log on) and finds its transaction in
// the binary log by the GTID @@last_gtid names, so the positions are exact
// even while other clients write to the same server.
func ExecLogged(ctx context.Context, conn *sql.Conn, query string, args ...any) (LoggedTx, error) {
	var file string
	var pos int64
	if err := scanMasterStatus(ctx, conn, &file, &pos); err != nil {
		return LoggedTx{}, err
	}
	if _, err := conn.ExecContext(ctx, query, args...); err != nil {
		return LoggedTx{}, fmt.Errorf("testsvc: exec: %w", err)
	}
	tx := LoggedTx{}
	if err := conn.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&tx.GTID); err != nil || tx.GTID == "" {
		return LoggedTx{}, fmt.Errorf("testsvc: @@last_gtid = %q: %v (MariaDB with the binary log on is needed)", tx.GTID, err)
	}
	for range 4 { // the file it started in, and a few rotations
		found, next, err := findLoggedTx(ctx, conn, file, pos, &tx)
		if err != nil || found {
			return tx, err
		}
		if next == "" {
			break
		}
		file, pos = next, 4
	}
	return LoggedTx{}, fmt.Errorf("testsvc: transaction %s not found in the binary log", tx.GTID)
}

func scanMasterStatus(ctx context.Context, conn *sql.Conn, file *string, pos *int64) error {
	rows, err := conn.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		return fmt.Errorf("testsvc: SHOW MASTER STATUS: %w", err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	if !rows.Next() {
		return fmt.Errorf("testsvc: SHOW MASTER STATUS: no row (binary log off?)")
	}
	dest := make([]any, len(cols))
	for i := range dest {
		dest[i] = new(sql.RawBytes)
	}
	dest[0], dest[1] = file, pos
	if err := rows.Scan(dest...); err != nil {
		return fmt.Errorf("testsvc: SHOW MASTER STATUS: %w", err)
	}
	return rows.Err()
}

// findLoggedTx scans file from pos for the events of tx.GTID. next names
// the following binary log file when the transaction was not in this one.
func findLoggedTx(ctx context.Context, conn *sql.Conn, file string, pos int64, tx *LoggedTx) (found bool, next string, err error) {
	const page = 500
	inTx := false
	for offset := 0; ; offset += page {
		rows, err := conn.QueryContext(ctx, fmt.Sprintf("SHOW BINLOG EVENTS IN '%s' FROM %d LIMIT %d, %d",
			strings.ReplaceAll(file, "'", ""), pos, offset, page))
		if err != nil {
			return false, "", fmt.Errorf("testsvc: SHOW BINLOG EVENTS: %w", err)
		}
		n := 0
		for rows.Next() {
			n++
			var logName, typ, server, info string
			var at, end int64
			if err := rows.Scan(&logName, &at, &typ, &server, &end, &info); err != nil {
				rows.Close()
				return false, "", fmt.Errorf("testsvc: SHOW BINLOG EVENTS: %w", err)
			}
			switch {
			case typ == "Gtid":
				inTx = gtidOf(info) == tx.GTID
			case !inTx:
			case tx.RowsPos == 0 && (strings.HasPrefix(typ, "Write_rows") || strings.HasPrefix(typ, "Update_rows") || strings.HasPrefix(typ, "Delete_rows")):
				tx.File, tx.RowsPos, tx.RowsEnd = file, at, end
			case typ == "Xid" || (typ == "Query" && info == "COMMIT"):
				tx.CommitEnd = end
				rows.Close()
				return tx.RowsPos != 0, "", nil
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return false, "", fmt.Errorf("testsvc: SHOW BINLOG EVENTS: %w", err)
		}
		if n < page {
			break
		}
	}
	// Not in this file: the next one, if any.
	rows, err := conn.QueryContext(ctx, "SHOW BINARY LOGS")
	if err != nil {
		return false, "", fmt.Errorf("testsvc: SHOW BINARY LOGS: %w", err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	seen := false
	for rows.Next() {
		var name string
		dest := make([]any, len(cols))
		dest[0] = &name
		for i := 1; i < len(dest); i++ {
			dest[i] = new(sql.RawBytes)
		}
		if err := rows.Scan(dest...); err != nil {
			return false, "", err
		}
		if seen {
			return false, name, nil
		}
		seen = name == file
	}
	return false, "", rows.Err()
}

// gtidOf returns the GTID of a Gtid event's Info ("BEGIN GTID 0-1-5
// cid=9", "GTID 0-1-6").
func gtidOf(info string) string {
	f := strings.Fields(info)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "GTID" {
			return f[i+1]
		}
	}
	return ""
}
