package kafka

import (
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
)

// DefaultStallTimeout is how long a partition may make no progress while
// messages wait for it before it counts as stalled.
const DefaultStallTimeout = time.Minute

// progressClock tells whether a partition is making progress: since when
// messages have waited for it without a batch being applied, and the
// fetch or commit failure that stopped it, if any. Its methods are safe
// for concurrent use.
type progressClock struct {
	mu sync.Mutex
	// since is when the partition last made progress while messages
	// waited; zero while nothing waits.
	since time.Time
	// failure stops the partition until it is assigned again.
	failure string
}

func (p *progressClock) reset() {
	p.mu.Lock()
	p.since, p.failure = time.Time{}, ""
	p.mu.Unlock()
}

// waiting records that messages wait (the clock keeps running if it was).
func (p *progressClock) waiting() {
	p.mu.Lock()
	if p.since.IsZero() {
		p.since = time.Now()
	}
	p.mu.Unlock()
}

// advanced records an applied batch; more says whether messages still
// wait.
func (p *progressClock) advanced(more bool) {
	p.mu.Lock()
	p.since = time.Time{}
	if more {
		p.since = time.Now()
	}
	p.mu.Unlock()
}

// fail records the failure that stopped the partition.
func (p *progressClock) fail(reason string) {
	p.mu.Lock()
	p.failure = reason
	p.mu.Unlock()
}

// stalled returns why the partition counts as stalled, or "".
func (p *progressClock) stalled(now time.Time, timeout time.Duration) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.failure != "":
		return p.failure
	case !p.since.IsZero() && now.Sub(p.since) >= timeout:
		return fmt.Sprintf("no batch applied for %s while messages wait", now.Sub(p.since).Truncate(time.Second))
	}
	return ""
}

// StalledPartition is an assigned partition that makes no progress.
type StalledPartition struct {
	Topic     string
	Partition int
	Reason    string
}

func (s StalledPartition) String() string {
	return fmt.Sprintf("%s:%d: %s", s.Topic, s.Partition, s.Reason)
}

// Stalled lists the assigned partitions that stopped on a failure or have
// applied no batch for StallTimeout while messages waited for them,
// sorted by topic and partition. It is safe for concurrent use.
func (d *Daemon) Stalled() []StalledPartition {
	now := time.Now()
	d.mu.RLock()
	var out []StalledPartition
	for tp, w := range d.parts {
		if why := w.progress.stalled(now, d.cfg.StallTimeout); why != "" {
			out = append(out, StalledPartition{Topic: tp.topic, Partition: tp.partition, Reason: why})
		}
	}
	d.mu.RUnlock()
	slices.SortFunc(out, func(a, b StalledPartition) int {
		if c := strings.Compare(a.Topic, b.Topic); c != 0 {
			return c
		}
		return a.Partition - b.Partition
	})
	return out
}

// reportStalled sets the stalled gauges of the assigned partitions and
// logs partitions that became stalled.
func (d *Daemon) reportStalled() {
	stalled := d.Stalled()
	d.mu.RLock()
	owned := make([]topicPartition, 0, len(d.parts))
	for tp := range d.parts {
		owned = append(owned, tp)
	}
	d.mu.RUnlock()
	for _, tp := range owned {
		i := slices.IndexFunc(stalled, func(s StalledPartition) bool { return s.Topic == tp.topic && s.Partition == tp.partition })
		d.m.setStalled(tp.topic, tp.partition, i >= 0)
	}
}

// fetchFailed handles an error that stopped fetching a partition: the
// client does not fetch it again in this assignment. The partition stays
// assigned and counts as stalled (so the daemon reports not ready) until
// it is assigned again, after the operator acted.
func (d *Daemon) fetchFailed(log *slog.Logger, tp topicPartition, err error, progress *progressClock) {
	d.m.partitionErrors.Inc()
	if errors.Is(err, kerr.OffsetOutOfRange) {
		reason := "committed offset is out of the partition's log (records removed by retention before they were read, or a recreated topic); kafka.offset_reset is fail"
		log.Error("partition stopped: "+reason+"; set kafka.offset_reset to earliest or latest and restart, or move the group's offset, to continue (docs/operations.md, \"Offsets out of range\")",
			"error", err.Error())
		progress.fail(reason)
		return
	}
	log.Error("partition stopped: fetching failed and the client does not retry it; it resumes when the partition is assigned again (restart or rebalance)", "error", err.Error())
	progress.fail("fetching failed: " + err.Error())
}

func (r OffsetReset) String() string {
	switch r {
	case ResetEarliest:
		return "earliest"
	case ResetLatest:
		return "latest"
	}
	return "fail"
}
