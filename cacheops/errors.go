package cacheops

import (
	"context"
	"database/sql/driver"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"
	"syscall"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
)

var (
	// ErrInvalidKey means a key is empty, longer than 250 bytes or holds a
	// byte memcached does not allow (<= 0x20 or 0x7f). Such a key is never
	// sent. It is itemformat.ErrInvalidKey (itemformat.CheckKey).
	ErrInvalidKey = itemformat.ErrInvalidKey
	// ErrInvalidOp means an op cannot be applied by the Applier: a kind it
	// does not handle, a missing rule, or malformed set tokens.
	ErrInvalidOp = errors.New("invalid cache op")
	// ErrTooLarge means memcached refused a value because it exceeds its
	// item size limit (SERVER_ERROR object too large for cache). It is
	// metaproto.ErrTooLarge.
	ErrTooLarge = metaproto.ErrTooLarge
)

// Retryable reports whether an operation that failed with err may succeed
// when tried again unchanged, so that the caller should back off and retry
// (holding back its commit) rather than give up on the op. It is the one
// place that decides this, for errors from memcached, MySQL and the
// network, including errors returned by Applier.Apply.
//
// An error that joins several (errors.Join, Apply's error) is retryable
// when every one of them is. An error nobody recognises counts as
// retryable: giving up on a cache op leaves a stale cache, waiting only
// delays, so only errors that can never succeed on a retry are permanent.
func Retryable(err error) bool {
	if err == nil {
		return false
	}
	for err != nil {
		if multi, ok := err.(interface{ Unwrap() []error }); ok {
			errs := multi.Unwrap()
			for _, e := range errs {
				if e != nil && !Retryable(e) {
					return false
				}
			}
			return true
		}
		if decided, retry := classifyRetry(err); decided {
			return retry
		}
		err = errors.Unwrap(err)
	}
	return true
}

// classifyRetry decides for one error of a chain, without looking at what it
// wraps; decided is false when the wrapped errors must decide.
func classifyRetry(err error) (decided, retry bool) {
	switch err {
	case context.Canceled, ErrWriteRefused:
		// The caller gave up (shutdown, rebalance) or its guard refused
		// the write (WithGuard); whether to start over is its decision,
		// not a property of the op.
		return true, false
	case context.DeadlineExceeded:
		// A timeout: the service was slow or unreachable this time.
		return true, true
	case ErrInvalidKey, ErrInvalidOp, itemformat.ErrInvalidTokens, metaproto.ErrRejected, memcache.ErrMalformedKey:
		// The op itself is wrong; it would be refused again.
		return true, false
	case ErrTooLarge:
		// The same bytes exceed the same item size limit again.
		return true, false
	case memcache.ErrCacheMiss, memcache.ErrNotStored, memcache.ErrCASConflict:
		// A race with another writer or an eviction that the op did not
		// resolve in its bounded attempts; applying it again converges.
		return true, true
	case memcache.ErrNoServers:
		// No server is configured or reachable right now.
		return true, true
	case memcache.ErrServerError:
		// SERVER_ERROR: memcached could not serve the request this time
		// (out of memory and the like).
		return true, true
	case io.EOF, io.ErrUnexpectedEOF:
		// The peer closed the connection in the middle of an exchange.
		return true, true
	case driver.ErrBadConn:
		// A broken database connection; a new one may work. (The MySQL
		// driver's ErrInvalidConn is not recognised by name: unknown
		// errors are retryable anyway.)
		return true, true
	}
	if number, ok := mysqlServerErrorNumber(err); ok {
		return true, mysqlErrorTransient(number)
	}
	switch e := err.(type) {
	case *memcache.ConnectTimeoutError:
		// memcached did not accept the connection in time.
		return true, true
	case syscall.Errno:
		switch e {
		case syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.ECONNABORTED, syscall.EPIPE,
			syscall.ETIMEDOUT, syscall.EHOSTUNREACH, syscall.ENETUNREACH, syscall.ENETDOWN:
			// The server is down or the network is: it may come back.
			return true, true
		}
		return false, false
	case net.Error:
		// Refused, reset and timed-out connections, DNS failures: the
		// server or the network may come back.
		return true, true
	}
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "memcache: client error: "):
		// CLIENT_ERROR answers a request memcached considers wrong, such
		// as incr of a non-numeric value; the same request fails again.
		return true, false
	case strings.Contains(msg, "SERVER_ERROR object too large"):
		// Reported by the client as an unexpected response line.
		return true, false
	case strings.Contains(msg, "SERVER_ERROR"):
		// Any other SERVER_ERROR (out of memory storing object, ...) is a
		// temporary condition of the server.
		return true, true
	}
	return false, false
}

// mysqlDriverPackage is the import path of the MySQL driver whose server
// errors Retryable classifies.
const mysqlDriverPackage = "github.com/go-sql-driver/mysql"

// mysqlServerErrorNumber returns the error number of a MySQL server error
// (the driver's *mysql.MySQLError). cacheops does not import the driver:
// applications import cacheops through the client package, which must not
// link a SQL driver. So the error is recognised by its type's package and
// name and its Number field, which the driver has kept since its first
// release; the tests classify real driver errors.
func mysqlServerErrorNumber(err error) (uint16, bool) {
	v := reflect.ValueOf(err)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return 0, false
	}
	v = v.Elem()
	t := v.Type()
	if t.Kind() != reflect.Struct || t.Name() != "MySQLError" || t.PkgPath() != mysqlDriverPackage {
		return 0, false
	}
	f := v.FieldByName("Number")
	if !f.IsValid() || f.Kind() != reflect.Uint16 {
		return 0, false
	}
	return uint16(f.Uint()), true
}

// mysqlErrorTransient reports whether a MySQL/MariaDB server error number names
// a condition that passes; every other server error (syntax, unknown table
// or column, access denied, ...) recurs on a retry.
func mysqlErrorTransient(number uint16) bool {
	switch number {
	case 1040, // ER_CON_COUNT_ERROR: too many connections
		1053, // ER_SERVER_SHUTDOWN: server shutdown in progress
		1159, // ER_NET_READ_INTERRUPTED: timeout reading communication packets
		1161, // ER_NET_WRITE_INTERRUPTED: timeout writing communication packets
		1205, // ER_LOCK_WAIT_TIMEOUT
		1213, // ER_LOCK_DEADLOCK
		1290, // ER_OPTION_PREVENTS_STATEMENT: --read-only, typically during a failover
		1317, // ER_QUERY_INTERRUPTED: the query was killed
		1927, // ER_CONNECTION_KILLED (MariaDB)
		1969, // ER_STATEMENT_TIMEOUT (MariaDB max_statement_time)
		3024: // ER_QUERY_TIMEOUT (MySQL max_execution_time)
		return true
	}
	return false
}

// isItemTooLarge reports whether memcached refused a store because the value
// exceeds its item size limit. The client reports that answer only as an
// unexpected response line, so its text is matched.
func isItemTooLarge(err error) bool {
	return err != nil && (errors.Is(err, ErrTooLarge) || strings.Contains(err.Error(), "SERVER_ERROR object too large"))
}

// isMemcachedClientError reports whether memcached answered CLIENT_ERROR.
func isMemcachedClientError(err error) bool {
	return err != nil && strings.Contains(err.Error(), "memcache: client error: ")
}
