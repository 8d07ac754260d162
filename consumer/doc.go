// Package consumer turns CDC messages from Kafka into cache operations.
//
// It holds the batch pipeline that decodes (package decode), plans,
// coalesces and applies them (Pipeline, Coalescer), and the daemon that
// consumes topics as a member of a Kafka consumer group, commits offsets
// only after a batch is applied, hands partitions over cleanly on
// rebalances and shutdown, sends poison messages to a dead-letter topic
// (DLQ) and applies delayed second bumps (Rebumper). It also replays
// ranges of topics or files through the same pipeline (Replayer), reads
// the schemas of Avro messages from a schema registry (SchemaRegistry),
// and serves the metrics and health endpoints (Metrics, HTTPHandler).
// NewStack builds all of it from a config file, for the run, replay and
// demo commands alike.
//
// It applies nothing to memcached itself: package cacheops does (one
// Applier per Stack), with package counters for exact recounts.
package consumer
