package integration

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/source/kafka"
	"github.com/cachewarden/cachewarden/wiring"
)

// FastGroupTiming shortens the consumer group protocol's timers so that
// joins and rebalances take a fraction of a second on a local broker
// (heartbeat 200ms, session 6s, rebalance 5s).
func FastGroupTiming(c *kafka.Config) {
	c.HeartbeatInterval = 200 * time.Millisecond
	c.SessionTimeout = 6 * time.Second
	c.RebalanceTimeout = 5 * time.Second
}

// Daemon is a cachewarden daemon running in this process, built from a
// config exactly as `cachewarden run` builds it.
type Daemon struct {
	Stack *wiring.Stack
	// Source is what runs: Daemon with the Kafka source, the binary log
	// daemon with source binlog (Daemon nil).
	Source wiring.Source
	Daemon *kafka.Daemon
	cancel context.CancelFunc
	done   chan error

	stopOnce sync.Once
	stopErr  error
}

// StartDaemon builds the daemon's stack from cfg (loaded with config.Load,
// addresses already pointing at the live services), lets adjust change the
// daemon configuration (nil: none), and runs it until Stop.
func StartDaemon(ctx context.Context, cfg *config.Config, log *slog.Logger, adjust func(*kafka.Config)) (*Daemon, error) {
	return StartDaemonWith(ctx, cfg, log, wiring.StackOptions{}, adjust)
}

// StartDaemonWith is StartDaemon with stack options (an observer-only
// stack, a fault hook). With source binlog in cfg it runs the binary log
// daemon, and adjust is not called.
func StartDaemonWith(ctx context.Context, cfg *config.Config, log *slog.Logger, opts wiring.StackOptions, adjust func(*kafka.Config)) (*Daemon, error) {
	stack, err := wiring.NewStack(cfg, log, opts)
	if err != nil {
		return nil, fmt.Errorf("integration: daemon stack: %w", err)
	}
	out := &Daemon{Stack: stack, done: make(chan error, 1)}
	if cfg.Source == config.SourceBinlog {
		out.Source, err = stack.NewBinlogDaemon()
	} else {
		dc := stack.DaemonConfig()
		if adjust != nil {
			adjust(&dc)
		}
		out.Daemon, err = stack.NewDaemon(dc)
		out.Source = out.Daemon
	}
	if err != nil {
		stack.Close()
		return nil, fmt.Errorf("integration: daemon: %w", err)
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	out.cancel = cancel
	go func() { out.done <- out.Source.Run(runCtx) }()
	return out, nil
}

// Stop shuts the daemon down gracefully (as on SIGTERM), waits for Run to
// return, and closes the stack. It returns Run's error; calling it again
// returns the same.
func (d *Daemon) Stop() error {
	d.stopOnce.Do(func() {
		d.cancel()
		d.stopErr = <-d.done
		if err := d.Stack.Close(); d.stopErr == nil && err != nil {
			d.stopErr = fmt.Errorf("integration: close daemon stack: %w", err)
		}
	})
	return d.stopErr
}

// Counts are totals read from a daemon's metrics.
type Counts struct {
	// Events counts change events by outcome (planned, unmatched,
	// skipped, poison).
	Events map[string]float64
	// Ops counts coalesced ops applied, keyed "kind/outcome".
	Ops map[string]float64
	// Recounts counts recounts by reason.
	Recounts map[string]float64
	// DLQ counts messages written to the dead-letter topic; Commits the
	// offset commits that succeeded.
	DLQ     float64
	Commits float64
	// Assigned is the number of partitions currently assigned;
	// Generations the group generations joined.
	Assigned, Generations float64
}

// Counts reads the daemon's metrics.
func (d *Daemon) Counts() (Counts, error) {
	families, err := d.Stack.Registry.Gather()
	if err != nil {
		return Counts{}, fmt.Errorf("integration: gather metrics: %w", err)
	}
	c := Counts{Events: map[string]float64{}, Ops: map[string]float64{}, Recounts: map[string]float64{}}
	label := func(m *dto.Metric, name string) string {
		for _, l := range m.GetLabel() {
			if l.GetName() == name {
				return l.GetValue()
			}
		}
		return ""
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			v := m.GetCounter().GetValue()
			switch f.GetName() {
			case "cachewarden_events_total":
				c.Events[label(m, "outcome")] += v
			case "cachewarden_ops_total":
				c.Ops[label(m, "kind")+"/"+label(m, "outcome")] += v
			case "cachewarden_recounts_total":
				c.Recounts[label(m, "reason")] += v
			case "cachewarden_dlq_messages_total":
				c.DLQ += v
			case "cachewarden_assigned_partitions":
				c.Assigned += m.GetGauge().GetValue()
			case "cachewarden_group_generations_total":
				c.Generations += v
			case "cachewarden_commits_total":
				if label(m, "outcome") == "ok" {
					c.Commits += v
				}
			}
		}
	}
	return c, nil
}

// Sub returns c minus an earlier reading.
func (c Counts) Sub(earlier Counts) Counts {
	sub := func(a, b map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range a {
			if d := v - b[k]; d != 0 {
				out[k] = d
			}
		}
		return out
	}
	return Counts{
		Events: sub(c.Events, earlier.Events), Ops: sub(c.Ops, earlier.Ops), Recounts: sub(c.Recounts, earlier.Recounts),
		DLQ: c.DLQ - earlier.DLQ, Commits: c.Commits - earlier.Commits,
		Assigned: c.Assigned, Generations: c.Generations - earlier.Generations,
	}
}

// Add returns the sum of two readings.
func (c Counts) Add(o Counts) Counts {
	add := func(a, b map[string]float64) map[string]float64 {
		out := map[string]float64{}
		for k, v := range a {
			out[k] += v
		}
		for k, v := range b {
			out[k] += v
		}
		return out
	}
	return Counts{
		Events: add(c.Events, o.Events), Ops: add(c.Ops, o.Ops), Recounts: add(c.Recounts, o.Recounts),
		DLQ: c.DLQ + o.DLQ, Commits: c.Commits + o.Commits,
		Assigned: c.Assigned + o.Assigned, Generations: c.Generations + o.Generations,
	}
}

// Total sums a map of counts.
func Total(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// Summary renders counts as "name 3, other 1" in name order.
func Summary(m map[string]float64) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %.0f", k, m[k])
	}
	return strings.Join(parts, ", ")
}
