// Package binlog reads a MySQL (8.0, 8.4) or MariaDB (10.6+) server's
// binary log directly, as a replica, and turns its committed transactions
// into rules.Events: the reading half of a change source that needs no
// Kafka and no Debezium. It applies nothing and keeps no checkpoint of
// its own.
//
// Files:
//
//   - checks.go, grants.go: CheckServer and Inspect, which report every
//     setting, privilege and server id problem of a server at once.
//   - stream.go: Config, Open and Stream, around go-mysql's
//     BinlogSyncer; Txn and Unmapped. DefaultMaxEvents is declared there.
//   - txn.go: Stream.Next, which groups events into committed
//     transactions and maps rows to rules.Events.
//   - columns.go: the columns of a table: from the table map event when
//     the server logs them (binlog_row_metadata=FULL), else from
//     information_schema (by placeholders; cached until a DDL statement
//     names the table).
//   - ddl.go: reads the head of a logged statement (BEGIN, COMMIT, DDL,
//     TRUNCATE) and the tables it names.
//   - values.go, parse.go: go-mysql's row values to rules.Values.
//   - lease.go, checkpoint.go: the lease and checkpoint of a reader.
//
// # Transactions
//
// Next returns only committed transactions: InnoDB's rolled-back ones
// never reach the binary log. A transaction ends at its XID event, at a
// COMMIT (or, after changes to non-transactional tables, ROLLBACK)
// statement, or is a single statement (DDL). Each Txn lists its row
// changes in log order and, apart, the rows that could not be mapped
// with the table they belong to: an upstream must treat those tables as
// changed in an unknown way (bump their fallback), never skip them
// quietly. A transaction with more than Config.MaxEvents changes comes in
// parts; only the part with Complete set ends it, and only its End may
// be checkpointed. Transactions with nothing to return (only skipped
// tables, DDL) are passed over; Position says where a stream reopened
// now would resume. An XA transaction is returned where the log holds
// its rows, when it is prepared (at its XA END statement), before its XA
// COMMIT or XA ROLLBACK: the changes of one rolled back later are
// returned too, which for a cache is one needless invalidation.
//
// Positions: every event's Source carries the binlog file, the
// transaction's GTID, the event's server id and its time (ms). On a
// complete transaction BinlogPos is the position after the commit, so
// resuming there reads the next transaction. Streams started from a GTID
// set also give the executed GTID set after each transaction (Txn.End).
//
// Errors end a Stream: go-mysql's own reconnection is off, because a
// reconnect mid-transaction loses the table maps; the caller closes the
// Stream and opens a new one from its last checkpoint.
//
// # Values
//
// A rule must render the same key from a row whether it came from
// Debezium (through package decode) or from the binary log, so values are
// mapped to what decode makes of Debezium's MySQL connector JSON with its
// default settings (decimal.handling.mode=precise,
// time.precision.mode=adaptive_time_microseconds,
// binary.handling.mode=bytes) and bigint.unsigned.handling.mode=precise.
// testdata/types.json holds one value of each type with its Debezium JSON;
// TestValuesMatchDebezium checks both against a real server.
//
//	integers        exact digits (BIGINT UNSIGNED 18446744073709551615
//	                too, even when the log does not say it is unsigned:
//	                information_schema does)
//	TINYINT(1)      digits, not a boolean
//	DECIMAL         exact digits with all the scale's decimals
//	                (KindFloat "-0.50"), KindInt without a scale
//	FLOAT, DOUBLE   KindFloat, the shortest text that reads back as the
//	                same float32/float64, as rules.ValueOf writes it
//	DATE            days since 1970-01-01 (KindInt)
//	DATETIME        ms since the epoch read as UTC (precision 0-3), µs
//	                (precision 4-6)
//	TIMESTAMP       "2024-05-01T10:00:00Z" in UTC, with the column's
//	                fractional digits ("…:00.120Z")
//	TIME            µs, negative allowed
//	zero dates      NULL in a nullable column, the epoch otherwise
//	YEAR            digits
//	BIT(1)          KindBool; BIT(n>1) base64 of its bytes in
//	                little-endian order (io.debezium.data.Bits)
//	ENUM, SET       the member names, a SET's joined by ','
//	CHAR, TEXT      the bytes as stored (KindString)
//	BINARY, BLOB    base64 of the bytes (KindString)
//	JSON            its text (MySQL's binary JSON as go-mysql prints it;
//	                MariaDB's JSON is LONGTEXT)
//	spatial         KindJSON {"wkb":"<base64>","srid":N}
//	NULL            KindNull
//
// Where Debezium's rendering cannot be matched, the one a user writing key
// templates expects is chosen: a DOUBLE of 1e300 is "1e+300" (Go's
// shortest form, which rules.ValueOf gives applications), where Java
// prints "1.0E300"; integral doubles are "100" where Java prints "100.0".
// Text in a character set other than utf8mb4/utf8/ASCII (latin1) keeps
// its stored bytes, where Debezium re-encodes it as UTF-8. MySQL's JSON
// key order and spacing may differ from Debezium's. These are the kinds of
// column that check already warns about in key templates.
//
// # Column names
//
// With binlog_row_metadata=FULL the table map event names the columns
// and types, and a column added mid-stream maps right whatever the
// timing. Otherwise names, signedness and ENUM/SET members come from
// information_schema as it is when the row is read: a table changed
// between the write and the read gives ErrColumnCount for the rows of
// other column counts (an Unmapped row, never a misnamed one), but a
// change that keeps the count (a column renamed or retyped) cannot be
// seen. FULL is the setting to use; CheckServer notes which is in force.
package binlog
