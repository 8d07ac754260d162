package binlog

import (
	"context"
	"database/sql"
	"strings"
	"testing"

	gosql "github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// problems runs CheckServer and returns its error's text ("" for none).
func problems(t *testing.T, db *sql.DB, serverID uint32) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitBound)
	defer cancel()
	if err := CheckServer(ctx, db, serverID); err != nil {
		return err.Error()
	}
	return ""
}

func requireProblems(t *testing.T, got string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(got, w) {
			t.Errorf("problems %q do not say %q", got, w)
		}
	}
}

func TestCheckServerReady(t *testing.T) {
	f := newFixture(t)
	if got := problems(t, f.db, randomServerID()); got != "" {
		t.Fatalf("the binlog server has problems: %s", got)
	}
	r, err := Inspect(context.Background(), f.db, randomServerID())
	if err != nil {
		t.Fatal(err)
	}
	want := "mysql"
	if strings.Contains(r.Version, "MariaDB") {
		want = "mariadb"
	}
	if r.Flavor != want || r.RowMetadata == "" || len(r.Notes) == 0 || !strings.Contains(r.Notes[0], "binlog_row_metadata is "+r.RowMetadata) {
		t.Fatalf("report %+v: want the flavor and a note on binlog_row_metadata", r)
	}
}

func TestCheckServerNoBinaryLog(t *testing.T) {
	db, _ := testsvc.MySQL(t)
	var logBin int
	if err := db.QueryRow("SELECT @@log_bin").Scan(&logBin); err != nil {
		t.Fatal(err)
	}
	if logBin == 1 {
		// scripts/services.sh then uses that server for the binary log
		// too: there is no server without one to check.
		t.Skip("the server at CACHEWARDEN_TEST_MYSQL_DSN has its binary log on; this test needs one without")
	}
	requireProblems(t, problems(t, db, randomServerID()), "log_bin is OFF", "start it with log_bin")
}

func TestCheckServerIDs(t *testing.T) {
	f := newFixture(t)
	var own uint32
	if err := f.db.QueryRow("SELECT @@server_id").Scan(&own); err != nil {
		t.Fatal(err)
	}
	requireProblems(t, problems(t, f.db, own), "is the server's own @@server_id")
	requireProblems(t, problems(t, f.db, 0), "server id is 0")

	// A connected stream is a replica the server lists.
	id := randomServerID()
	s := f.open(t, f.position(t), func(c *Config) { c.ServerID = id })
	defer s.Close()
	requireProblems(t, problems(t, f.db, id), "is used by a replica of this server")
}

// lowUser creates a user with the grants, dropped when the test ends, and
// returns a handle connected as it.
func lowUser(t *testing.T, f *fixture, grants ...string) *sql.DB {
	t.Helper()
	name := "cw" + testsvc.Unique()
	f.exec(t, "CREATE USER '"+name+"'@'%' IDENTIFIED BY 'pw'")
	t.Cleanup(func() { f.db.Exec("DROP USER '" + name + "'@'%'") })
	for _, g := range grants {
		f.exec(t, "GRANT "+g+" TO '"+name+"'@'%'")
	}
	cfg, err := gosql.ParseDSN(f.dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd, cfg.DBName = name, "pw", ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func TestCheckServerPrivileges(t *testing.T) {
	f := newFixture(t)
	t.Run("select only", func(t *testing.T) {
		db := lowUser(t, f, "SELECT ON "+f.name+".*")
		got := problems(t, db, randomServerID())
		requireProblems(t, got, "REPLICATION SLAVE is not granted", "REPLICATION CLIENT (BINLOG MONITOR on MariaDB 10.5+) is not granted")
		if strings.Contains(got, "SELECT is not granted") {
			t.Errorf("problems %q: SELECT is granted", got)
		}
	})
	t.Run("nothing", func(t *testing.T) {
		db := lowUser(t, f)
		requireProblems(t, problems(t, db, randomServerID()), "REPLICATION SLAVE is not granted", "SELECT is not granted")
	})
	t.Run("replication client", func(t *testing.T) {
		db := lowUser(t, f, "REPLICATION SLAVE, REPLICATION CLIENT ON *.*", "SELECT ON "+f.name+".*")
		if got := problems(t, db, randomServerID()); got != "" {
			t.Errorf("problems %q: the privileges a replica needs are granted", got)
		}
	})
}

func TestParseGrants(t *testing.T) {
	cases := []struct {
		name                     string
		lines                    []string
		slave, client, anySelect bool
	}{
		{"all", []string{"GRANT ALL PRIVILEGES ON *.* TO `root`@`%` WITH GRANT OPTION"}, true, true, true},
		{"mariadb binlog monitor", []string{"GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO `cw`@`%`"}, true, true, true},
		{"mysql replication client", []string{"GRANT REPLICATION SLAVE, REPLICATION CLIENT ON *.* TO `cw`@`%`"}, true, true, false},
		{"database level only", []string{"GRANT USAGE ON *.* TO `cw`@`%`", "GRANT ALL PRIVILEGES ON `app`.* TO `cw`@`%`"}, false, false, true},
		{"column privileges", []string{"GRANT SELECT (a, b), INSERT ON `app`.`t` TO `cw`@`%`", "GRANT REPLICATION SLAVE ON *.* TO `cw`@`%`"}, true, false, true},
		{"proxy and roles grant nothing", []string{"GRANT PROXY ON ''@'%' TO 'cw'@'%'", "GRANT `r`@`%` TO `cw`@`%`"}, false, false, false},
		{"grants to PUBLIC do not count", []string{"GRANT SELECT, INSERT ON `test`.* TO PUBLIC"}, false, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			g := parseGrants(tc.lines)
			if g.has("REPLICATION SLAVE") != tc.slave || g.has("REPLICATION CLIENT", "BINLOG MONITOR") != tc.client || g.anySelect != tc.anySelect {
				t.Fatalf("grants %+v: want slave %v, client %v, select %v", g, tc.slave, tc.client, tc.anySelect)
			}
		})
	}
}
