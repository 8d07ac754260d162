package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
)

// demoPreflightTimeout bounds each service check of demoPreflight.
const demoPreflightTimeout = 3 * time.Second

// demoPreflight checks, before the demo starts anything, that memcached
// answers at mcAddr, MySQL at dsn (with its binary log on when binlog is
// set) and, when brokers is not empty, that each Kafka broker accepts
// connections. It returns one error naming every service that does not
// answer and how to provide it, within a few seconds.
func demoPreflight(ctx context.Context, mcAddr, dsn string, brokers []string, binlog bool) error {
	var missing []string
	if err := pingMemcached(ctx, mcAddr); err != nil {
		missing = append(missing, fmt.Sprintf("memcached at %s: %v (start one with `make services`, or name one with --memcached or $%s)", mcAddr, err, envMemcached))
	}
	if err := pingMySQL(ctx, dsn, binlog); err != nil && binlog {
		missing = append(missing, fmt.Sprintf("MySQL with the binary log on: %v (start one with `scripts/services.sh demo-binlog`, or name one with --mysql or $%s)", err, envBinlogDSN))
	} else if err != nil {
		missing = append(missing, fmt.Sprintf("MySQL: %v (start one with `make services`, or name one with --mysql or $%s)", err, envMySQLDSN))
	}
	for _, b := range brokers {
		if err := dialCheck(ctx, b); err != nil {
			missing = append(missing, fmt.Sprintf("Kafka broker %s: %v (or leave --kafka empty for an in-process broker)", b, err))
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("services missing:\n  %s", strings.Join(missing, "\n  "))
}

// dial connects to addr, with deadlines demoPreflightTimeout away.
func dial(ctx context.Context, addr string) (net.Conn, error) {
	d := net.Dialer{Timeout: demoPreflightTimeout}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(demoPreflightTimeout))
	return c, nil
}

// dialCheck opens and closes a TCP connection to addr.
func dialCheck(ctx context.Context, addr string) error {
	c, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	return c.Close()
}

// pingMemcached sends memcached's version command to addr and checks the
// answer.
func pingMemcached(ctx context.Context, addr string) error {
	c, err := dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Write([]byte("version\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("no answer to version: %w", err)
	}
	if !strings.HasPrefix(line, "VERSION ") {
		return fmt.Errorf("answered %q to version: not memcached", strings.TrimSpace(line))
	}
	return nil
}

// pingMySQL connects to the server of dsn (its database ignored) and
// pings it, and checks that its binary log is on when binlog is set.
// Errors name the address, never the password.
func pingMySQL(ctx context.Context, dsn string, binlog bool) error {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return fmt.Errorf("DSN: %w", err)
	}
	cfg.DBName = ""
	cfg.Timeout = demoPreflightTimeout
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		return fmt.Errorf("DSN: %w", err)
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, demoPreflightTimeout)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s", demoPreflightTimeout)
		}
		return fmt.Errorf("at %s: %w", cfg.Addr, err)
	}
	if !binlog {
		return nil
	}
	var on bool
	if err := db.QueryRowContext(ctx, "SELECT @@GLOBAL.log_bin").Scan(&on); err != nil {
		return fmt.Errorf("at %s: read log_bin: %w", cfg.Addr, err)
	}
	if !on {
		return fmt.Errorf("at %s: log_bin is OFF", cfg.Addr)
	}
	return nil
}
