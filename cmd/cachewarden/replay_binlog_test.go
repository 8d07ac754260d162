package main

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// binlogReplayRules bumps a user's namespace and counts a post's comments
// in the database %[2]s, under the prefix %[1]q.
const binlogReplayRules = `version: 1
prefix: %[1]q
rules:
  - name: user-profile
    table: %[2]s.users
    bump: "ns:user:{id}"
  - name: post-comments
    table: %[2]s.comments
    count:
      key: "comments:{post_id}"
      recount: "SELECT COUNT(*) FROM comments WHERE post_id = ?"
      args: [post_id]
`

// binlogMarks are the positions of the server around three transactions
// that each add user i and a comment of post 9: before[i] is the
// position before transaction i, after[i] after it, as gtid:SET and
// file:NAME:POS; at[i] is a time at or before transaction i began and
// after transaction i-1's.
type binlogMarks struct {
	gtid, file []string // positions 0..3: before transaction 1, ..., after 3
	at         []time.Time
}

// binlogReplayFixture writes the three transactions on the server with
// the binary log and returns the database's handle, DSN and name, and
// the marks.
func binlogReplayFixture(t *testing.T) (*sql.DB, string, string, binlogMarks) {
	t.Helper()
	db, dsn := testsvc.MySQLBinlog(t)
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE TABLE users (id INT PRIMARY KEY)",
		"CREATE TABLE comments (id INT AUTO_INCREMENT PRIMARY KEY, post_id INT NOT NULL)",
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	var m binlogMarks
	mark := func() {
		var set, file string
		var pos uint32
		if err := db.QueryRow("SELECT @@GLOBAL.gtid_binlog_pos").Scan(&set); err != nil {
			t.Fatal(err)
		}
		row := db.QueryRow("SHOW MASTER STATUS")
		var doDB, ignoreDB string
		if err := row.Scan(&file, &pos, &doDB, &ignoreDB); err != nil {
			t.Fatal(err)
		}
		m.gtid = append(m.gtid, "gtid:"+set)
		m.file = append(m.file, fmt.Sprintf("file:%s:%d", file, pos))
	}
	for i := 1; i <= 3; i++ {
		// Each transaction begins in a second of its own: binary log
		// times are whole seconds.
		next := time.Now().Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next))
		m.at = append(m.at, next)
		mark()
		tx, err := db.Begin()
		if err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{fmt.Sprintf("INSERT INTO users VALUES (%d)", i), "INSERT INTO comments (post_id) VALUES (9)"} {
			if _, err := tx.Exec(q); err != nil {
				t.Fatal(err)
			}
		}
		if err := tx.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	mark()
	next := time.Now().Truncate(time.Second).Add(time.Second)
	time.Sleep(time.Until(next))
	m.at = append(m.at, next)
	return db, dsn, name, m
}

// TestReplayBinlogCommand replays ranges of the binary log given by GTID
// sets, file positions and times, and up to the server's position: only
// the users of the range are bumped, and post 9's counter is recounted
// to MySQL's 3.
func TestReplayBinlogCommand(t *testing.T) {
	_, dsn, name, m := binlogReplayFixture(t)
	mcAddr := testsvc.Memcached(t)
	mc := memcache.New(mcAddr)
	tests := []struct {
		name     string
		from, to string
		bumped   []bool // users 1..3
	}{
		{"gtid", m.gtid[1], m.gtid[2], []bool{false, true, false}},
		{"file", m.file[0], m.file[2], []bool{true, true, false}},
		{"time", m.at[1].Format(time.RFC3339), m.at[3].Format(time.RFC3339), []bool{false, true, true}},
		{"to the server's position", m.file[2], "", []bool{false, false, true}},
		{"gtid to a file position", m.gtid[0], m.file[1], []bool{true, false, false}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := "cwreplay:" + testsvc.Unique() + ":"
			cfg := writeBinlogReplayConfig(t, dsn, mcAddr, name, prefix)
			ck := binlogCounterKey(t, mc, prefix, name)
			if err := mc.Set(&memcache.Item{Key: ck, Value: []byte("40")}); err != nil {
				t.Fatal(err)
			}
			args := []string{"replay", "-c", cfg, "--from", tt.from, "--progress", "0"}
			if tt.to != "" {
				args = append(args, "--to", tt.to)
			}
			_, errOut, err := invoke(t, "", args...)
			if err != nil {
				t.Fatalf("replay %v: %v\n%s", args, err, errOut)
			}
			for i, want := range tt.bumped {
				key := fmt.Sprintf("%sns:user:%d", prefix, i+1)
				if got := mcGet(t, mc, key); (got != "<missing>") != want {
					t.Errorf("ns:user:%d = %q, bumped want %v\n%s", i+1, got, want, errOut)
				}
			}
			if got := mcGet(t, mc, ck); got != "3" {
				t.Errorf("comments:9 = %q, want MySQL's 3 (recounted)\n%s", got, errOut)
			}
			if n := summaryCount(t, errOut, "recounts"); n != 1 {
				t.Errorf("%d recounts, want 1:\n%s", n, errOut)
			}
		})
	}
}

// writeBinlogReplayConfig writes a config with source binlog reading the
// server dsn names (also the rules' MySQL) and rules for database name
// under prefix, and returns its path.
func writeBinlogReplayConfig(t *testing.T, dsn, mcAddr, name, prefix string) string {
	t.Helper()
	dir := t.TempDir()
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(fmt.Sprintf(binlogReplayRules, prefix, name)), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "cachewarden.yaml")
	cfg := fmt.Sprintf(`source: binlog
binlog:
  dsn: %q
  server_id: 4242
memcached:
  servers: [%s]
mysql:
  dsn: %q
rules: [%s]
`, dsn, mcAddr, dsn, rulesPath)
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// binlogCounterKey is post 9's comment counter key under the current
// generation of name.comments, creating the generation when missing.
func binlogCounterKey(t *testing.T, mc *memcache.Client, prefix, name string) string {
	t.Helper()
	gk := rules.GenerationKey(prefix, name, "comments")
	if err := mc.Add(&memcache.Item{Key: gk, Value: []byte("1782579200000000000")}); err != nil && err != memcache.ErrNotStored {
		t.Fatal(err)
	}
	it, err := mc.Get(gk)
	if err != nil {
		t.Fatal(err)
	}
	gen, ok := itemformat.ParseGeneration(it.Value)
	if !ok {
		t.Fatalf("generation %q: %q", gk, it.Value)
	}
	return itemformat.CounterKey(prefix+"comments:9", gen)
}

// TestReplayBinlogUsage checks the usage errors of replay with the binary
// log source: each names the forms the flag takes.
func TestReplayBinlogUsage(t *testing.T) {
	cfg := writeBinlogReplayConfig(t, "u:p@tcp(127.0.0.1:1)/", "127.0.0.1:1", "shop", "p:")
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"kafka offsets", []string{"--from", "cdc:0:1"}, "with source binlog --from takes"},
		{"bad position", []string{"--from", "file:mysql-bin.000001"}, "want file:NAME:POS"},
		{"to earliest", []string{"--from", "earliest", "--to", "earliest"}, "earliest is not an end"},
		{"bad to", []string{"--from", "earliest", "--to", "cdc:0:1"}, "with source binlog --to takes"},
		{"future", []string{"--from", "2099-01-01T00:00:00Z"}, "is in the future"},
		{"times out of order", []string{"--from", "2026-05-01T10:00:00Z", "--to", "2026-05-01T09:00:00Z"}, "is not after"},
		{"topics", []string{"--from", "earliest", "--topics", "cdc"}, "--topics names Kafka topics"},
		{"sets append", []string{"--from", "earliest", "--sets", "append"}, "--sets append is for the Kafka source"},
		{"dry run", []string{"--from", "earliest", "--dry-run"}, "--dry-run replays Kafka or a --file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, err := invoke(t, "", append([]string{"replay", "-c", cfg}, tt.args...)...)
			if code := exitCode(err); code != 2 {
				t.Fatalf("exit code %d (%v), want 2\n%s", code, err, errOut)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q lacks %q", err, tt.wantErr)
			}
		})
	}
}
