package client

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
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
