// Package doctor checks that what a cachewarden config names is there and
// usable, before or while the daemon runs: the Kafka topics and their
// partitions, the dead-letter topic, the consumer group's position and
// lag (or, with the binary log source, the source server's settings,
// privileges and server id), every memcached server (reachable, answering the meta protocol),
// and MySQL (the binary log settings a CDC connector and exact counters
// rely on, and the privileges the rules' queries need). It backs
// `cachewarden doctor`.
//
// It writes nothing anywhere: Kafka is asked for metadata and offsets,
// memcached for `mn` and `version`, MySQL for system variables and the
// EXPLAIN of each rule's queries (their '?' bound to NULL).
package doctor

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cachewarden/cachewarden/config"
)

// DefaultTimeout bounds each area's checks (Kafka, memcached, MySQL).
const DefaultTimeout = 10 * time.Second

// Status is a finding's verdict.
type Status uint8

const (
	// OK: as it should be.
	OK Status = iota
	// Warn: works, but something an operator should know or fix.
	Warn
	// Fail: the daemon cannot work as configured.
	Fail
)

func (s Status) String() string {
	switch s {
	case OK:
		return "ok"
	case Warn:
		return "warn"
	}
	return "FAIL"
}

// Finding is one check's result.
type Finding struct {
	// Area is "kafka" (or "binlog" with the binary log source),
	// "memcached" or "mysql".
	Area string
	// Subject names what was checked: a topic, a server, a variable, a
	// rule.
	Subject string
	Status  Status
	// Detail says what was found, and for Warn and Fail what to do.
	Detail string
}

// Report is every finding of a Run, in the order checked.
type Report struct {
	Findings []Finding
}

func (r *Report) add(area, subject string, st Status, format string, args ...any) {
	r.Findings = append(r.Findings, Finding{Area: area, Subject: subject, Status: st, Detail: fmt.Sprintf(format, args...)})
}

// Count returns how many findings have status st.
func (r *Report) Count(st Status) int {
	n := 0
	for _, f := range r.Findings {
		if f.Status == st {
			n++
		}
	}
	return n
}

// Write prints the findings as aligned columns (status, area, subject,
// detail), then a summary line.
func (r *Report) Write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, f := range r.Findings {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", f.Status, f.Area, f.Subject, strings.ReplaceAll(f.Detail, "\n", " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "%d checks: %d ok, %d warnings, %d failed\n", len(r.Findings), r.Count(OK), r.Count(Warn), r.Count(Fail))
	return err
}

// Options says what Run checks.
type Options struct {
	// Config is the loaded daemon config (its RuleSet loaded); required.
	Config *config.Config
	// Timeout bounds each area's checks; default DefaultTimeout.
	Timeout time.Duration
	// Logger receives the Kafka client's warnings; nil discards.
	Logger *slog.Logger
}

// Run checks Kafka, every memcached server and, when the config names
// one, MySQL, and returns every finding. It does not stop at the first
// failure. It is safe to call concurrently.
func Run(ctx context.Context, o Options) *Report {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	rep := &Report{}
	within := func(f func(context.Context)) {
		ctx, cancel := context.WithTimeout(ctx, o.Timeout)
		defer cancel()
		f(ctx)
	}
	if o.Config.Source == config.SourceBinlog {
		within(func(ctx context.Context) { checkBinlog(ctx, o.Config, rep) })
	} else {
		within(func(ctx context.Context) { checkKafka(ctx, o.Config, o.Logger, rep) })
	}
	within(func(ctx context.Context) { checkMemcached(ctx, o.Config, rep) })
	if o.Config.MySQL.DSN != "" {
		within(func(ctx context.Context) { checkMySQL(ctx, o.Config, rep) })
	} else {
		rep.add("mysql", "mysql.dsn", OK, "not set: no rule loads or recounts from MySQL")
	}
	return rep
}
