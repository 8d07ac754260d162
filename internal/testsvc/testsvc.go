// Package testsvc finds the real services that cachewarden's tests talk to.
//
// Each service is looked up in this order:
//  1. an environment variable with its address (CACHEWARDEN_TEST_MEMCACHED,
//     CACHEWARDEN_TEST_MYSQL_DSN, CACHEWARDEN_TEST_MYSQL_BINLOG_DSN,
//     CACHEWARDEN_TEST_MYSQL_BINLOG2_DSN, CACHEWARDEN_TEST_KAFKA), which
//     scripts/services.sh and `make test` set;
//  2. a container started with testcontainers-go, when a Docker engine
//     answers (and CACHEWARDEN_TEST_CONTAINERS is not "0");
//  3. none: the test fails when CI=true, and is skipped with a hint
//     otherwise.
//
// Kafka is special: with neither an address nor Docker the caller starts an
// in-process Kafka-protocol broker (see integration), so Kafka() only
// reports what the environment or Docker provides and returns nil
// otherwise. Its container runs confluentinc/confluent-local (Kafka in KRaft
// mode, one node that is both broker and controller) through
// github.com/testcontainers/testcontainers-go/modules/kafka.
//
// Containers are started at most once per test binary and are reused by
// every test in it; the helpers are safe for concurrent use.
//
// A test that stops, freezes or flushes memcached starts one of its own
// with PrivateMemcached instead of using the shared one; a test that needs
// topics gets its brokers from KafkaTopics (Kafka's, or an in-process
// broker's).
//
// Only tests import it: it is not the integration harness (package
// integration), which takes service addresses from its callers.
package testsvc

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/testcontainers/testcontainers-go"
	tckafka "github.com/testcontainers/testcontainers-go/modules/kafka"
	"github.com/testcontainers/testcontainers-go/wait"
)

const hint = "start the services with `make services` (scripts/services.sh) and export the lines it prints, or run `make test`"

// missing fails under CI and skips otherwise.
func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not available; CI requires it: %s", what, hint)
	}
	t.Skipf("%s is not available: %s", what, hint)
}

type containerOnce struct {
	once sync.Once
	addr string
	err  error
}

var (
	memcachedContainer containerOnce
	mysqlContainer     containerOnce
	kafkaContainer     struct {
		once    sync.Once
		brokers []string
		err     error
	}
)

// kafkaImage is the image of the Kafka container: the module's starter
// script needs a Confluent image, and KRaft mode needs 7.4.0 or later.
const kafkaImage = "confluentinc/confluent-local:7.5.0"

func dockerAvailable() bool {
	if os.Getenv("CACHEWARDEN_TEST_CONTAINERS") == "0" {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	p, err := testcontainers.NewDockerProvider()
	if err != nil {
		return false
	}
	defer p.Close()
	return p.Health(ctx) == nil
}

func startContainer(req testcontainers.ContainerRequest, port string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := testcontainers.GenericContainer(ctx, testcontainers.GenericContainerRequest{ContainerRequest: req, Started: true})
	if err != nil {
		return "", err
	}
	host, err := c.Host(ctx)
	if err != nil {
		return "", err
	}
	p, err := c.MappedPort(ctx, port)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s:%s", host, p.Port()), nil
}

// Memcached returns the host:port of a memcached server.
func Memcached(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("CACHEWARDEN_TEST_MEMCACHED"); addr != "" {
		return addr
	}
	if dockerAvailable() {
		memcachedContainer.once.Do(func() {
			memcachedContainer.addr, memcachedContainer.err = startContainer(testcontainers.ContainerRequest{
				Image:        "memcached:1.6-alpine",
				ExposedPorts: []string{"11211/tcp"},
				WaitingFor:   wait.ForListeningPort("11211/tcp"),
			}, "11211/tcp")
		})
		if memcachedContainer.err != nil {
			t.Fatalf("testsvc: memcached container: %v", memcachedContainer.err)
		}
		return memcachedContainer.addr
	}
	missing(t, "memcached (CACHEWARDEN_TEST_MEMCACHED)")
	return ""
}

// MySQLDSN returns a go-sql-driver DSN with no database name, for a user
// that may create databases.
func MySQLDSN(t testing.TB) string {
	t.Helper()
	if dsn := os.Getenv("CACHEWARDEN_TEST_MYSQL_DSN"); dsn != "" {
		return dsn
	}
	if dockerAvailable() {
		mysqlContainer.once.Do(func() {
			var addr string
			addr, mysqlContainer.err = startContainer(testcontainers.ContainerRequest{
				Image:        "mariadb:11",
				ExposedPorts: []string{"3306/tcp"},
				Env:          map[string]string{"MARIADB_ALLOW_EMPTY_ROOT_PASSWORD": "1"},
				Cmd:          []string{"--log-bin=mysql-bin", "--binlog-format=ROW", "--server-id=1"},
				WaitingFor:   wait.ForLog("ready for connections").WithOccurrence(2).WithStartupTimeout(2 * time.Minute),
			}, "3306/tcp")
			mysqlContainer.addr = "root@tcp(" + addr + ")/"
		})
		if mysqlContainer.err != nil {
			t.Fatalf("testsvc: MariaDB container: %v", mysqlContainer.err)
		}
		return mysqlContainer.addr
	}
	missing(t, "MySQL/MariaDB (CACHEWARDEN_TEST_MYSQL_DSN)")
	return ""
}

// Kafka returns Kafka bootstrap addresses: those of CACHEWARDEN_TEST_KAFKA
// (comma separated), else those of KafkaContainer's container when a
// Docker engine answers, else nil, meaning the caller should start an
// in-process broker. Having no test to fail, it panics when the container
// does not start: falling back to the in-process broker would hide that.
func Kafka() []string {
	if v := os.Getenv("CACHEWARDEN_TEST_KAFKA"); v != "" {
		return strings.Split(v, ",")
	}
	if !dockerAvailable() {
		return nil
	}
	brokers, err := startKafka()
	if err != nil {
		panic(fmt.Sprintf("testsvc: Kafka container: %v", err))
	}
	return brokers
}

// KafkaContainer returns the bootstrap addresses of a single-node Kafka
// (KRaft mode) running in a container, or nil when no Docker engine
// answers or CACHEWARDEN_TEST_CONTAINERS is "0". The container is started
// by the first call (image pull included, within three minutes) and
// shared by every later one; when it does not start, the test fails.
func KafkaContainer(t testing.TB) []string {
	t.Helper()
	if !dockerAvailable() {
		return nil
	}
	brokers, err := startKafka()
	if err != nil {
		t.Fatalf("testsvc: Kafka container: %v", err)
	}
	return brokers
}

// startKafka starts the Kafka container once per test binary and returns
// its bootstrap addresses, or the error that stopped it.
func startKafka() ([]string, error) {
	kafkaContainer.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		// Run waits until the broker has left recovery and is serving.
		// A container that started but failed later is removed here;
		// a running one lives until the test binary exits.
		c, err := tckafka.Run(ctx, kafkaImage)
		if err != nil {
			kafkaContainer.err = errors.Join(err, testcontainers.TerminateContainer(c))
			return
		}
		brokers, err := c.Brokers(ctx)
		if err != nil {
			kafkaContainer.err = errors.Join(fmt.Errorf("broker addresses: %w", err), testcontainers.TerminateContainer(c))
			return
		}
		kafkaContainer.brokers = brokers
	})
	return append([]string(nil), kafkaContainer.brokers...), kafkaContainer.err
}

// MySQL creates a fresh database for the test, dropped when it ends, and
// returns a handle to it and its DSN.
func MySQL(t testing.TB) (*sql.DB, string) {
	t.Helper()
	return freshDatabase(t, MySQLDSN(t))
}

// freshDatabase creates a database for the test on the server of base (a
// DSN without a database name), dropped when the test ends, and returns a
// handle to it and its DSN.
func freshDatabase(t testing.TB, base string) (*sql.DB, string) {
	t.Helper()
	return namedDatabase(t, base, "cwtest_"+Unique())
}

// namedDatabase is freshDatabase with the database's name (letters,
// digits and '_').
func namedDatabase(t testing.TB, base, name string) (*sql.DB, string) {
	t.Helper()
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') || name == "" {
			t.Fatalf("testsvc: database name %q: want letters, digits and '_'", name)
		}
	}
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		t.Fatalf("testsvc: bad MySQL DSN %q: %v", base, err)
	}
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatalf("testsvc: open MySQL: %v", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := admin.PingContext(ctx); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("testsvc: MySQL at %s does not answer: %v; %s", cfg.Addr, err, hint)
		}
		t.Skipf("testsvc: MySQL at %s does not answer: %v; %s", cfg.Addr, err, hint)
	}
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("testsvc: create database: %v", err)
	}
	cfg.DBName = name
	cfg.ParseTime = true
	dsn := cfg.FormatDSN()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatalf("testsvc: open %s: %v", name, err)
	}
	t.Cleanup(func() {
		db.Close()
		admin, err := sql.Open("mysql", base)
		if err == nil {
			admin.Exec("DROP DATABASE IF EXISTS " + name)
			admin.Close()
		}
	})
	return db, dsn
}

// Unique returns a short random lower-case hex string, for key prefixes
// and database names that must not collide between tests and runs.
func Unique() string {
	var b [6]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// ClosedAddr returns a loopback address where nothing listens: a port
// that was free a moment ago, for tests of a service that does not answer.
func ClosedAddr(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
