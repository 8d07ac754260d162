package doctor

import (
	"context"
	"database/sql"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/source/binlog"
)

// checkBinlog checks the binary log source's server as the daemon does at
// start (binlog.Inspect): its settings, the user's privileges and the
// server id, one finding each, and its notes.
func checkBinlog(ctx context.Context, cfg *config.Config, rep *Report) {
	b := cfg.Binlog
	subject := config.RedactDSN(b.DSN)
	db, err := sql.Open("mysql", b.DSN)
	if err != nil {
		rep.add("binlog", subject, Fail, "binlog.dsn: %v", err)
		return
	}
	defer db.Close()
	report, err := binlog.Inspect(ctx, db, uint32(b.ServerID))
	if err != nil {
		rep.add("binlog", subject, Fail, "cannot ask the source server: %v", err)
		return
	}
	rep.add("binlog", subject, OK, "%s %s, binlog_row_metadata %s", report.Flavor, report.Version, orNone(report.RowMetadata))
	for _, p := range report.Problems {
		rep.add("binlog", subject, Fail, "%v", p)
	}
	for _, n := range report.Notes {
		rep.add("binlog", subject, Warn, "%s", n)
	}
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}
