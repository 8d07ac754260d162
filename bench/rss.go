package bench

import (
	"context"
	"fmt"
	"time"
)

// RSSSample is the daemon's memory at one moment of the flatness run.
type RSSSample struct {
	At        time.Duration // since the daemon started
	Committed int64         // events committed so far
	RSS       uint64        // VmRSS, bytes
}

// RSSResult is the memory-flatness run: the daemon consumes a long
// uniform stream while its RSS is sampled.
type RSSResult struct {
	Events  int64
	Elapsed time.Duration
	Samples []RSSSample
	PeakRSS uint64 // VmHWM at the end, bytes
	Produce time.Duration
}

// runRSS loads RSSEvents uniform events, runs the daemon over them and
// samples its RSS every RSSInterval until the group has committed them all.
func (e *env) runRSS(ctx context.Context) (*RSSResult, error) {
	o := e.opts
	topic := e.prefix + "-rss"
	if err := e.broker.CreateTopic(ctx, topic, o.Partitions); err != nil {
		return nil, err
	}
	d, err := Produce(ctx, e.broker.Addrs, topic, e.workload(Uniform), o.RSSEvents)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(e.out, "loaded %d uniform events into %s in %v\n", o.RSSEvents, topic, d.Round(time.Millisecond))
	if err := SeedKeys(e.mc.Addr, o.Keys); err != nil {
		return nil, err
	}
	res := &RSSResult{Events: int64(o.RSSEvents), Produce: d}
	group := e.prefix + "-cachewarden-rss"
	start := time.Now()
	proc, err := e.startCachewarden(group, topic, daemonSetup{})
	if err != nil {
		return nil, err
	}
	defer proc.Stop(15 * time.Second)
	client := e.broker.client()
	next := start.Add(o.RSSInterval)
	fmt.Fprintf(e.out, "%10s %12s %10s\n", "t", "committed", "RSS MB")
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		done, err := e.broker.Committed(ctx, client, group, topic, o.Partitions)
		if err != nil {
			done = 0
		}
		finished := done >= res.Events
		if now := time.Now(); now.After(next) || finished {
			rss, _, err := ProcMemory(proc.Pid())
			if err != nil {
				return nil, err
			}
			s := RSSSample{At: now.Sub(start), Committed: done, RSS: rss}
			res.Samples = append(res.Samples, s)
			fmt.Fprintf(e.out, "%10s %12d %10.1f\n", s.At.Round(10*time.Millisecond), s.Committed, mb(s.RSS))
			next = next.Add(o.RSSInterval)
		}
		if finished {
			res.Elapsed = time.Since(start)
			break
		}
		if proc.Exited() {
			return nil, fmt.Errorf("bench: %s exited at %d/%d events: %v (log in %s)", proc.Name, done, res.Events, proc.err, e.dir)
		}
		if time.Since(start) > o.RunTimeout {
			return nil, fmt.Errorf("bench: %s: %d/%d events after %v", proc.Name, done, res.Events, o.RunTimeout)
		}
	}
	if _, res.PeakRSS, err = ProcMemory(proc.Pid()); err != nil {
		return nil, err
	}
	return res, nil
}
