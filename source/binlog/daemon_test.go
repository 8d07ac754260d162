package binlog

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// daemonRig is a pipeline over the test memcached with rules of the
// fixture's database, and daemons reading the fixture's server.
type daemonRig struct {
	t      *testing.T
	f      *fixture
	prefix string
	mc     *memcache.Client
	reg    *prometheus.Registry
	p      *pipeline.Pipeline
	logs   *testsvc.LogBuffer
	log    *slog.Logger
}

func newDaemonRig(t *testing.T) *daemonRig {
	t.Helper()
	f := newFixture(t)
	f.exec(t, "CREATE TABLE users (id BIGINT PRIMARY KEY, name VARCHAR(40))",
		"CREATE TABLE comments (id BIGINT PRIMARY KEY, post_id BIGINT)")
	r := &daemonRig{t: t, f: f, prefix: "cwbl:" + testsvc.Unique() + ":", reg: prometheus.NewRegistry(), logs: &testsvc.LogBuffer{}}
	r.log = slog.New(slog.NewTextHandler(r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", r.logs.String())
		}
	})
	yaml := fmt.Sprintf(`version: 1
prefix: %q
fallback: "ns:table:{db}.{table}"
rules:
  - name: user-profile
    table: %s.users
    bump: "ns:user:{id}"
  - name: comment
    table: %s.comments
    bump: "ns:comment:{id}"
    rebump_after: 1m
`, r.prefix, f.name, f.name)
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	rs, err := rulefile.LoadPaths(path)
	if err != nil {
		t.Fatal(err)
	}
	r.mc = memcache.New(testsvc.Memcached(t))
	w := cacheops.NewTextApplier(r.mc, nil, nil, cacheops.Config{MaxConcurrency: 8}, r.log)
	pm := pipeline.NewMetrics(r.reg)
	r.p, err = pipeline.New(pipeline.Config{Rules: rs, Writer: w, Metrics: pm, Logger: r.log,
		RetryMin: 10 * time.Millisecond, RetryMax: 100 * time.Millisecond, Rebump: pipeline.NewRebumper(w, pm, r.log)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// daemon starts a daemon named name; stop cancels it and waits for Run.
func (r *daemonRig) daemon(name string, lease time.Duration) (*Daemon, func()) {
	r.t.Helper()
	return r.daemonFrom(name, lease, Start{})
}

// daemonFrom is daemon reading from start when no checkpoint exists.
func (r *daemonRig) daemonFrom(name string, lease time.Duration, start Start) (*Daemon, func()) {
	r.t.Helper()
	h, err := pipeline.NewHealth(pipeline.HealthConfig{Memcached: r.mc, Interval: 50 * time.Millisecond, Logger: r.log})
	if err != nil {
		r.t.Fatal(err)
	}
	d, err := NewDaemon(DaemonConfig{
		Stream:     Config{DSN: r.f.dsn, ServerID: randomServerID(), Start: start},
		Lease:      LeaseConfig{Name: name, Duration: lease},
		Checkpoint: CheckpointConfig{Database: r.f.name, Name: name},
		MaxEvents:  100,
	}, Deps{Pipeline: r.p, Health: h, Source: r.f.db, Logger: r.log})
	if err != nil {
		r.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					r.t.Errorf("Run: %v", err)
				}
			case <-time.After(waitBound):
				r.t.Errorf("Run did not return after cancel")
			}
		})
	}
	r.t.Cleanup(stop)
	return d, stop
}

func (r *daemonRig) get(key string) string {
	it, err := r.mc.Get(r.prefix + key)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	return string(it.Value)
}

func (r *daemonRig) set(key, value string) {
	r.t.Helper()
	if err := r.mc.Set(&memcache.Item{Key: r.prefix + key, Value: []byte(value)}); err != nil {
		r.t.Fatal(err)
	}
}

// waitFor polls cond until it returns "" or waitBound passes.
func waitFor(t *testing.T, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", waitBound, msg)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (r *daemonRig) waitValue(key, want string) {
	r.t.Helper()
	waitFor(r.t, func() string {
		if got := r.get(key); got != want {
			return fmt.Sprintf("%s = %q, want %q", key, got, want)
		}
		return ""
	})
}

// checkpoint returns the saved position of the checkpoint name.
func (r *daemonRig) checkpoint(name string) string {
	var pos string
	q := "SELECT position FROM " + quoteIdent(r.f.name) + "." + quoteIdent(DefaultCheckpointTable) + " WHERE name = ?"
	if err := r.f.db.QueryRow(q, name).Scan(&pos); err != nil {
		return "<" + err.Error() + ">"
	}
	return pos
}

// TestDaemonAppliesCommits: committed transactions reach memcached in
// commit order, a rolled-back one never does, and the checkpoint follows
// what was applied; a restarted daemon resumes from it without applying
// anything twice.
func TestDaemonAppliesCommits(t *testing.T) {
	r := newDaemonRig(t)
	r.set("ns:user:1", "10")
	r.set("ns:user:2", "20")
	name := "t" + testsvc.Unique()
	d, stop := r.daemon(name, 2*time.Second)
	waitFor(t, func() string {
		if !strings.HasPrefix(r.checkpoint(name), "gtid:") && !strings.HasPrefix(r.checkpoint(name), "file:") {
			if d.active.Load() {
				return ""
			}
			return "daemon not active"
		}
		return ""
	})
	time.Sleep(200 * time.Millisecond) // the stream is open once active
	r.f.tx(t, true, "INSERT INTO users VALUES (1, 'a')", "UPDATE users SET name = 'b' WHERE id = 1")
	r.f.tx(t, false, "INSERT INTO users VALUES (2, 'rolled back')")
	r.f.tx(t, true, "INSERT INTO comments VALUES (7, 1)")
	r.f.tx(t, true, "INSERT INTO users VALUES (2, 'c')")
	r.waitValue("ns:user:2", "21")
	if got := r.get("ns:user:1"); got != "11" {
		t.Errorf("ns:user:1 = %q, want 11: the two changes of one transaction coalesce into one bump", got)
	}
	saved := r.checkpoint(name)
	if saved == "" || strings.HasPrefix(saved, "<") {
		t.Fatalf("checkpoint after applying: %q", saved)
	}
	if !d.Ready() {
		t.Errorf("not ready while reading: %v", d.NotReady())
	}
	stop()

	// A new daemon of the same name resumes after the checkpoint.
	r.f.tx(t, true, "UPDATE users SET name = 'd' WHERE id = 2")
	_, stop2 := r.daemon(name, 2*time.Second)
	r.waitValue("ns:user:2", "22")
	stop2()
	if got := r.get("ns:user:1"); got != "11" {
		t.Errorf("ns:user:1 = %q after the restart, want 11: nothing applied twice", got)
	}
}

// TestDaemonStandbyTakesOver: of two daemons sharing a name one applies;
// when it stops, the other takes over from the checkpoint.
func TestDaemonStandbyTakesOver(t *testing.T) {
	r := newDaemonRig(t)
	r.set("ns:user:5", "50")
	name := "t" + testsvc.Unique()
	a, stopA := r.daemon(name, 2*time.Second)
	waitFor(t, func() string {
		if !a.active.Load() {
			return "first daemon not active"
		}
		return ""
	})
	b, _ := r.daemon(name, 2*time.Second)
	time.Sleep(300 * time.Millisecond)
	if b.active.Load() {
		t.Fatal("both daemons active")
	}
	r.f.tx(t, true, "INSERT INTO users VALUES (5, 'x')")
	r.waitValue("ns:user:5", "51")
	stopA()
	waitFor(t, func() string {
		if !b.active.Load() {
			return "standby did not take over"
		}
		return ""
	})
	r.f.tx(t, true, "UPDATE users SET name = 'y' WHERE id = 5")
	r.waitValue("ns:user:5", "52")
}

// TestDaemonLeaseLostWhileIdle: when the active's lease connection is
// killed while the log is idle, it stops being active (and a standby
// takes over) without waiting for a write to be refused.
func TestDaemonLeaseLostWhileIdle(t *testing.T) {
	r := newDaemonRig(t)
	name := "t" + testsvc.Unique()
	a, _ := r.daemon(name, 2*time.Second)
	waitFor(t, func() string {
		if !a.active.Load() {
			return "first daemon not active"
		}
		return ""
	})
	b, _ := r.daemon(name, 2*time.Second)
	a.lease.connMu.Lock()
	id := a.lease.connID
	a.lease.connMu.Unlock()
	if _, err := r.f.db.Exec("KILL CONNECTION ?", id); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() string {
		if a.active.Load() || !b.active.Load() {
			return fmt.Sprintf("first active %v, second active %v; want the second only", a.active.Load(), b.active.Load())
		}
		return ""
	})
	r.set("ns:user:8", "80")
	r.f.tx(t, true, "INSERT INTO users VALUES (8, 'x')")
	r.waitValue("ns:user:8", "81")
}

// current returns the server's current position.
func (r *daemonRig) current() Start {
	r.t.Helper()
	st, err := currentStart(context.Background(), r.f.db, "")
	if err != nil {
		r.t.Fatal(err)
	}
	return st
}

// TestDaemonStartsAtConfiguredStart: with no checkpoint, the daemon reads
// from the configured start (binlog.start), not from the server's current
// position: a change committed before it runs is applied.
func TestDaemonStartsAtConfiguredStart(t *testing.T) {
	r := newDaemonRig(t)
	r.set("ns:user:3", "30")
	start := r.current()
	r.f.tx(t, true, "INSERT INTO users VALUES (3, 'before the daemon')")
	r.daemonFrom("t"+testsvc.Unique(), 2*time.Second, start)
	r.waitValue("ns:user:3", "31")
}

// TestDaemonFlushesDelayedBumpsOnStop: a daemon stopped gracefully
// applies the delayed second bumps still pending before it releases the
// lease (the write guard refuses them after).
func TestDaemonFlushesDelayedBumpsOnStop(t *testing.T) {
	r := newDaemonRig(t)
	r.set("ns:comment:4", "40")
	start := r.current()
	_, stop := r.daemonFrom("t"+testsvc.Unique(), 2*time.Second, start)
	r.f.tx(t, true, "INSERT INTO comments VALUES (4, 1)")
	r.waitValue("ns:comment:4", "41")
	stop()
	if got := r.get("ns:comment:4"); got != "42" {
		t.Errorf("ns:comment:4 = %q after a graceful stop, want 42: the pending second bump (rebump_after 1m) is applied at the stop", got)
	}
}
