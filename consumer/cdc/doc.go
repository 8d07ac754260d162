// Package cdc decodes change-data-capture messages (Debezium, flattened
// Debezium, Maxwell, Canal) into row-change events and plans them with the
// rules: the one per-message planning step of the daemon, replay, `plan`
// and `rules test`. It imports only the rules package, so the tools that
// plan without infrastructure link neither Kafka nor memcached nor a SQL
// driver.
package cdc
