// Package kafka is the Kafka source: it consumes CDC topics as a member
// of a consumer group and feeds each partition's messages, in order and
// in batches, to a pipeline.Pipeline, committing a partition's offset only
// after the pipeline applied the batch (docs/operations.md).
//
// Files: daemon.go (Daemon: the group member and its readiness), poll.go
// and partition_queue.go (fetching and one queue per partition), batch.go
// (a partition's batches, gaps and stuck batches), commit.go (offset
// commits), handoff.go (partitions taken over and handed over on
// rebalances and shutdown), lease.go (the membership lease that stops a
// frozen member's writes), progress.go (stalled partitions), client.go
// and auth.go (the kgo client, TLS, SASL and refused credentials),
// oversize.go (record batches over the decompression bound), dlq.go and
// dlq_read.go (the dead-letter topic), registry.go (the schema registry
// of Avro messages), ranges.go and setappend.go (partition ranges read
// for a replay), metrics.go.
//
// It imports no config: package wiring builds its Config from the
// config file.
package kafka
