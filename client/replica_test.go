package client

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// replicaEnv is a primary with its replica holding testRules' tables, and
// a memcached of the test's own (the position item's key has no prefix).
type replicaEnv struct {
	*testsvc.Replica
	addr string
}

func newReplicaEnv(t *testing.T) *replicaEnv {
	t.Helper()
	r := testsvc.MySQLReplica(t)
	for _, q := range []string{
		"CREATE TABLE user_interests (user_id BIGINT, seq INT, interest VARCHAR(64), active TINYINT(1), PRIMARY KEY (user_id, seq))",
		"CREATE TABLE comments (id BIGINT PRIMARY KEY, post_id BIGINT, approved TINYINT(1))",
		"CREATE TABLE posts (id BIGINT PRIMARY KEY, body VARCHAR(64))",
		"INSERT INTO comments VALUES (1, 1, 1), (2, 1, 1), (3, 2, 1)",
		"INSERT INTO user_interests VALUES (7, 1, 'go', 1)",
		"INSERT INTO posts VALUES (1, 'first')",
	} {
		if _, err := r.Primary.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	r.CatchUp(t)
	return &replicaEnv{Replica: r, addr: testsvc.PrivateMemcached(t, testsvc.MemcachedOptions{}).Addr}
}

// change runs a statement on the primary and stores its GTID in the
// position item, as the daemon does before it sends the change's
// invalidations.
func (e *replicaEnv) change(t *testing.T, query string) {
	t.Helper()
	ctx := context.Background()
	conn, err := e.Primary.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, query); err != nil {
		t.Fatal(err)
	}
	var gtid string
	if err := conn.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&gtid); err != nil {
		t.Fatal(err)
	}
	g, ok := itemformat.ParseGTID(gtid)
	if !ok {
		t.Fatalf("@@last_gtid %q", gtid)
	}
	mc := memcache.New(e.addr)
	pos := itemformat.SourcePosition{GTIDs: []itemformat.GTID{g}}
	if err := mc.Set(&memcache.Item{Key: itemformat.PositionKey(e.ServerID), Value: pos.Encode()}); err != nil {
		t.Fatal(err)
	}
}

// waitForWaiter polls the replica until a session waits in
// MASTER_GTID_WAIT (up to a minute), or until the read returns first,
// when it returns the read's result.
func (e *replicaEnv) waitForWaiter(t *testing.T, done <-chan string) (result string, returned bool) {
	t.Helper()
	return e.waitFor(t, "SELECT MASTER_GTID_WAIT(%", done)
}

// waitFor is waitForWaiter for a session running a statement like
// pattern (a LIKE pattern).
func (e *replicaEnv) waitFor(t *testing.T, pattern string, done <-chan string) (result string, returned bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		var n int
		if err := e.Replica.Replica.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO LIKE ?", pattern).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return "", false
		}
		select {
		case got := <-done:
			return got, true
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("no fill waited on the replica within a minute")
	return "", false
}

// replicaReads are the kinds of fill, each reading the one row the test
// changes while the replica lags: Count of post 1's comments, Members of
// user 7's interests, a GetOrComputeFrom value of post 1 and two
// GetOrComputeMultiFrom values of post 1.
var replicaReads = []struct {
	name   string
	change string
	before string
	after  string
	// read reads through c; a client without Config.Replica reads
	// Config.DB, the replica, as applications do today.
	read func(ctx context.Context, c *Client, key string) (string, error)
}{
	{"count", "INSERT INTO comments VALUES (4, 1, 1)", "2", "3", func(ctx context.Context, c *Client, _ string) (string, error) {
		n, err := c.Count(ctx, "post-comments", Row{"post_id": 1})
		return strconv.FormatInt(n, 10), err
	}},
	{"members", "INSERT INTO user_interests VALUES (7, 2, 'sql', 1)", "go", "go,sql", func(ctx context.Context, c *Client, _ string) (string, error) {
		m, err := c.Members(ctx, "user-interests", Row{"user_id": 7})
		return strings.Join(m, ","), err
	}},
	{"get or compute", "UPDATE posts SET body = 'second' WHERE id = 1", "first", "second", func(ctx context.Context, c *Client, key string) (string, error) {
		const q = "SELECT body FROM posts WHERE id = 1"
		v, err := c.GetOrComputeFrom(ctx, key, time.Minute, func(ctx context.Context, db *sql.Conn) ([]byte, error) {
			var body []byte
			err := db.QueryRowContext(ctx, q).Scan(&body)
			return body, err
		})
		return string(v), err
	}},
	// Two keys, one compute call: one wait for both.
	{"get or compute multi", "UPDATE posts SET body = 'second' WHERE id = 1", "first,first", "second,second", func(ctx context.Context, c *Client, key string) (string, error) {
		keys := []TurnstileKey{{Key: key + ":a", Expiration: time.Minute}, {Key: key + ":b", Expiration: time.Minute}}
		got, err := c.GetOrComputeMultiFrom(ctx, keys, func(ctx context.Context, db *sql.Conn, keys []string) ([][]byte, error) {
			values := make([][]byte, len(keys))
			for i := range keys {
				if err := db.QueryRowContext(ctx, "SELECT body FROM posts WHERE id = 1").Scan(&values[i]); err != nil {
					return nil, err
				}
			}
			return values, nil
		})
		return string(got[key+":a"]) + "," + string(got[key+":b"]), err
	}},
}

// TestReplicaFenceWaits changes a row on the primary while the replica
// lags (its SQL thread stopped, or MASTER_DELAY), and fills from the
// replica: a reader without the fence reads (and caches) the old row;
// with it the fill waits until the replica has applied the change and
// caches the new one.
func TestReplicaFenceWaits(t *testing.T) {
	for _, lag := range []string{"stopped", "delayed"} {
		for _, rd := range replicaReads {
			t.Run(lag+"/"+rd.name, func(t *testing.T) {
				e := newReplicaEnv(t)
				ctx := context.Background()
				plain := newTestEnvAt(t, e.addr, e.Replica.Replica, nil)
				// No SourceServerID: the client reads it from the replica.
				fenced := newTestEnvAt(t, e.addr, nil, func(cfg *Config) {
					cfg.Replica = &ReplicaConfig{DB: e.Replica.Replica, MaxWait: 50 * time.Second}
				})
				if lag == "stopped" {
					e.StopSQL(t)
				} else {
					e.Delay(t, 2*time.Second)
				}
				e.change(t, rd.change)

				// The control: no fence, the lagging replica's row, cached.
				got, err := rd.read(ctx, plain.c, "cwtest:plain:"+testsvc.Unique())
				if err != nil || got != rd.before {
					t.Fatalf("without the fence: %q, %v; want the replica's old %q (is it lagging?)", got, err, rd.before)
				}

				// The fenced client has a prefix of its own: it fills too.
				done := make(chan string, 1)
				go func() {
					got, err := rd.read(ctx, fenced.c, "cwtest:fenced:"+testsvc.Unique())
					if err != nil {
						got = "error: " + err.Error()
					}
					done <- got
				}()
				if lag == "stopped" {
					var returned bool
					got, returned = e.waitForWaiter(t, done)
					e.StartSQL(t)
					if !returned {
						got = <-done
					}
				} else {
					got = <-done // the delay ends on its own
				}
				if got != rd.after {
					t.Errorf("with the fence: %q, want the primary's %q", got, rd.after)
				}
				if st := fenced.c.ReplicaStats(); st.Reached != 1 || st.TimedOut != 0 || st.Unfenced != 0 {
					t.Errorf("stats %+v, want 1 reached", st)
				}
			})
		}
	}
}

// TestReplicaFenceBinlogPosition fences with the binary log position
// alone (no GTID in the item). On a delayed replica MASTER_POS_WAIT for
// the offset of the change's first row event plus one returns only once
// the replica has applied that transaction. On a replica whose SQL
// thread is stopped it answers NULL at once: the fill is handled as a
// time-out (short-lived), never as reached.
func TestReplicaFenceBinlogPosition(t *testing.T) {
	e := newReplicaEnv(t)
	ctx := context.Background()
	fenced := newTestEnvAt(t, e.addr, nil, func(cfg *Config) {
		cfg.Replica = &ReplicaConfig{DB: e.Replica.Replica, SourceServerID: e.ServerID, MaxWait: 50 * time.Second}
	})
	conn, err := e.Primary.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	change := func(query string) {
		t.Helper()
		tx, err := testsvc.ExecLogged(ctx, conn, query)
		if err != nil {
			t.Fatal(err)
		}
		pos := itemformat.SourcePosition{Binlog: itemformat.BinlogPosition{File: tx.File, Pos: tx.RowsPos}}
		if err := memcache.New(e.addr).Set(&memcache.Item{Key: itemformat.PositionKey(e.ServerID), Value: pos.Encode()}); err != nil {
			t.Fatal(err)
		}
	}

	e.Delay(t, 2*time.Second)
	change("INSERT INTO comments VALUES (4, 1, 1)")
	if n, err := fenced.c.Count(ctx, "post-comments", Row{"post_id": 1}); err != nil || n != 3 {
		t.Errorf("delayed replica: %d, %v; want the primary's 3", n, err)
	}
	if st := fenced.c.ReplicaStats(); st.Reached != 1 || st.Waited < time.Second {
		t.Errorf("delayed replica: stats %+v, want 1 reached after waiting", st)
	}

	e.StopSQL(t)
	change("INSERT INTO comments VALUES (5, 2, 1)")
	if n, err := fenced.c.Count(ctx, "post-comments", Row{"post_id": 2}); err != nil || n != 1 {
		t.Errorf("stopped replica: %d, %v; want the replica's 1", n, err)
	}
	if st := fenced.c.ReplicaStats(); st.WaitFailed != 1 || st.ShortLived != 1 {
		t.Errorf("stopped replica: stats %+v, want the NULL handled as a time-out, short-lived", st)
	}
}

// TestReplicaFenceTimeout checks what a fill does when the replica has
// not applied the position within MaxWait: read the primary, or, without
// one, read the replica and store the result with the short lifetime.
func TestReplicaFenceTimeout(t *testing.T) {
	e := newReplicaEnv(t)
	ctx := context.Background()
	withPrimary := newTestEnvAt(t, e.addr, nil, func(cfg *Config) {
		cfg.Replica = &ReplicaConfig{DB: e.Replica.Replica, Primary: e.Primary, SourceServerID: e.ServerID, MaxWait: 200 * time.Millisecond}
	})
	short := newTestEnvAt(t, e.addr, nil, func(cfg *Config) {
		cfg.Replica = &ReplicaConfig{DB: e.Replica.Replica, SourceServerID: e.ServerID, MaxWait: 200 * time.Millisecond, ShortLifetime: time.Second}
	})
	e.StopSQL(t)
	e.change(t, "INSERT INTO comments VALUES (4, 1, 1)")

	n, err := withPrimary.c.Count(ctx, "post-comments", Row{"post_id": 1})
	if err != nil || n != 3 {
		t.Errorf("timed out with a primary: %d, %v; want the primary's 3", n, err)
	}
	if st := withPrimary.c.ReplicaStats(); st.TimedOut != 1 || st.PrimaryReads != 1 || st.Reached != 0 {
		t.Errorf("stats with a primary %+v, want 1 timed out, read from the primary", st)
	}

	key := short.prefix + "tick"
	v, err := short.c.GetOrComputeFrom(ctx, key, 0, func(ctx context.Context, db *sql.Conn) ([]byte, error) {
		var n []byte
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM comments WHERE post_id = 1").Scan(&n)
		return n, err
	})
	if err != nil || string(v) != "2" {
		t.Fatalf("timed out without a primary: %q, %v; want the replica's 2", v, err)
	}
	if st := short.c.ReplicaStats(); st.TimedOut != 1 || st.ShortLived != 1 {
		t.Errorf("stats without a primary %+v, want 1 timed out, short-lived", st)
	}
	// The same for two values of one GetOrComputeMultiFrom call: one
	// wait, both short-lived.
	multi := []TurnstileKey{{Key: short.prefix + "multi:a"}, {Key: short.prefix + "multi:b", Expiration: time.Hour}}
	got, err := short.c.GetOrComputeMultiFrom(ctx, multi, func(ctx context.Context, db *sql.Conn, keys []string) ([][]byte, error) {
		values := make([][]byte, len(keys))
		for i := range keys {
			if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM comments WHERE post_id = 1").Scan(&values[i]); err != nil {
				return nil, err
			}
		}
		return values, nil
	})
	if err != nil || string(got[multi[0].Key]) != "2" || string(got[multi[1].Key]) != "2" {
		t.Fatalf("multi timed out without a primary: %q, %v; want the replica's 2 twice", got, err)
	}
	if st := short.c.ReplicaStats(); st.TimedOut != 2 || st.ShortLived != 2 {
		t.Errorf("stats without a primary after the multi %+v, want 2 timed out, short-lived", st)
	}
	// Asked to live forever (or an hour), the values live ShortLifetime
	// plus the compute time (docs/formats.md, "Values cached with
	// GetOrCompute").
	for _, key := range []string{key, multi[0].Key, multi[1].Key} {
		deadline := time.Now().Add(time.Minute)
		for {
			if _, ok := short.value(t, key); !ok {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the value %q filled from a lagging replica is still cached a minute later; want the short lifetime", key)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestReplicaFenceUnfenced checks the fallback to today's behaviour when
// there is no position item, and that a replica that cannot wait for
// the position (MASTER_POS_WAIT answers NULL on a server that is not a
// replica) is handled as one that is behind: its fill is short-lived.
func TestReplicaFenceUnfenced(t *testing.T) {
	e := newReplicaEnv(t)
	ctx := context.Background()
	env := newTestEnvAt(t, e.addr, nil, func(cfg *Config) {
		cfg.Replica = &ReplicaConfig{DB: e.Replica.Replica, SourceServerID: e.ServerID, MaxWait: 200 * time.Millisecond}
	})
	n, err := env.c.Count(ctx, "post-comments", Row{"post_id": 1})
	if err != nil || n != 2 {
		t.Fatalf("no position item: %d, %v", n, err)
	}
	if st := env.c.ReplicaStats(); st.Unfenced != 1 || st.Reached != 0 || st.TimedOut != 0 {
		t.Errorf("no position item: stats %+v, want 1 unfenced", st)
	}

	notReplica := newTestEnvAt(t, e.addr, nil, func(cfg *Config) {
		cfg.Replica = &ReplicaConfig{DB: e.Primary, SourceServerID: e.ServerID + 1, MaxWait: 200 * time.Millisecond}
	})
	mc := memcache.New(e.addr)
	pos := itemformat.SourcePosition{Binlog: itemformat.BinlogPosition{File: "mysql-bin.000001", Pos: 4}}
	if err := mc.Set(&memcache.Item{Key: itemformat.PositionKey(e.ServerID + 1), Value: pos.Encode()}); err != nil {
		t.Fatal(err)
	}
	if n, err := notReplica.c.Count(ctx, "post-comments", Row{"post_id": 2}); err != nil || n != 1 {
		t.Fatalf("not a replica: %d, %v", n, err)
	}
	if st := notReplica.c.ReplicaStats(); st.WaitFailed != 1 || st.TimedOut != 1 || st.ShortLived != 1 || st.Unfenced != 0 {
		t.Errorf("not a replica: stats %+v, want 1 failed wait, handled as a time-out: short-lived", st)
	}
}

func TestReplicaConfigChecked(t *testing.T) {
	db := &sql.DB{}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no DB", Config{Replica: &ReplicaConfig{SourceServerID: 1}}, "Replica.DB is nil"},
		{"compute time within the wait", Config{Replica: &ReplicaConfig{DB: db, SourceServerID: 1, MaxWait: 3 * time.Second},
			Turnstile: TurnstileOptions{ComputeTime: 2 * time.Second}}, "must exceed Replica.MaxWait"},
	} {
		c.cfg.Servers = []itemformat.Server{{Addr: "127.0.0.1:1"}}
		c.cfg.Rules = mustRules(t)
		_, err := New(c.cfg, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
	}
	c, err := New(Config{Servers: []itemformat.Server{{Addr: "127.0.0.1:1"}}, Rules: mustRules(t),
		Replica: &ReplicaConfig{DB: db, SourceServerID: 1, MaxWait: 3 * time.Second}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.cfg.Turnstile.ComputeTime; got != 5*time.Second {
		t.Errorf("default compute time with a 3s wait = %v, want 5s", got)
	}
}

func mustRules(t *testing.T) *rules.RuleSet {
	t.Helper()
	rs, err := rulefile.Parse("client-test.yaml", []byte(strings.ReplaceAll(testRules, "%PREFIX%", "cwtest:")))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
