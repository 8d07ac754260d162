package doctor

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/rules"
)

// MySQL error numbers the doctor names.
const (
	errTableAccessDenied  = 1142 // ER_TABLEACCESS_DENIED_ERROR
	errColumnAccessDenied = 1143 // ER_COLUMNACCESS_DENIED_ERROR
	errUnknownVariable    = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE
)

// checkMySQL connects with the config's DSN and reports the server's
// binary log settings (what a CDC connector such as Debezium needs, and
// what exact counters' fences read: log_bin ON, binlog_format ROW,
// binlog_row_image FULL, GTIDs), then EXPLAINs every rule's load,
// recount and keys query, which fails without the SELECT privilege on
// what it reads.
func checkMySQL(ctx context.Context, cfg *config.Config, rep *Report) {
	const area = "mysql"
	mcfg, err := mysql.ParseDSN(cfg.MySQL.DSN)
	if err != nil {
		rep.add(area, "mysql.dsn", Fail, "%v", err) // names the malformed part, never the password
		return
	}
	where := fmt.Sprintf("%s@%s", mcfg.User, mcfg.Addr)
	// A server that never answers (a DSN at another service's port) must
	// not hang the check: bound the dial and every read and write.
	for _, t := range []*time.Duration{&mcfg.Timeout, &mcfg.ReadTimeout, &mcfg.WriteTimeout} {
		if *t == 0 {
			*t = DefaultTimeout
		}
	}
	mcfg.MultiStatements = false
	mcfg.InterpolateParams = false
	conn, err := mysql.NewConnector(mcfg)
	if err != nil {
		rep.add(area, where, Fail, "%v", err)
		return
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	db.SetMaxOpenConns(1)

	var version, logBin, format, image string
	if err := db.QueryRowContext(ctx, "SELECT @@version, @@log_bin, @@binlog_format, @@binlog_row_image").Scan(&version, &logBin, &format, &image); err != nil {
		rep.add(area, where, Fail, "%v", err)
		return
	}
	rep.add(area, where, OK, "server %s", version)
	setting := func(name, got, want, why string) {
		if strings.EqualFold(got, want) {
			rep.add(area, name, OK, "%s", got)
			return
		}
		rep.add(area, name, Warn, "%s, not %s: %s", got, want, why)
	}
	if logBin == "1" {
		logBin = "ON"
	}
	setting("log_bin", logBin, "ON", "without the binary log no CDC connector sees changes, and exact counters cannot be fenced (docs/exact-counters.md); fine if this server is not the CDC source and counters.fencing is off")
	setting("binlog_format", format, "ROW", "CDC connectors need row events")
	setting("binlog_row_image", image, "FULL", "rules see only the columns the row image carries; an update's key, member and when columns must be in both images")
	gtid(ctx, db, rep)

	checkQueries(ctx, db, cfg.RuleSet, rep)
}

// gtid reports whether the server assigns GTIDs: MySQL's gtid_mode, or
// MariaDB's gtid_binlog_pos (always on) and gtid_strict_mode.
func gtid(ctx context.Context, db *sql.DB, rep *Report) {
	const area = "mysql"
	var mode string
	err := db.QueryRowContext(ctx, "SELECT @@gtid_mode").Scan(&mode)
	var me *mysql.MySQLError
	switch {
	case err == nil:
		if strings.EqualFold(mode, "ON") {
			rep.add(area, "gtid_mode", OK, "ON")
		} else {
			rep.add(area, "gtid_mode", Warn, "%s: without GTIDs, positions are binary log file and offset, which do not survive a failover to another server", mode)
		}
		return
	case errors.As(err, &me) && me.Number == errUnknownVariable:
		// MariaDB: GTIDs are always on.
	default:
		rep.add(area, "gtid", Warn, "cannot read GTID settings: %v", err)
		return
	}
	var pos, strict string
	if err := db.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos, @@gtid_strict_mode").Scan(&pos, &strict); err != nil {
		rep.add(area, "gtid", Warn, "cannot read MariaDB's GTID settings: %v", err)
		return
	}
	if pos == "" {
		pos = "(none logged yet)"
	}
	rep.add(area, "gtid", OK, "MariaDB GTIDs, gtid_binlog_pos %s, gtid_strict_mode %s", pos, strict)
}

// checkQueries EXPLAINs each rule's queries with their placeholders bound
// to NULL: the server checks the tables, columns and the SELECT privilege
// without running them.
func checkQueries(ctx context.Context, db *sql.DB, rs *rules.RuleSet, rep *Report) {
	const area = "mysql"
	if rs == nil {
		return
	}
	asked := 0
	for _, r := range rs.Rules() {
		for _, q := range []struct{ field, sql string }{{"query", r.Query}, {"keys", r.Keys}} {
			if q.sql == "" {
				continue
			}
			asked++
			args := make([]any, strings.Count(q.sql, "?"))
			rows, err := db.QueryContext(ctx, "EXPLAIN "+q.sql, args...)
			if err == nil {
				err = rows.Close()
			}
			subject := "rule " + r.Name + " " + q.field
			var me *mysql.MySQLError
			switch {
			case err == nil:
				rep.add(area, subject, OK, "readable")
			case errors.As(err, &me) && (me.Number == errTableAccessDenied || me.Number == errColumnAccessDenied):
				rep.add(area, subject, Fail, "no SELECT privilege: %s (GRANT SELECT ON the tables it reads TO the DSN's user)", me.Message)
			default:
				rep.add(area, subject, Fail, "%v (cachewarden check --dsn explains rule queries in detail)", err)
			}
		}
	}
	if asked == 0 {
		rep.add(area, "rules", OK, "no rule queries MySQL")
	}
}
