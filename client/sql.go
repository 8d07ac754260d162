package client

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// queryMembers runs a set rule's load query and returns the first column
// of every row as text, in row order, as the daemon loads sets: rows whose
// first column is NULL are skipped, extra columns ignored.
func queryMembers(ctx context.Context, db Querier, query string, args []any) ([]string, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	dest, first, err := scanTargets(rows)
	if err != nil {
		return nil, err
	}
	members := []string{}
	for rows.Next() {
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if *first != nil {
			members = append(members, string(*first))
		}
	}
	return members, rows.Err()
}

// queryCount runs a count rule's recount query, which must return one row
// holding one non-negative integer.
func queryCount(ctx context.Context, db Querier, query string, args []any) (int64, error) {
	rows, err := db.QueryContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	defer rows.Close()
	dest, first, err := scanTargets(rows)
	if err != nil {
		return 0, err
	}
	if len(dest) != 1 {
		return 0, fmt.Errorf("recount query returned %d columns, want 1", len(dest))
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, errors.New("recount query returned no row, want 1")
	}
	if err := rows.Scan(dest...); err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(string(*first), 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("recount query returned %q, want a non-negative integer", *first)
	}
	if rows.Next() {
		return 0, errors.New("recount query returned more than one row, want 1")
	}
	return n, rows.Err()
}

// scanTargets returns Scan destinations for every column of rows; first
// receives the first column.
func scanTargets(rows *sql.Rows) (dest []any, first *sql.RawBytes, err error) {
	cols, err := rows.Columns()
	if err != nil {
		return nil, nil, err
	}
	if len(cols) == 0 {
		return nil, nil, errors.New("query returned no columns")
	}
	dest = make([]any, len(cols))
	for i := range dest {
		dest[i] = new(sql.RawBytes)
	}
	return dest, dest[0].(*sql.RawBytes), nil
}

// querySourceID reads the server_id of the server db's server replicates
// from: Master_Server_Id of SHOW SLAVE STATUS (MariaDB, MySQL before
// 8.0.22), else Source_Server_Id of SHOW REPLICA STATUS.
func querySourceID(ctx context.Context, db *sql.DB) (uint32, error) {
	var firstErr error
	for _, q := range []string{"SHOW SLAVE STATUS", "SHOW REPLICA STATUS"} {
		id, err := statusColumn(ctx, db, q, "Master_Server_Id", "Source_Server_Id")
		if err == nil {
			return id, nil
		}
		if firstErr == nil {
			firstErr = err
		}
	}
	return 0, firstErr
}

// statusColumn runs a SHOW ... STATUS query and parses the first of
// columns its single row has as a server_id.
func statusColumn(ctx context.Context, db *sql.DB, query string, columns ...string) (uint32, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", query, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return 0, err
	}
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%s: no row: the server replicates from nothing", query)
	}
	dest := make([]any, len(cols))
	for i := range dest {
		dest[i] = new(sql.RawBytes)
	}
	if err := rows.Scan(dest...); err != nil {
		return 0, err
	}
	for i, c := range cols {
		if slices.Contains(columns, c) {
			id, err := strconv.ParseUint(string(*dest[i].(*sql.RawBytes)), 10, 32)
			if err != nil || id == 0 {
				return 0, fmt.Errorf("%s: %s = %q, want a server_id", query, c, *dest[i].(*sql.RawBytes))
			}
			return uint32(id), nil
		}
	}
	return 0, fmt.Errorf("%s: no column %s", query, strings.Join(columns, " or "))
}
