package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// testLease is the lease duration of the tests: short, so takeovers are
// quick; the deadlines below are generous multiples of it.
const testLease = 2 * time.Second

// patience bounds every wait of these tests: far above what they take on
// an idle machine (a few leases), so a loaded one does not fail them.
const patience = 60 * time.Second

// leaseServer returns the DSN of a fresh database on the binlog server
// (127.0.0.1:3307 in the services) and a unique lease name.
func leaseServer(t *testing.T) (dsn, name string) {
	t.Helper()
	_, dsn = testsvc.MySQLBinlog(t)
	return dsn, "t" + testsvc.Unique()
}

// newTestLease opens its own *sql.DB, as another process would, and a
// Lease on name; the lease is released when the test ends.
func newTestLease(t *testing.T, dsn, name string) *Lease {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	l, err := NewLease(db, LeaseConfig{Name: name, Duration: testLease}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		l.Release(ctx)
		db.Close()
	})
	return l
}

func mustTryAcquire(t *testing.T, l *Lease, want bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	got, err := l.TryAcquire(ctx)
	if err != nil {
		t.Fatalf("TryAcquire: %v", err)
	}
	if got != want {
		t.Fatalf("TryAcquire = %v, want %v", got, want)
	}
}

// standby runs b.Acquire in the background; the channel yields its error.
func standby(b *Lease) (<-chan error, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	done := make(chan error, 1)
	go func() { done <- b.Acquire(ctx) }()
	return done, cancel
}

// keep runs a.Keep in the background; the channel yields its error.
func keep(t *testing.T, a *Lease) <-chan error {
	ctx, cancel := context.WithCancel(context.Background())
	done, finished := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(finished)
		done <- a.Keep(ctx)
	}()
	t.Cleanup(func() { cancel(); <-finished })
	return done
}

func waitErr(t *testing.T, what string, ch <-chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(patience):
		t.Fatalf("%s: nothing after %v", what, patience)
		return nil
	}
}

func TestLeaseOneActive(t *testing.T) {
	dsn, name := leaseServer(t)
	a, b := newTestLease(t, dsn, name), newTestLease(t, dsn, name)
	mustTryAcquire(t, a, true)
	mustTryAcquire(t, b, false)
	mustTryAcquire(t, a, true)
	if ok, _ := a.Held(); !ok {
		t.Errorf("a.Held() = false after acquiring")
	}
	if ok, _ := b.Held(); ok {
		t.Errorf("b.Held() = true while a holds the lock")
	}
	// A different name is another lock.
	mustTryAcquire(t, newTestLease(t, dsn, name+"x"), true)
	// Released, the lock goes to the standby.
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if ok, _ := a.Held(); ok {
		t.Errorf("a.Held() = true after Release")
	}
	mustTryAcquire(t, b, true)
}

func TestLeaseKilledConnection(t *testing.T) {
	dsn, name := leaseServer(t)
	a, b := newTestLease(t, dsn, name), newTestLease(t, dsn, name)
	mustTryAcquire(t, a, true)
	kept := keep(t, a)
	acquired, cancel := standby(b)
	defer cancel()

	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	a.connMu.Lock()
	id := a.connID
	a.connMu.Unlock()
	killed := time.Now()
	if _, err := admin.Exec(fmt.Sprintf("KILL CONNECTION %d", id)); err != nil {
		t.Fatalf("kill the holder's connection %d: %v", id, err)
	}
	if err := waitErr(t, "standby", acquired); err != nil {
		t.Fatalf("standby Acquire: %v", err)
	}
	t.Logf("standby active %v after the kill (lease %v)", time.Since(killed).Round(time.Millisecond), testLease)
	if ok, _ := b.Held(); !ok {
		t.Errorf("b.Held() = false after Acquire")
	}
	err = waitErr(t, "old holder's Keep", kept)
	if !errors.Is(err, ErrLeaseLost) || !strings.Contains(err.Error(), a.LockName()) {
		t.Errorf("old holder's Keep = %v, want ErrLeaseLost naming %s", err, a.LockName())
	}
	if ok, age := a.Held(); ok {
		t.Errorf("old holder's Held() = true (age %v) after losing the lock", age)
	}
}

func TestLeaseFrozenHolder(t *testing.T) {
	dsn, name := leaseServer(t)
	a, b := newTestLease(t, dsn, name), newTestLease(t, dsn, name)
	paused, resume := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a.beforeConfirm = func() {
		once.Do(func() { close(paused) })
		<-resume
	}
	mustTryAcquire(t, a, true)
	kept := keep(t, a)
	var resumed sync.Once
	unfreeze := func() { resumed.Do(func() { close(resume) }) }
	t.Cleanup(unfreeze) // runs before keep's cleanup waits for Keep
	<-paused
	frozen := time.Now()
	acquired, cancel := standby(b)
	defer cancel()
	if err := waitErr(t, "standby", acquired); err != nil {
		t.Fatalf("standby Acquire: %v", err)
	}
	// The moment the standby holds the lock, the frozen holder must not
	// think it does: the server dropped it one wait_timeout after its
	// last query, and Held expires before that.
	ok, age := a.Held()
	t.Logf("standby active %v after the holder froze; holder's last confirmation %v old", time.Since(frozen).Round(time.Millisecond), age.Round(time.Millisecond))
	if ok {
		t.Fatalf("frozen holder's Held() = true (age %v) while the standby holds the lock", age)
	}
	unfreeze()
	err := waitErr(t, "resumed holder's Keep", kept)
	if !errors.Is(err, ErrLeaseLost) {
		t.Errorf("resumed holder's Keep = %v, want ErrLeaseLost", err)
	}
	if ok, _ := a.Held(); ok {
		t.Errorf("resumed holder's Held() = true")
	}
	if ok, _ := b.Held(); !ok {
		t.Errorf("standby's Held() = false")
	}
}

func TestLeaseKeepReleasesOnCancel(t *testing.T) {
	dsn, name := leaseServer(t)
	a, b := newTestLease(t, dsn, name), newTestLease(t, dsn, name)
	mustTryAcquire(t, a, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Keep(ctx) }()
	cancel()
	if err := waitErr(t, "Keep", done); err != nil {
		t.Fatalf("Keep after cancel = %v, want nil", err)
	}
	mustTryAcquire(t, b, true)
	if err := a.Keep(context.Background()); !errors.Is(err, ErrNotHeld) {
		t.Errorf("Keep without the lease = %v, want ErrNotHeld", err)
	}
}

func TestLeaseConfig(t *testing.T) {
	db, err := sql.Open("mysql", "nobody@tcp(127.0.0.1:1)/")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	max := strings.Repeat("n", maxLockName-len(LockPrefix))
	for _, tc := range []struct {
		cfg     LeaseConfig
		wantErr string // "" for none
	}{
		{LeaseConfig{Name: "orders"}, ""},
		{LeaseConfig{Name: max}, ""},
		{LeaseConfig{Name: max + "n"}, "MySQL allows at most 64"},
		{LeaseConfig{Name: "é" + max[1:]}, "MySQL allows at most 64"}, // 65 bytes, 64 characters
		{LeaseConfig{}, "name is empty"},
		{LeaseConfig{Name: "orders", Duration: time.Second}, "below the minimum 2s"},
	} {
		l, err := NewLease(db, tc.cfg, nil)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("NewLease(%+v): %v", tc.cfg, err)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("NewLease(%+v) = %v, want an error saying %q", tc.cfg, err, tc.wantErr)
		case err == nil && l.LockName() != LockPrefix+tc.cfg.Name:
			t.Errorf("LockName() = %q", l.LockName())
		}
	}
	for _, tc := range []struct {
		dur  time.Duration
		wait int
	}{{0, 10}, {2 * time.Second, 2}, {2100 * time.Millisecond, 3}, {30 * time.Second, 30}} {
		l, err := NewLease(db, LeaseConfig{Name: "d", Duration: tc.dur}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if l.waitTO != tc.wait {
			t.Errorf("duration %v: wait_timeout %d s, want %d", tc.dur, l.waitTO, tc.wait)
		}
		if m := l.dur - l.valid(); m <= 0 || m >= l.interval() {
			t.Errorf("duration %v: margin %v, want above 0 and below the confirmation interval %v", tc.dur, m, l.interval())
		}
	}
}
