// Package cdc decodes change-data-capture messages (Debezium, flattened
// Debezium, Maxwell, Canal in JSON; Debezium in Confluent-framed Avro,
// with the schemas a registry client put in an AvroSchemaCache) into
// row-change events and plans them with the rules: the one per-message
// planning step of the daemon, replay, `plan` and `rules test`. It
// imports only the rules package and an Avro schema parser, and does no
// I/O, so the tools that plan without infrastructure link neither Kafka
// nor memcached nor a SQL driver nor an HTTP client.
package decode
