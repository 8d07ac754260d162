// Package pipeline turns batches of CDC messages into applied cache
// operations, whatever source they come from: decode (package decode),
// plan (package rules), coalesce, apply (packages cacheops and counters),
// and tell the source which messages it may acknowledge.
//
// A source (package source/kafka, source/replay) reads messages in order,
// gathers them into batches and calls Pipeline.Process with each; it
// commits its position only once Process returned nil for the batch. The
// pipeline knows no source: a Message carries bytes, the position its
// events come from (rules.Position) and the headers a dead-letter copy
// keeps. It imports no Kafka or binary log client.
//
// Files: pipeline.go (Pipeline, Batch, Process, Apply and its retries),
// coalesce.go (ops merged by key), fence.go (counter deltas against the
// fences of their recounts), fallback.go (fallback namespaces and
// generations bumped for what a lost or poison message cannot say
// exactly), ordering.go (set rules whose changes may come out of order),
// generation.go and position.go (the generation and source position
// items a batch reads and writes), rebump.go and rebump_journal.go (the
// delayed second bumps), schemas.go (waiting for the Avro schemas a
// batch needs), observe.go (the consistency observer's hook), health.go
// (memcached's and MySQL's readiness), replay.go (what a replay needs
// beyond Process), metrics.go and histogram.go.
package pipeline
