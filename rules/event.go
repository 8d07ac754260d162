// Package rules holds the change-event and cache-operation types, the
// rules (RuleSet, NewRuleSet), the key function and the planner that maps
// one row change to cache operations. Package rulefile loads rule files
// into a RuleSet; it is kept apart so that programs reading the cache
// (package client) link no YAML parser.
//
// The package is pure: it performs no network I/O and keeps no global state,
// so rule files can be checked and unit-tested without Kafka, memcached or
// MySQL. Everything in it is safe for concurrent use once constructed unless
// a doc comment says otherwise.
//
// It decodes no CDC message (package cdc turns messages into Events) and
// applies nothing (packages cacheops and counters apply the Ops).
package rules

// Kind is the type of a column value as the change event carried it.
type Kind uint8

const (
	// KindNull is SQL NULL (or a JSON null).
	KindNull Kind = iota
	// KindInt is an integer of any size; Text holds its exact decimal
	// digits with an optional leading '-'.
	KindInt
	// KindFloat is a non-integer number; Text holds the literal as written
	// on the wire (never reformatted through float64).
	KindFloat
	// KindString is text or bytes; Text holds the decoded bytes.
	KindString
	// KindBool is a boolean; Text is "1" or "0" so that it renders and
	// compares like MySQL's TINYINT(1).
	KindBool
	// KindJSON is a nested JSON object or array; Text holds its raw JSON.
	KindJSON
)

// String returns the kind's lower-case name.
func (k Kind) String() string {
	switch k {
	case KindNull:
		return "null"
	case KindInt:
		return "int"
	case KindFloat:
		return "float"
	case KindString:
		return "string"
	case KindBool:
		return "bool"
	case KindJSON:
		return "json"
	}
	return "unknown"
}

// Value is one column value. The zero Value is NULL.
type Value struct {
	Kind Kind
	Text string
}

// IsNull reports whether v is SQL NULL.
func (v Value) IsNull() bool { return v.Kind == KindNull }

// Column is one named value of a row image.
type Column struct {
	Name  string
	Value Value
}

// Row is a row image: its columns in the order the event carried them.
// A nil Row means the image is absent (no before image on an insert, no
// after image on a delete); a present image is non-nil even when empty.
type Row []Column

// Get returns the value of the named column and whether the row has it.
func (r Row) Get(name string) (Value, bool) {
	for i := range r {
		if r[i].Name == name {
			return r[i].Value, true
		}
	}
	return Value{}, false
}

// Operation is what happened to a row.
type Operation uint8

const (
	Insert Operation = iota + 1
	Update
	Delete
	// Read is a snapshot row (Debezium "r", Maxwell bootstrap-insert).
	Read
	// Truncate empties a whole table; it has no row images.
	Truncate
)

// String returns the name used in rule files' `on` lists.
func (o Operation) String() string {
	switch o {
	case Insert:
		return "insert"
	case Update:
		return "update"
	case Delete:
		return "delete"
	case Read:
		return "read"
	case Truncate:
		return "truncate"
	}
	return "unknown"
}

// ParseOperation is the inverse of Operation.String.
func ParseOperation(s string) (Operation, bool) {
	switch s {
	case "insert":
		return Insert, true
	case "update":
		return Update, true
	case "delete":
		return Delete, true
	case "read":
		return Read, true
	case "truncate":
		return Truncate, true
	}
	return 0, false
}

// Position says where an event came from. Fields the transport or format
// does not carry are zero.
type Position struct {
	// Kafka coordinates of the message that carried the event.
	Topic     string
	Partition int
	Offset    int64
	// Line is the 1-based input line for events read from a file or stdin.
	Line int
	// Source database position: binlog file and position, GTID, and the
	// source timestamp in milliseconds since the Unix epoch.
	BinlogFile string
	BinlogPos  int64
	GTID       string
	TsMs       int64
	// ServerID is the server_id the event names (Debezium's
	// source.server_id, Maxwell's server_id): the server where the change
	// was first written, which is the server whose binary log BinlogFile
	// belongs to when the connector reads the server the writes go to.
	// 0 when unknown.
	ServerID uint32
}

// Event is one row change.
type Event struct {
	Database  string
	Table     string
	Operation Operation
	// Before and After are the row images; nil when absent.
	Before Row
	After  Row
	Source Position
}
