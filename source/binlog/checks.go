package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// ServerReport is what Inspect found out about a server a Stream would
// read.
type ServerReport struct {
	// Flavor is mysql.MySQLFlavor or mysql.MariaDBFlavor; Version the
	// server's VERSION().
	Flavor, Version string
	// RowMetadata is @@binlog_row_metadata ("FULL", "MINIMAL", "NO_LOG"),
	// "" when the server has no such variable.
	RowMetadata string
	// Notes are facts worth logging that need no change.
	Notes []string
	// Problems each name a setting, its value and the fix; a Stream
	// cannot work (or not reliably) until they are solved.
	Problems []error
}

// CheckServer checks that the server db talks to can be read as a
// replica with server id serverID, and returns every problem found
// (errors.Join), nil when there is none. Inspect gives the notes too.
func CheckServer(ctx context.Context, db *sql.DB, serverID uint32) error {
	r, err := Inspect(ctx, db, serverID)
	if err != nil {
		return err
	}
	return errors.Join(r.Problems...)
}

// Inspect reads the settings, grants and replicas of the server db talks
// to. Its error is for a server it could not ask; what is wrong with the
// server is in the report's Problems. Every query is bounded by ctx.
func Inspect(ctx context.Context, db *sql.DB, serverID uint32) (*ServerReport, error) {
	r := &ServerReport{}
	var logBin int
	var format, image string
	var ownID uint32
	err := db.QueryRowContext(ctx, "SELECT VERSION(), @@log_bin, @@binlog_format, @@binlog_row_image, @@server_id").
		Scan(&r.Version, &logBin, &format, &image, &ownID)
	if err != nil {
		return nil, fmt.Errorf("binlog: read the server's settings: %w", err)
	}
	r.Flavor = flavorOf(r.Version)
	if p := versionProblem(r.Flavor, r.Version); p != nil {
		r.Problems = append(r.Problems, p)
	}
	if logBin != 1 {
		r.Problems = append(r.Problems, errors.New("log_bin is OFF: the server writes no binary log; start it with log_bin (log-bin=mysql-bin in its configuration) and restart it"))
	}
	if !strings.EqualFold(format, "ROW") {
		r.Problems = append(r.Problems, fmt.Errorf("binlog_format is %s: row changes are only logged as rows with ROW; set binlog_format=ROW in the server's configuration (and SET GLOBAL binlog_format='ROW')", format))
	}
	if !strings.EqualFold(image, "FULL") {
		r.Problems = append(r.Problems, fmt.Errorf("binlog_row_image is %s: rows are logged without all their columns; set binlog_row_image=FULL in the server's configuration (and SET GLOBAL binlog_row_image='FULL')", image))
	}
	r.rowMetadata(ctx, db)
	if err := r.checkGrants(ctx, db); err != nil {
		return nil, err
	}
	if err := r.checkServerID(ctx, db, serverID, ownID); err != nil {
		return nil, err
	}
	return r, nil
}

// flavorOf tells MariaDB from MySQL by the version string.
func flavorOf(version string) string {
	if strings.Contains(strings.ToLower(version), "mariadb") {
		return mysql.MariaDBFlavor
	}
	return mysql.MySQLFlavor
}

// versionProblem reports a server older than MySQL 8.0 or MariaDB 10.6.
func versionProblem(flavor, version string) error {
	parts := strings.SplitN(version, ".", 3)
	if len(parts) < 2 {
		return fmt.Errorf("server version %q cannot be read: MySQL 8.0 or later, or MariaDB 10.6 or later, is needed", version)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return fmt.Errorf("server version %q cannot be read: MySQL 8.0 or later, or MariaDB 10.6 or later, is needed", version)
	}
	if flavor == mysql.MariaDBFlavor && (major < 10 || major == 10 && minor < 6) {
		return fmt.Errorf("server version is MariaDB %s: MariaDB 10.6 or later is needed; upgrade the server", version)
	}
	if flavor == mysql.MySQLFlavor && major < 8 {
		return fmt.Errorf("server version is MySQL %s: MySQL 8.0 or later is needed; upgrade the server", version)
	}
	return nil
}

// rowMetadata reads binlog_row_metadata into r and notes what it means.
func (r *ServerReport) rowMetadata(ctx context.Context, db *sql.DB) {
	var v string
	if err := db.QueryRowContext(ctx, "SELECT @@binlog_row_metadata").Scan(&v); err != nil {
		r.Notes = append(r.Notes, "binlog_row_metadata is unknown to this server: column names are read from information_schema")
		return
	}
	r.RowMetadata = strings.ToUpper(v)
	if r.RowMetadata == "FULL" {
		r.Notes = append(r.Notes, "binlog_row_metadata is FULL: column names and types come from the binary log")
		return
	}
	r.Notes = append(r.Notes, fmt.Sprintf("binlog_row_metadata is %s: column names come from information_schema, read once per table and again after DDL; binlog_row_metadata=FULL puts them in the binary log, which is safer when tables change while the log is read", r.RowMetadata))
}

// checkServerID reports serverID equal to the server's own server_id or
// to one of the replicas it lists.
func (r *ServerReport) checkServerID(ctx context.Context, db *sql.DB, serverID, ownID uint32) error {
	if serverID == 0 {
		r.Problems = append(r.Problems, errors.New("server id is 0: a replica needs a server id other than 0; configure one between 1 and 4294967295"))
	}
	if serverID == ownID {
		r.Problems = append(r.Problems, fmt.Errorf("server id %d is the server's own @@server_id: configure another server id for cachewarden", serverID))
	}
	ids, err := replicaIDs(ctx, db, r.Flavor)
	if err != nil {
		if ctx.Err() != nil {
			return err
		}
		// Not a problem: a replica's user needs no right to list the
		// others; only the check is lost.
		grant := "REPLICATION SLAVE"
		if r.Flavor == mysql.MariaDBFlavor {
			grant = "REPLICATION MASTER ADMIN"
		}
		r.Notes = append(r.Notes, fmt.Sprintf("server id %d was not compared with the server's replicas: they cannot be listed (%v); granting %s lets the check run", serverID, err, grant))
		return nil
	}
	for _, id := range ids {
		if id == serverID {
			r.Problems = append(r.Problems, fmt.Errorf("server id %d is used by a replica of this server (SHOW REPLICAS or SHOW SLAVE HOSTS lists it): two replicas with one server id disconnect each other; configure another server id for cachewarden", serverID))
		}
	}
	return nil
}

// replicaIDs lists the server ids of the replicas the server knows: SHOW
// REPLICAS (MySQL 8.0.22+), else SHOW SLAVE HOSTS.
func replicaIDs(ctx context.Context, db *sql.DB, flavor string) ([]uint32, error) {
	query := "SHOW SLAVE HOSTS"
	if flavor == mysql.MySQLFlavor {
		query = "SHOW REPLICAS"
	}
	rows, err := db.QueryContext(ctx, query)
	if err != nil && flavor == mysql.MySQLFlavor {
		query = "SHOW SLAVE HOSTS" // MySQL before 8.0.22
		rows, err = db.QueryContext(ctx, query)
	}
	if err != nil {
		return nil, fmt.Errorf("binlog: list the server's replicas (%s): %w", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, fmt.Errorf("binlog: list the server's replicas: %w", err)
	}
	var ids []uint32
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return nil, fmt.Errorf("binlog: list the server's replicas: %w", err)
		}
		for i, c := range cols {
			if strings.EqualFold(c, "Server_id") {
				if id, err := strconv.ParseUint(string(vals[i]), 10, 32); err == nil {
					ids = append(ids, uint32(id))
				}
			}
		}
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("binlog: list the server's replicas: %w", err)
	}
	return ids, nil
}
