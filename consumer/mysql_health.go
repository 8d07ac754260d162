package consumer

import (
	"context"
	"strings"
	"sync/atomic"
	"time"
)

// MySQLPinger checks that MySQL answers; *counters.MySQL is one.
type MySQLPinger interface {
	Ping(ctx context.Context) error
}

// MySQLHealth is what the daemon needs to check MySQL for readiness: set
// it (Deps.MySQL) when some rule runs a load or recount query.
type MySQLHealth struct {
	// DB is pinged every Config.ReadyInterval; required.
	DB MySQLPinger
	// Addr names the server (host:port, never the password) in /readyz,
	// the log and the addr label of cachewarden_mysql_up.
	Addr string
	// Rules are the names of the rules that query MySQL, for /readyz.
	Rules []string
}

// mysqlPingTimeout bounds one readiness ping of MySQL.
const mysqlPingTimeout = 5 * time.Second

// mysqlState is the last MySQL check's result; the zero value is "not
// checked yet" (not ready).
type mysqlState struct {
	up atomic.Bool
	// err is the last failed ping's error text.
	err atomic.Pointer[string]
}

// mysqlNotReady returns the /readyz reason while MySQL is needed and did
// not answer its last check, else "".
func (d *Daemon) mysqlNotReady() string {
	h := d.mysql
	if h == nil || d.mysqlState.up.Load() {
		return ""
	}
	why := "not checked yet"
	if e := d.mysqlState.err.Load(); e != nil {
		why = *e
	}
	return "mysql: " + h.Addr + " unreachable (" + why + "); rules " + strings.Join(h.Rules, ", ") + " run load or recount queries there"
}

// checkMySQL is one run of the MySQL health loop (everyReadyInterval):
// it pings MySQL, bounded by mysqlPingTimeout, and records, logs and
// gauges the reachability. It returns false when ctx ended.
func (d *Daemon) checkMySQL(ctx context.Context, first bool) bool {
	h := d.mysql
	pctx, cancel := context.WithTimeout(ctx, mysqlPingTimeout)
	err := h.DB.Ping(pctx)
	cancel()
	if ctx.Err() != nil {
		return false
	}
	up := err == nil
	if !up {
		msg := err.Error()
		d.mysqlState.err.Store(&msg)
	}
	if reachabilityChanged(&d.mysqlState.up, up, first) {
		if up {
			d.log.Info("MySQL reachable", "addr", h.Addr)
		} else {
			d.log.Warn("MySQL unreachable; not ready", "addr", h.Addr, "rules", h.Rules, "error", err.Error())
		}
	}
	boolGauge(d.m.mysqlUp.WithLabelValues(h.Addr), up)
	return true
}
