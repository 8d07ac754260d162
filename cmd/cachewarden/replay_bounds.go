package main

import (
	"fmt"
	"time"

	"github.com/cachewarden/cachewarden/source/kafka"
)

// The forms --from and --to accept, for their error messages.
const (
	replayStartForms = `--from takes "earliest", an RFC 3339 time such as 2026-05-01T12:00:00Z (or 2026-05-01T12:00:00+02:00), or topic:partition:offset[,topic:partition:offset...]`
	replayEndForms   = `--to takes an RFC 3339 time such as 2026-05-01T12:00:00Z (or 2026-05-01T12:00:00+02:00), or topic:partition:offset[,topic:partition:offset...]`
)

// checkReplayStart reports a --from time after now: no message can have
// been written there yet, so the range is empty.
func checkReplayStart(from kafka.ReplayBound, now time.Time) error {
	if !from.Time.IsZero() && from.Time.After(now) {
		return fmt.Errorf("--from %s is in the future (now %s): no message is there to replay", from, now.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkReplayOrder reports a range that selects nothing because its end
// is not after its start: two times, or the two offsets of one partition.
// Ranges whose order only the broker knows (a time and offsets) pass.
func checkReplayOrder(from, to kafka.ReplayBound) error {
	if !from.Time.IsZero() && !to.Time.IsZero() && !to.Time.After(from.Time) {
		return fmt.Errorf("--to %s is not after --from %s: the range [from, to) is empty", to, from)
	}
	for _, s := range from.Offsets {
		for _, e := range to.Offsets {
			if s.Topic == e.Topic && s.Partition == e.Partition && e.Offset <= s.Offset {
				return fmt.Errorf("--to %s is not after --from %s: the range [from, to) of %s:%d is empty", e, s, s.Topic, s.Partition)
			}
		}
	}
	return nil
}
