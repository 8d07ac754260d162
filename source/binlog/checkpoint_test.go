package binlog

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// checkpointServer returns the DSN and the name of a fresh database on
// the binlog server.
func checkpointServer(t *testing.T) (dsn, database string) {
	t.Helper()
	_, dsn = testsvc.MySQLBinlog(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	return dsn, cfg.DBName
}

// openTestCheckpoint opens cfg's checkpoint on its own *sql.DB, as
// another process would.
func openTestCheckpoint(t *testing.T, dsn string, cfg CheckpointConfig) *Checkpoint {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c, err := OpenCheckpoint(ctx, db, cfg, nil)
	if err != nil {
		t.Fatalf("OpenCheckpoint: %v", err)
	}
	return c
}

func mustAcquire(t *testing.T, c *Checkpoint, wantEpoch int64, wantPos string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	epoch, pos, err := c.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if epoch != wantEpoch || pos != wantPos {
		t.Fatalf("Acquire = epoch %d, position %q; want %d, %q", epoch, pos, wantEpoch, wantPos)
	}
}

func save(c *Checkpoint, pos string) error {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	return c.Save(ctx, pos)
}

// storedPosition reads the row as another client sees it.
func storedPosition(t *testing.T, dsn string, c *Checkpoint) (string, int64) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var pos string
	var epoch int64
	if err := db.QueryRow("SELECT position, epoch FROM "+c.qualTab+" WHERE name = ?", c.name).Scan(&pos, &epoch); err != nil {
		t.Fatalf("read the checkpoint row: %v", err)
	}
	return pos, epoch
}

func TestCheckpointSaveAfterAcquire(t *testing.T) {
	dsn, database := checkpointServer(t)
	c := openTestCheckpoint(t, dsn, CheckpointConfig{Database: database, Name: "orders"})
	if d, tab := c.Table(); d != database || tab != DefaultCheckpointTable {
		t.Errorf("Table() = %q, %q; want %q, %q", d, tab, database, DefaultCheckpointTable)
	}
	if err := save(c, "0-1-1"); !errors.Is(err, ErrNotAcquired) {
		t.Errorf("Save before Acquire = %v, want ErrNotAcquired", err)
	}
	mustAcquire(t, c, 1, "")
	for _, pos := range []string{"0-1-5", "0-1-9,1-2-3", "0-1-9,1-2-3", "mysql-bin.000002:1234"} {
		if err := save(c, pos); err != nil {
			t.Fatalf("Save(%q): %v", pos, err)
		}
		if got, epoch := storedPosition(t, dsn, c); got != pos || epoch != 1 {
			t.Errorf("after Save(%q) the row holds %q at epoch %d", pos, got, epoch)
		}
	}
}

func TestCheckpointFenced(t *testing.T) {
	dsn, database := checkpointServer(t)
	cfg := CheckpointConfig{Database: database, Name: "orders"}
	old := openTestCheckpoint(t, dsn, cfg)
	mustAcquire(t, old, 1, "")
	if err := save(old, "0-1-5"); err != nil {
		t.Fatal(err)
	}
	cur := openTestCheckpoint(t, dsn, cfg)
	mustAcquire(t, cur, 2, "0-1-5")
	for _, pos := range []string{"0-1-7", "0-1-5"} { // a new position, and the stored one
		err := save(old, pos)
		if !errors.Is(err, ErrFenced) {
			t.Fatalf("old owner's Save(%q) = %v, want ErrFenced", pos, err)
		}
		t.Logf("old owner's Save: %v", err)
	}
	if err := save(cur, "0-1-8"); err != nil {
		t.Fatalf("new owner's Save: %v", err)
	}
	if got, epoch := storedPosition(t, dsn, cur); got != "0-1-8" || epoch != 2 {
		t.Errorf("the row holds %q at epoch %d, want the new owner's 0-1-8 at 2", got, epoch)
	}
}

// A Save that changes no column gives 0 affected rows; checkEpoch tells
// an unchanged row (ours) from a fenced one.
func TestCheckpointCheckEpoch(t *testing.T) {
	dsn, database := checkpointServer(t)
	cfg := CheckpointConfig{Database: database, Name: "orders"}
	a := openTestCheckpoint(t, dsn, cfg)
	mustAcquire(t, a, 1, "")
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := a.checkEpoch(ctx); err != nil {
		t.Errorf("checkEpoch of the owner: %v", err)
	}
	mustAcquire(t, openTestCheckpoint(t, dsn, cfg), 2, "")
	if err := a.checkEpoch(ctx); !errors.Is(err, ErrFenced) {
		t.Errorf("checkEpoch of the old owner = %v, want ErrFenced", err)
	}
}

func TestCheckpointSurvivesReopen(t *testing.T) {
	dsn, database := checkpointServer(t)
	cfg := CheckpointConfig{Database: database, Table: "cp", Name: "orders"}
	c := openTestCheckpoint(t, dsn, cfg)
	mustAcquire(t, c, 1, "")
	if err := save(c, "mysql-bin.000003:4567"); err != nil {
		t.Fatal(err)
	}
	reopened := openTestCheckpoint(t, dsn, cfg)
	mustAcquire(t, reopened, 2, "mysql-bin.000003:4567")
	if got := reopened.Epoch(); got != 2 {
		t.Errorf("Epoch() = %d, want 2", got)
	}
	// Another name is another row.
	mustAcquire(t, openTestCheckpoint(t, dsn, CheckpointConfig{Database: database, Table: "cp", Name: "users"}), 1, "")
}

// Names go into SQL text only through quoteIdent.
func TestCheckpointQuotedTable(t *testing.T) {
	dsn, database := checkpointServer(t)
	table := "cp `x`; DROP TABLE y"
	c := openTestCheckpoint(t, dsn, CheckpointConfig{Database: database, Table: table, Name: "o'rders"})
	mustAcquire(t, c, 1, "")
	if err := save(c, "'; DROP TABLE y; --"); err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	err = db.QueryRow("SELECT COUNT(*) FROM information_schema.TABLES WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?", database, table).Scan(&n)
	if err != nil || n != 1 {
		t.Errorf("table %q in %s: count %d, %v; want 1", table, database, n, err)
	}
}

func TestCheckpointConfig(t *testing.T) {
	db, err := sql.Open("mysql", "nobody@tcp(127.0.0.1:1)/")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	long := strings.Repeat("t", maxIdentifier+1)
	for _, tc := range []struct {
		cfg     CheckpointConfig
		wantErr string
	}{
		{CheckpointConfig{Name: "o"}, "database name is empty"},
		{CheckpointConfig{Database: long, Name: "o"}, "MySQL allows at most 64"},
		{CheckpointConfig{Database: "d", Table: long, Name: "o"}, "MySQL allows at most 64"},
		{CheckpointConfig{Database: "d", Table: "t ", Name: "o"}, "ends with a space"},
		{CheckpointConfig{Database: "d\x00", Name: "o"}, "NUL"},
		{CheckpointConfig{Database: "d\xff", Name: "o"}, "not valid UTF-8"},
		{CheckpointConfig{Database: "d"}, "checkpoint name"},
		{CheckpointConfig{Database: "d", Name: strings.Repeat("n", maxCheckpointName+1)}, "1 to 191 characters"},
		{CheckpointConfig{Database: "d", Name: "o", Timeout: -time.Second}, "negative"},
	} {
		_, err := OpenCheckpoint(context.Background(), db, tc.cfg, nil)
		if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("OpenCheckpoint(%+v) = %v, want an error saying %q", tc.cfg, err, tc.wantErr)
		}
	}
	if got := quoteIdent("a`b"); got != "`a``b`" {
		t.Errorf("quoteIdent(a`b) = %s", got)
	}
}
