// Package decode decodes change-data-capture messages into row-change
// events and plans them with the rules: the one per-message step of the
// daemon, replay, `plan` and `rules test` before coalescing.
//
// Each format is one file: debezium.go (the Debezium envelope, and rows
// flattened by ExtractNewRecordState), maxwell.go, canal.go (all JSON),
// and avro.go (Debezium in Confluent-framed Avro) with its schemas in
// avro_schema.go. decode.go detects the format and holds Decoder; the
// JSON scanner, the members of an object and the key cache are json.go,
// fields.go and keys.go; format.go is the one vocabulary the other
// packages use: format names (ParseFormat, Names), which formats a file of
// JSON lines may hold (ParseFileFormat, FileNames) and Debezium's op
// letters. planmsg.go plans a decoded message (PlanMessage); lines.go
// splits a file into message values (LineReader).
//
// It imports only the rules package and an Avro schema parser, and does no
// network I/O: Avro schemas come from whatever fills Decoder.Schemas (the
// daemon's schema registry client), so the tools that plan without
// infrastructure link neither Kafka nor memcached nor a SQL driver nor an
// HTTP client. Errors keep the "cdc:" prefix they had under the package's
// former name, which operators' logs and alerts may match.
package decode
