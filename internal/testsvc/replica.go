package testsvc

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Replica is a fresh database on the binary log server (the primary) and
// the same database on its replica, for tests of readers on replicas.
type Replica struct {
	// Primary and Replica are handles to the database on each server.
	Primary, Replica *sql.DB
	// PrimaryDSN and ReplicaDSN name them.
	PrimaryDSN, ReplicaDSN string
	// ServerID is the primary's server_id, the one its change events
	// carry.
	ServerID uint32
	// lockConn holds the lock that keeps other tests' lag off the
	// replica.
	lockConn *sql.Conn
	admin    *sql.DB
}

// replicaLock is the name of the MariaDB user lock (GET_LOCK) that tests
// of every package hold while they use the replica: they stop its SQL
// thread, which would disturb each other's.
const replicaLock = "cachewarden-test-replica"

// MySQLReplica creates a fresh database on the binary log server
// (MySQLBinlog) and waits until its replica has it too:
// CACHEWARDEN_TEST_MYSQL_REPLICA_DSN, which scripts/services.sh starts on
// port 3309 replicating from the binary log server with GTIDs. It takes a
// lock that serialises the tests of all packages that use the replica,
// and at the end of the test restarts replication (StartSQL) and lets the
// lock go. When there is no replica, or it does not replicate from that
// server, the test fails under CI=true and is skipped otherwise.
func MySQLReplica(t testing.TB) *Replica {
	t.Helper()
	dsn := os.Getenv("CACHEWARDEN_TEST_MYSQL_REPLICA_DSN")
	if dsn == "" {
		missing(t, "a MariaDB replica of the binary log server (CACHEWARDEN_TEST_MYSQL_REPLICA_DSN)")
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatalf("testsvc: bad replica DSN %q: %v", dsn, err)
	}
	r := &Replica{}
	if r.admin, err = sql.Open("mysql", cfg.FormatDSN()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.admin.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if r.lockConn, err = r.admin.Conn(ctx); err != nil {
		missing(t, fmt.Sprintf("the MariaDB replica at %s (%v)", cfg.Addr, err))
	}
	var got sql.NullInt64
	if err := r.lockConn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 300)", replicaLock).Scan(&got); err != nil || got.Int64 != 1 {
		t.Fatalf("testsvc: lock the replica: %v %v (another test holds it for 5 minutes?)", got, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r.StartSQL(t)
		r.lockConn.ExecContext(ctx, "DO RELEASE_LOCK(?)", replicaLock)
		r.lockConn.Close()
	})
	// A test that died with the SQL thread stopped leaves it stopped.
	if _, err := r.admin.ExecContext(ctx, "START SLAVE"); err != nil {
		t.Fatalf("testsvc: START SLAVE on the replica: %v", err)
	}
	var primaryDB *sql.DB
	primaryDB, r.PrimaryDSN = MySQLBinlog(t)
	r.Primary = primaryDB
	if err := r.Primary.QueryRowContext(ctx, "SELECT @@server_id").Scan(&r.ServerID); err != nil {
		t.Fatal(err)
	}
	source, err := replicaSourceID(ctx, r.admin)
	if err != nil {
		t.Fatal(err)
	}
	if source != r.ServerID {
		missing(t, fmt.Sprintf("a replica of the binary log server (the one at CACHEWARDEN_TEST_MYSQL_REPLICA_DSN replicates server_id %d, not %d)", source, r.ServerID))
	}
	pcfg, _ := mysql.ParseDSN(r.PrimaryDSN)
	cfg.DBName = pcfg.DBName
	cfg.ParseTime = true
	r.ReplicaDSN = cfg.FormatDSN()
	if r.Replica, err = sql.Open("mysql", r.ReplicaDSN); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Replica.Close() })
	r.CatchUp(t)
	return r
}

// replicaSourceID returns the Master_Server_Id of SHOW SLAVE STATUS.
func replicaSourceID(ctx context.Context, db *sql.DB) (uint32, error) {
	rows, err := db.QueryContext(ctx, "SHOW SLAVE STATUS")
	if err != nil {
		return 0, fmt.Errorf("testsvc: SHOW SLAVE STATUS: %w", err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, err
	}
	if !rows.Next() {
		return 0, errors.New("testsvc: the replica server replicates nothing (SHOW SLAVE STATUS is empty)")
	}
	dest := make([]any, len(cols))
	var id sql.NullInt64
	for i, c := range cols {
		if c == "Master_Server_Id" {
			dest[i] = &id
		} else {
			dest[i] = new(sql.RawBytes)
		}
	}
	if err := rows.Scan(dest...); err != nil {
		return 0, err
	}
	return uint32(id.Int64), rows.Err()
}

// StopSQL stops the replica's SQL thread: it receives the primary's
// changes but applies none until StartSQL.
func (r *Replica) StopSQL(t testing.TB) {
	t.Helper()
	if _, err := r.admin.Exec("STOP SLAVE SQL_THREAD"); err != nil {
		t.Fatalf("testsvc: STOP SLAVE SQL_THREAD: %v", err)
	}
}

// StartSQL starts the replica's SQL thread again.
func (r *Replica) StartSQL(t testing.TB) {
	t.Helper()
	if _, err := r.admin.Exec("START SLAVE SQL_THREAD"); err != nil {
		t.Errorf("testsvc: START SLAVE SQL_THREAD: %v", err)
	}
}

// Delay makes the replica apply each transaction d (whole seconds) after
// the primary committed it (CHANGE MASTER TO MASTER_DELAY), until the end
// of the test, which sets it back to 0.
func (r *Replica) Delay(t testing.TB, d time.Duration) {
	t.Helper()
	set := func(seconds int) error {
		for _, q := range []string{"STOP SLAVE", fmt.Sprintf("CHANGE MASTER TO MASTER_DELAY = %d", seconds), "START SLAVE"} {
			if _, err := r.admin.Exec(q); err != nil {
				return fmt.Errorf("testsvc: %s: %w", q, err)
			}
		}
		return nil
	}
	if err := set(int(d.Seconds())); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := set(0); err != nil {
			t.Error(err)
		}
	})
}

// CatchUp waits (up to a minute) until the replica has applied everything
// the primary has logged so far.
func (r *Replica) CatchUp(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 70*time.Second)
	defer cancel()
	var pos string
	if err := r.Primary.QueryRowContext(ctx, "SELECT @@gtid_binlog_pos").Scan(&pos); err != nil {
		t.Fatal(err)
	}
	var res sql.NullInt64
	if err := r.admin.QueryRowContext(ctx, "SELECT MASTER_GTID_WAIT(?, 60)", pos).Scan(&res); err != nil || !res.Valid || res.Int64 != 0 {
		t.Fatalf("testsvc: the replica did not reach the primary's %s within 60s: %v %v", pos, res, err)
	}
}
