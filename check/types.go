package check

import (
	"database/sql"
	"fmt"
	"strings"
)

// column is one column of a table, as information_schema.COLUMNS
// describes it.
type column struct {
	Name string
	// DataType is the lower-case type name ("varchar"); ColumnType the
	// full type ("varchar(64)", "bigint(20) unsigned").
	DataType, ColumnType string
	// CharMax and OctetMax are the most characters and bytes of a string
	// or binary column.
	CharMax, OctetMax sql.NullInt64
	// Precision and Scale of numeric columns.
	Precision, Scale sql.NullInt64
	// Charset and Collation of a character column (CHAR, VARCHAR, TEXT,
	// ENUM, SET); NULL for other columns.
	Charset, Collation sql.NullString
	// JSONCheck is true for a MariaDB JSON column: a LONGTEXT with a
	// CHECK (json_valid(col)), which MariaDB makes of the type JSON. It
	// classifies as JSON.
	JSONCheck bool
}

// typeName names c's type in messages: its column type, and for a
// MariaDB JSON column what makes it one.
func (c *column) typeName() string {
	if c.JSONCheck {
		return c.ColumnType + " (MariaDB's JSON: CHECK (json_valid(" + c.Name + ")))"
	}
	return c.ColumnType
}

// typeClass groups column types by how change events carry their values.
type typeClass uint8

const (
	classInt      typeClass = iota + 1 // integer digits in every format
	classString                        // text, as its bytes
	classDecimal                       // exact digits, written differently by producers
	classFloat                         // approximate numbers
	classTemporal                      // numbers since the epoch (Debezium) or text
	classBinary                        // base64 (Debezium) or raw bytes
	classBit                           // bytes or a boolean (Debezium), a number elsewhere
	classJSON                          // JSON text or a nested value
	classSpatial                       // a structure (Debezium) or WKT text
	classUnknown
)

func classify(c *column) typeClass {
	if c.JSONCheck {
		return classJSON
	}
	switch c.DataType {
	case "tinyint", "smallint", "mediumint", "int", "integer", "bigint", "year":
		return classInt
	case "char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set", "uuid", "inet4", "inet6":
		return classString
	case "decimal", "numeric":
		return classDecimal
	case "float", "double", "real", "double precision":
		return classFloat
	case "date", "datetime", "timestamp", "time":
		return classTemporal
	case "binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob":
		return classBinary
	case "bit":
		return classBit
	case "json":
		return classJSON
	case "geometry", "point", "linestring", "polygon", "multipoint", "multilinestring", "multipolygon", "geometrycollection":
		return classSpatial
	}
	if strings.HasSuffix(c.ColumnType, "json") {
		return classJSON
	}
	return classUnknown
}

// renderProblem says whether a template placeholder of column c gives
// keys or members that are the same whatever produced the change event:
// "" when it does, else the severity and the reason.
func renderProblem(c *column) (Severity, string) {
	switch classify(c) {
	case classInt, classString:
		return "", ""
	case classDecimal:
		return Warning, fmt.Sprintf("%s is a decimal: its text is the literal the change event carries, which depends on the producer and its settings (Debezium's decimal.handling.mode gives 1.50 or 1.5), so applications can build a different key", c.ColumnType)
	case classFloat:
		return Warning, fmt.Sprintf("%s is an approximate number: its text differs between producers (1.5, 1.5E0), so applications can build a different key", c.ColumnType)
	case classTemporal:
		return Warning, fmt.Sprintf("%s is a date or time: Debezium sends a number (days, ms or µs since the epoch) or an ISO string, Maxwell and Canal text, so the rendered text changes with the producer", c.ColumnType)
	case classBinary:
		return Warning, fmt.Sprintf("%s is binary: Debezium sends its bytes in base64 (binary.handling.mode), Maxwell and Canal as text, so the rendered text changes with the producer", c.ColumnType)
	case classBit:
		return Warning, fmt.Sprintf("%s: Debezium sends BIT as a boolean or base64 bytes, Maxwell and Canal as a number, so the rendered text changes with the producer", c.ColumnType)
	case classJSON:
		return Error, fmt.Sprintf("%s cannot be rendered into a key: the text is whatever JSON the producer wrote (a string from Debezium, a nested value from Maxwell)", c.typeName())
	case classSpatial:
		return Error, fmt.Sprintf("%s cannot be rendered into a key: Debezium sends a structure (wkb, srid), other producers text", c.ColumnType)
	}
	return Warning, fmt.Sprintf("type %s is unknown to this check: make sure every producer renders it the same way", c.ColumnType)
}

// whenProblem says whether a `when` comparison on column c sees the
// values MySQL holds.
func whenProblem(c *column) (Severity, string) {
	switch classify(c) {
	case classInt, classString, classDecimal, classFloat:
		return "", ""
	case classTemporal:
		return Warning, fmt.Sprintf("%s is a date or time: when compares what the change event carries (Debezium: a number since the epoch; Maxwell and Canal: text), not MySQL's value", c.ColumnType)
	case classBinary, classBit:
		return Warning, fmt.Sprintf("%s: when compares what the change event carries (Debezium: base64 text), not MySQL's bytes", c.ColumnType)
	case classJSON:
		return Warning, fmt.Sprintf("%s: when compares the JSON text the producer wrote (a nested value from Maxwell is never equal to a string)", c.typeName())
	case classSpatial:
		return Error, fmt.Sprintf("%s cannot be compared in when: the change event carries a structure or WKT text", c.ColumnType)
	}
	return Warning, fmt.Sprintf("type %s is unknown to this check", c.ColumnType)
}

// maxRendered returns the most bytes a placeholder of column c can
// render to, escaping included (a byte <= 0x20, 0x7f or '%' becomes three
// bytes), and whether there is a bound at all.
func maxRendered(c *column) (int64, bool) {
	switch classify(c) {
	case classInt:
		if c.Precision.Valid {
			return c.Precision.Int64 + 1, true // digits and a sign
		}
		return 20, true
	case classDecimal:
		if c.Precision.Valid {
			return c.Precision.Int64 + 2, true // digits, sign, point
		}
		return 67, true
	case classFloat:
		return 24, true // -1.7976931348623157E308
	case classTemporal:
		return 32, true // 2024-05-01T10:00:00.123456+00:00, or µs since the epoch
	case classBit:
		return 20, true
	case classString, classBinary, classJSON, classSpatial, classUnknown:
		var n int64
		if c.CharMax.Valid {
			n = 3 * c.CharMax.Int64 // every character an escaped byte
		}
		if c.OctetMax.Valid && c.OctetMax.Int64 > n {
			n = c.OctetMax.Int64 // every character a multi-byte one
		}
		if classify(c) == classBinary && c.OctetMax.Valid {
			n = 3 * c.OctetMax.Int64
		}
		return n, n > 0
	}
	return 0, false
}
