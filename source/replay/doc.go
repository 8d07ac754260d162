// Package replay re-reads a range of CDC messages and applies them
// through a pipeline.Pipeline (docs/operations.md, "Replay"): bumps as
// the daemon applies them, and each counter and set a change touches
// recounted or rebuilt once at the end. Its input is an NDJSON file, the
// originals of dead letters, or Streams that a source opens (Kafka
// partition ranges: kafka.RangeStreams); it imports no source.
//
// Files: replay.go (Replayer, Stream, the dry run) and progress.go (the
// progress line on a terminal).
package replay
