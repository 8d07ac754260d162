package cacheops

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-sql-driver/mysql"
)

func TestRetryable(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"canceled", context.Canceled, false},
		{"wrapped canceled", fmt.Errorf("cacheops: append %q: %w", "k", context.Canceled), false},
		{"deadline", context.DeadlineExceeded, true},
		{"invalid key", fmt.Errorf("cacheops: bump %q: %w", "a b", ErrInvalidKey), false},
		{"invalid op", ErrInvalidOp, false},
		{"malformed key", memcache.ErrMalformedKey, false},
		{"too large sentinel", ErrTooLarge, false},
		{"too large from the client", errors.New(`memcache: unexpected response line from "append": "SERVER_ERROR object too large for cache\r\n"`), false},
		{"out of memory", errors.New(`memcache: unexpected response line from "add": "SERVER_ERROR out of memory storing object\r\n"`), true},
		{"client error", errors.New("memcache: client error: cannot increment or decrement non-numeric value"), false},
		{"cache miss", memcache.ErrCacheMiss, true},
		{"not stored", memcache.ErrNotStored, true},
		{"cas conflict", memcache.ErrCASConflict, true},
		{"no servers", memcache.ErrNoServers, true},
		{"server error", memcache.ErrServerError, true},
		{"connect timeout", &memcache.ConnectTimeoutError{Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}}, true},
		{"eof", io.EOF, true},
		{"unexpected eof", fmt.Errorf("read: %w", io.ErrUnexpectedEOF), true},
		{"refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{"reset errno", fmt.Errorf("x: %w", syscall.ECONNRESET), true},
		{"bad conn", driver.ErrBadConn, true},
		{"invalid conn", mysql.ErrInvalidConn, true},
		{"deadlock", &mysql.MySQLError{Number: 1213, Message: "Deadlock found"}, true},
		{"lock wait", fmt.Errorf("load: %w", &mysql.MySQLError{Number: 1205}), true},
		{"too many connections", &mysql.MySQLError{Number: 1040}, true},
		{"read only", &mysql.MySQLError{Number: 1290}, true},
		{"syntax", &mysql.MySQLError{Number: 1064, Message: "syntax"}, false},
		{"unknown table", &mysql.MySQLError{Number: 1146}, false},
		{"access denied", &mysql.MySQLError{Number: 1045}, false},
		{"unknown", errors.New("something new"), true},
		{"join all transient", errors.Join(memcache.ErrNoServers, io.EOF), true},
		{"join with a permanent one", errors.Join(io.EOF, fmt.Errorf("x: %w", ErrInvalidKey)), false},
		{"wrapped join with a permanent one", fmt.Errorf("batch: %w", errors.Join(io.EOF, ErrInvalidOp)), false},
		{"apply error transient", &ApplyError{Ops: 3, Errs: []error{io.EOF, memcache.ErrNoServers}}, true},
		{"apply error permanent", &ApplyError{Ops: 3, Errs: []error{io.EOF, ErrInvalidOp}}, false},
	}
	for _, tc := range tests {
		if got := Retryable(tc.err); got != tc.want {
			t.Errorf("%s: Retryable(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}

// closedPort returns a loopback address on which nothing listens.
func closedPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// TestRetryableRealErrors classifies the errors the real clients return
// when the service is down or the query is wrong.
func TestRetryableRealErrors(t *testing.T) {
	mc := memcache.New(closedPort(t))
	_, err := mc.Increment("k", 1)
	if err == nil || !Retryable(err) {
		t.Errorf("memcached down: Retryable(%v) = false, want true", err)
	}

	db, err := sql.Open("mysql", "root@tcp("+closedPort(t)+")/none?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = db.QueryContext(ctx, "SELECT 1")
	if err == nil || !Retryable(err) {
		t.Errorf("MySQL down: Retryable(%v) = false, want true", err)
	}
}
