package binlog

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-mysql-org/go-mysql/mysql"
	"github.com/go-mysql-org/go-mysql/replication"
)

// ErrColumnCount is the error (errors.Is) of a table whose column count in
// the binary log differs from the column names known for it: the table
// changed between the logged row and the schema read.
var ErrColumnCount = errors.New("column count mismatch")

// binaryCollation is the id of the "binary" collation: a string column
// with it holds bytes, not text.
const binaryCollation = 63

// tableKey names a table.
type tableKey struct{ db, table string }

func (k tableKey) String() string { return k.db + "." + k.table }

// columnCache knows the columns of tables: from a table map event's own
// metadata when the server writes it (binlog_row_metadata=FULL), else
// from information_schema, whose answers it keeps until a DDL statement
// names the table (forget) or one it cannot read is seen (forgetAll).
// It is not safe for concurrent use.
type columnCache struct {
	db *sql.DB
	// timeout bounds each information_schema query.
	timeout time.Duration
	schemas map[tableKey][]column
}

func newColumnCache(db *sql.DB, timeout time.Duration) *columnCache {
	return &columnCache{db: db, timeout: timeout, schemas: make(map[tableKey][]column)}
}

func (cc *columnCache) forget(k tableKey) { delete(cc.schemas, k) }

func (cc *columnCache) forgetAll() { clear(cc.schemas) }

// columns returns the columns of the table tm maps, in the log's order.
func (cc *columnCache) columns(ctx context.Context, tm *replication.TableMapEvent) ([]column, error) {
	k := tableKey{string(tm.Schema), string(tm.Table)}
	cols, complete := fromTableMap(tm)
	if complete {
		if len(tm.ColumnName) != len(cols) {
			return nil, fmt.Errorf("table %s: %w: the table map has %d columns and names %d", k, ErrColumnCount, len(cols), len(tm.ColumnName))
		}
		return cols, nil
	}
	known, err := cc.schema(ctx, k)
	if err != nil {
		return nil, err
	}
	if len(known) != len(cols) {
		return nil, fmt.Errorf("table %s: %w: the binary log has %d columns, information_schema %d (the table changed since the row was written?)", k, ErrColumnCount, len(cols), len(known))
	}
	fillFromSchema(tm, cols, known)
	return cols, nil
}

// fromTableMap reads what tm says of its columns. complete is true when
// that is all the values need: names, signedness of numbers, character
// sets of strings and the members of ENUMs and SETs.
func fromTableMap(tm *replication.TableMapEvent) (cols []column, complete bool) {
	n := int(tm.ColumnCount)
	cols = make([]column, n)
	names := tm.ColumnNameString()
	unsigned := tm.UnsignedMap()
	collations := tm.CollationMap()
	enums, sets := tm.EnumStrValueMap(), tm.SetStrValueMap()
	complete = len(names) > 0
	for i := range cols {
		c := &cols[i]
		c.Type, c.Meta = tm.ColumnType[i], tm.ColumnMeta[i]
		switch {
		case tm.IsEnumColumn(i):
			c.Type = mysql.MYSQL_TYPE_ENUM
			c.Members, complete = enums[i], complete && enums != nil
		case tm.IsSetColumn(i):
			c.Type = mysql.MYSQL_TYPE_SET
			c.Members, complete = sets[i], complete && sets != nil
		case tm.IsNumericColumn(i):
			c.Unsigned, complete = unsigned[i], complete && unsigned != nil
		case tm.IsCharacterColumn(i):
			coll, ok := collations[i]
			c.Binary, complete = coll == binaryCollation, complete && ok
		}
		_, c.Nullable = tm.Nullable(i)
		if i < len(names) {
			c.Name = names[i]
		}
	}
	return cols, complete
}

// fillFromSchema completes cols (of tm) with the names and types of known,
// information_schema's columns of the same table in the same order.
func fillFromSchema(tm *replication.TableMapEvent, cols, known []column) {
	unsigned := tm.UnsignedMap()
	collations := tm.CollationMap()
	for i := range cols {
		c, k := &cols[i], &known[i]
		c.Name = k.Name
		if _, ok := unsigned[i]; !ok {
			c.Unsigned = k.Unsigned
		}
		if _, ok := collations[i]; !ok {
			c.Binary = k.Binary
		}
		if (c.Type == mysql.MYSQL_TYPE_ENUM || c.Type == mysql.MYSQL_TYPE_SET) && c.Members == nil {
			c.Members = k.Members
		}
	}
}

// columnsQuery reads a table's columns; the table is only ever a
// placeholder's argument.
const columnsQuery = `SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE
FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ?
ORDER BY ORDINAL_POSITION`

// schema returns information_schema's columns of k, cached.
func (cc *columnCache) schema(ctx context.Context, k tableKey) ([]column, error) {
	if cols, ok := cc.schemas[k]; ok {
		return cols, nil
	}
	if cc.db == nil {
		return nil, fmt.Errorf("table %s: the binary log carries no column names (binlog_row_metadata is not FULL) and no database handle was given to read information_schema", k)
	}
	ctx, cancel := context.WithTimeout(ctx, cc.timeout)
	defer cancel()
	rows, err := cc.db.QueryContext(ctx, columnsQuery, k.db, k.table)
	if err != nil {
		return nil, fmt.Errorf("table %s: read columns from information_schema: %w", k, err)
	}
	defer rows.Close()
	var cols []column
	for rows.Next() {
		var name, dataType, columnType, nullable string
		if err := rows.Scan(&name, &dataType, &columnType, &nullable); err != nil {
			return nil, fmt.Errorf("table %s: read columns from information_schema: %w", k, err)
		}
		c, err := schemaColumn(name, dataType, columnType, nullable)
		if err != nil {
			return nil, fmt.Errorf("table %s: %w", k, err)
		}
		cols = append(cols, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("table %s: read columns from information_schema: %w", k, err)
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("table %s: information_schema knows no such table (dropped since the row was written?)", k)
	}
	cc.schemas[k] = cols
	return cols, nil
}

// schemaColumn is one row of information_schema.COLUMNS as a column.
func schemaColumn(name, dataType, columnType, nullable string) (column, error) {
	c := column{Name: name, Nullable: nullable == "YES"}
	lower := strings.ToLower(columnType)
	c.Unsigned = strings.Contains(lower, " unsigned")
	switch strings.ToLower(dataType) {
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		c.Binary = true
	case "enum", "set":
		members, err := parseMembers(columnType)
		if err != nil {
			return column{}, fmt.Errorf("column %s: %w", name, err)
		}
		c.Members = members
	}
	return c, nil
}
