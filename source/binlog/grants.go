package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// grants are the privileges of a user as SHOW GRANTS lists them.
type grants struct {
	// global holds the privileges granted ON *.*, upper case.
	global map[string]bool
	// anySelect is true when SELECT (or ALL) is granted on anything.
	anySelect bool
}

// has reports whether any of the privileges is granted globally (ALL
// PRIVILEGES includes every one).
func (g grants) has(privs ...string) bool {
	if g.global["ALL PRIVILEGES"] || g.global["ALL"] {
		return true
	}
	for _, p := range privs {
		if g.global[p] {
			return true
		}
	}
	return false
}

// checkGrants reports the privileges a replica needs that the current
// user lacks.
func (r *ServerReport) checkGrants(ctx context.Context, db *sql.DB) error {
	rows, err := db.QueryContext(ctx, "SHOW GRANTS")
	if err != nil {
		return fmt.Errorf("binlog: read the current user's privileges (SHOW GRANTS): %w", err)
	}
	defer rows.Close()
	var lines []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			return fmt.Errorf("binlog: read the current user's privileges: %w", err)
		}
		lines = append(lines, line)
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("binlog: read the current user's privileges: %w", err)
	}
	g := parseGrants(lines)
	if !g.has("REPLICATION SLAVE") {
		r.Problems = append(r.Problems, errors.New("privilege REPLICATION SLAVE is not granted to the current user: it is needed to read the binary log; GRANT REPLICATION SLAVE ON *.* TO the user"))
	}
	if !g.has("REPLICATION CLIENT", "BINLOG MONITOR") {
		r.Problems = append(r.Problems, errors.New("privilege REPLICATION CLIENT (BINLOG MONITOR on MariaDB 10.5+) is not granted to the current user: it is needed to read the binary log position; GRANT REPLICATION CLIENT ON *.* TO the user (MariaDB: GRANT BINLOG MONITOR)"))
	}
	if !g.anySelect {
		r.Problems = append(r.Problems, errors.New("privilege SELECT is not granted to the current user on any table: it is needed to read column names from information_schema; GRANT SELECT ON the watched databases TO the user"))
	}
	return nil
}

// parseGrants reads SHOW GRANTS lines ("GRANT SELECT, REPLICATION SLAVE
// ON *.* TO `u`@`%`"). Lines it cannot read (roles, PROXY) grant
// nothing, nor do grants TO PUBLIC (MariaDB's default privileges on the
// test databases, which no watched table is in).
func parseGrants(lines []string) grants {
	g := grants{global: make(map[string]bool)}
	for _, line := range lines {
		upper := strings.ToUpper(line)
		if !strings.HasPrefix(upper, "GRANT ") || strings.HasSuffix(strings.TrimSpace(upper), " TO PUBLIC") {
			continue
		}
		on := strings.Index(upper, " ON ")
		if on < 0 {
			continue
		}
		object := strings.TrimSpace(upper[on+4:])
		global := strings.HasPrefix(object, "*.* ")
		for _, p := range splitPrivileges(upper[len("GRANT "):on]) {
			if p == "SELECT" || p == "ALL" || p == "ALL PRIVILEGES" {
				g.anySelect = true
			}
			if global {
				g.global[p] = true
			}
		}
	}
	return g
}

// splitPrivileges splits a privilege list at the commas outside
// parentheses (column lists: SELECT (a, b)), keeping each privilege's
// name without its column list.
func splitPrivileges(s string) []string {
	var out []string
	depth, start := 0, 0
	add := func(p string) {
		if i := strings.IndexByte(p, '('); i >= 0 {
			p = p[:i]
		}
		if p = strings.Join(strings.Fields(p), " "); p != "" {
			out = append(out, p)
		}
	}
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				add(s[start:i])
				start = i + 1
			}
		}
	}
	add(s[start:])
	return out
}
