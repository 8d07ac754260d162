package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/source/kafka"
	"github.com/cachewarden/cachewarden/source/replay"
	"github.com/cachewarden/cachewarden/wiring"
)

// dlqCmd implements `dlq list|redrive`: the dead-letter topic.
func (a *app) dlqCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	usage := func(w io.Writer) {
		fmt.Fprintf(w, "Usage: cachewarden dlq list -c FILE [--from N] [--partition P] [--limit N] [--json]\n"+
			"       cachewarden dlq redrive -c FILE (--offset N | --offsets A-B | --all | --reason TEXT) [--partition P] [--dry-run]\n\n"+
			"Lists the dead-letter topic (kafka.dlq_topic), or re-applies chosen dead\n"+
			"letters through the pipeline with the current rules (after a rule fix).\n"+
			"Run `cachewarden help dlq list` or `help dlq redrive` for the flags.\n")
	}
	if len(args) == 0 {
		usage(stderr)
		return usageErrorf("dlq: give a subcommand: list or redrive")
	}
	switch args[0] {
	case "list":
		return a.dlqList(ctx, args[1:], stdout, stderr)
	case "redrive":
		return a.dlqRedrive(ctx, args[1:], stdout, stderr)
	case "-h", "-help", "--help":
		usage(stdout)
		return flag.ErrHelp
	}
	usage(stderr)
	return usageErrorf("dlq: unknown subcommand %q: want list or redrive", args[0])
}

// Defaults of the dlq flags.
const (
	// defaultDLQListLimit is how many dead letters `dlq list` prints.
	defaultDLQListLimit = 100
	// defaultDLQRedriveLimit bounds the dead letters one `dlq redrive`
	// holds in memory and re-applies.
	defaultDLQRedriveLimit = 1000
)

// dlqOptions are the flags list and redrive share.
type dlqOptions struct {
	path      *string
	from      int64
	partition int
	limit     int
}

func (o *dlqOptions) bind(fs *flag.FlagSet, limit int, limitHelp string) {
	o.path = configFlag(fs)
	fs.Int64Var(&o.from, "from", 0, "first offset read in each partition of the dead-letter topic (default: its start)")
	fs.IntVar(&o.partition, "partition", -1, "read only this partition of the dead-letter topic (default: all)")
	fs.IntVar(&o.limit, "limit", limit, limitHelp)
}

// load checks the shared flags and loads the config, which must name a
// dead-letter topic.
func (o *dlqOptions) load(fs *flag.FlagSet, command string, stderr io.Writer) (*config.Config, error) {
	if err := checkConfigArgs(fs, command, *o.path); err != nil {
		return nil, err
	}
	if o.from < 0 || o.partition < -1 || o.limit < 1 {
		return nil, usageErrorf("%s: --from and --partition must not be negative, --limit must be at least 1", command)
	}
	cfg, err := loadConfig(*o.path, stderr)
	if err != nil {
		return nil, err
	}
	if cfg.Kafka.DLQTopic == "" {
		return nil, usageErrorf("%s: %s names no kafka.dlq_topic", command, *o.path)
	}
	return cfg, nil
}

func (o *dlqOptions) readOptions() kafka.DLQReadOptions {
	return kafka.DLQReadOptions{Partition: o.partition, From: o.from}
}

// dlqListHelp is the description `cachewarden dlq list -h` prints.
const dlqListHelp = `Prints the dead letters of kafka.dlq_topic, oldest first in each partition:
their partition and offset in the dead-letter topic, the original record
(topic:partition:offset), its timestamp, the value's size in bytes and
why it is poison. It reads up to the end the topic has when it starts
and never waits for more. NOTE says which dead letters cannot be
re-driven (a batch too large to decompress, a value the brokers refused).
--json prints one JSON object a line instead.`

// dlqList implements `dlq list`.
func (a *app) dlqList(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq list", "dlq list -c FILE [--from N] [--partition P] [--limit N] [--json]", dlqListHelp, stderr)
	var o dlqOptions
	o.bind(fs, defaultDLQListLimit, "print at most this many dead letters")
	asJSON := fs.Bool("json", false, "one JSON object per dead letter, a line each")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	cfg, err := o.load(fs, "dlq list", stderr)
	if err != nil {
		return err
	}
	log := a.configLogger(cfg.Log, stderr)
	kc, err := wiring.KafkaConnFromConfig(cfg.Kafka)
	if err != nil {
		return fmt.Errorf("dlq list: %w", err)
	}
	var tw *tabwriter.Writer
	enc := json.NewEncoder(stdout)
	if !*asJSON {
		tw = tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "PARTITION\tOFFSET\tORIGIN\tORIGINAL TIME\tSIZE\tREASON\tNOTE")
	}
	n, more := 0, false
	err = kafka.ReadDLQ(ctx, kc, cfg.Kafka.DLQTopic, o.readOptions(), log, func(d *kafka.DeadLetter) error {
		if n == o.limit {
			more = true
			return kafka.ErrStopDLQ
		}
		n++
		if *asJSON {
			return enc.Encode(newDLQEntry(d))
		}
		e := newDLQEntry(d)
		origin := "-"
		if e.Topic != "" {
			origin = kafka.PartitionOffset{Topic: e.Topic, Partition: e.OriginPartition, Offset: e.OriginOffset}.String()
		}
		ts := e.Timestamp
		if ts == "" {
			ts = "-"
		}
		_, err := fmt.Fprintf(tw, "%d\t%d\t%s\t%s\t%d\t%s\t%s\n", e.Partition, e.Offset, origin, ts, e.Size, printable(e.Reason), printable(e.Note))
		return err
	})
	if tw != nil {
		if ferr := tw.Flush(); ferr != nil && err == nil {
			err = ferr
		}
	}
	if err != nil {
		return fmt.Errorf("dlq list: %w", err)
	}
	switch {
	case more:
		fmt.Fprintf(stderr, "dlq list: %d dead letters shown, more follow (--limit %d; --from OFFSET continues)\n", n, o.limit)
	case n == 0:
		fmt.Fprintf(stderr, "dlq list: %s holds no dead letters (from offset %d)\n", cfg.Kafka.DLQTopic, o.from)
	}
	return nil
}

// dlqEntry is one dead letter as `dlq list --json` prints it.
type dlqEntry struct {
	Partition int    `json:"dlq_partition"`
	Offset    int64  `json:"dlq_offset"`
	Written   string `json:"written"`
	Topic     string `json:"topic,omitempty"`
	// OriginPartition and OriginOffset are meaningful with Topic.
	OriginPartition int    `json:"partition"`
	OriginOffset    int64  `json:"offset"`
	EndOffset       *int64 `json:"end_offset,omitempty"`
	Timestamp       string `json:"timestamp,omitempty"`
	Size            int    `json:"size"`
	Reason          string `json:"reason"`
	Redrivable      bool   `json:"redrivable"`
	// Note says why the dead letter cannot be re-driven.
	Note string `json:"note,omitempty"`
}

func newDLQEntry(d *kafka.DeadLetter) dlqEntry {
	e := dlqEntry{Partition: d.Partition, Offset: d.Offset, Written: d.Written.UTC().Format(time.RFC3339Nano),
		Topic: d.Origin.Topic, OriginPartition: d.Origin.Partition, OriginOffset: d.Origin.Offset,
		Size: d.Size, Reason: d.Reason, Redrivable: true}
	if d.EndOffset >= 0 {
		end := d.EndOffset
		e.EndOffset = &end
	}
	if !d.Time.IsZero() {
		e.Timestamp = d.Time.UTC().Format(time.RFC3339Nano)
	}
	if err := d.Redrivable(); err != nil {
		e.Redrivable = false
		e.Note = err.Error()
	}
	return e
}

// printable returns s on one line for the table: control characters
// (a reason may quote the message) become escapes.
func printable(s string) string {
	if s == "" {
		return "-"
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}

// dlqSelection is what `dlq redrive` re-drives.
type dlqSelection struct {
	all      bool
	lo, hi   int64 // offsets; lo < 0: no offset given
	reason   string
	offsetFl string
}

// matches reports whether d is selected.
func (s *dlqSelection) matches(d *kafka.DeadLetter) bool {
	if s.lo >= 0 && (d.Offset < s.lo || d.Offset > s.hi) {
		return false
	}
	return s.reason == "" || strings.Contains(d.Reason, s.reason)
}

// parseDLQSelection checks redrive's selectors.
func parseDLQSelection(offset int64, offsets, reason string, all bool) (dlqSelection, error) {
	s := dlqSelection{all: all, lo: -1, hi: -1, reason: reason}
	given := 0
	if offset >= 0 {
		given++
		s.lo, s.hi, s.offsetFl = offset, offset, "--offset"
	}
	if offsets != "" {
		given++
		a, b, ok := strings.Cut(offsets, "-")
		lo, err1 := strconv.ParseInt(strings.TrimSpace(a), 10, 64)
		hi, err2 := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
		if !ok || err1 != nil || err2 != nil || lo < 0 || hi < lo {
			return s, fmt.Errorf("--offsets %q: want A-B, two offsets from 0 with A <= B (both included)", offsets)
		}
		s.lo, s.hi, s.offsetFl = lo, hi, "--offsets"
	}
	if all {
		given++
	}
	switch {
	case given > 1:
		return s, errors.New("give one of --offset, --offsets and --all (--reason may narrow --offset or --offsets)")
	case given == 0 && reason == "":
		return s, errors.New("choose the dead letters: --offset N, --offsets A-B, --all or --reason TEXT")
	}
	return s, nil
}

// dlqRedriveHelp is the description `cachewarden dlq redrive -h` prints.
const dlqRedriveHelp = `Re-applies chosen dead letters of kafka.dlq_topic with the rules the
config loads now, through the path ` + "`replay`" + ` takes: namespace bumps
applied, every counter a change touches recounted and every set it
touches rebuilt from its load query (or deleted) once at the end, fenced
as replay's recounts are. --offset and --offsets select offsets of the
dead-letter topic (give --partition when it has several); --reason
selects the dead letters whose reason contains TEXT. Each one gets a
line on stdout: applied, poison again (and why), or not re-driven (a
batch too large to decompress or a value the brokers refused: the line
gives the replay command that applies the originals). Nothing is
removed from the dead-letter topic or written to it. --dry-run prints
the planned ops as ` + "`cachewarden plan`" + ` does instead. Exit status 1 when
a chosen dead letter was not applied, or an op failed.`

// dlqRedrive implements `dlq redrive`.
func (a *app) dlqRedrive(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dlq redrive", "dlq redrive -c FILE (--offset N | --offsets A-B | --all | --reason TEXT) [--partition P] [--dry-run]", dlqRedriveHelp, stderr)
	var o dlqOptions
	o.bind(fs, defaultDLQRedriveLimit, "re-drive at most this many dead letters (they are held in memory)")
	offset := fs.Int64("offset", -1, "re-drive the dead letter at this offset")
	offsets := fs.String("offsets", "", "re-drive the dead letters at offsets A to B (both included)")
	all := fs.Bool("all", false, "re-drive every dead letter (from --from)")
	reason := fs.String("reason", "", "re-drive the dead letters whose reason contains this text")
	dryRun := fs.Bool("dry-run", false, "print the planned ops on stdout instead of applying them")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	sel, err := parseDLQSelection(*offset, *offsets, *reason, *all)
	if err != nil {
		return usageErrorf("dlq redrive: %v", err)
	}
	cfg, err := o.load(fs, "dlq redrive", stderr)
	if err != nil {
		return err
	}
	log := a.configLogger(cfg.Log, stderr)

	stack, err := wiring.NewStack(cfg, log, wiring.StackOptions{NoDLQ: true, RecountReason: "replay", MemoryRebumps: true, Build: binaryBuild()})
	if err != nil {
		return fmt.Errorf("dlq redrive: %w", err)
	}
	defer stack.Close()

	// A dry run's stdout is the plan: the dead letters left out go to
	// stderr then.
	notes := stdout
	if *dryRun {
		notes = stderr
	}
	chosen, err := chooseDeadLetters(ctx, stack, cfg.Kafka.DLQTopic, &o, sel, notes, log)
	if err != nil {
		return err
	}
	if err := chosen.check(cfg.Kafka.DLQTopic, sel, o.limit, stderr); err != nil {
		return err
	}
	replayer, err := replay.New(replay.Config{
		Pipeline: stack.Pipeline,
		Report:   stderr,
		Logger:   log,
	})
	if err != nil {
		return fmt.Errorf("dlq redrive: %w", err)
	}
	return chosen.redrive(ctx, replayer, *dryRun, stdout, stderr)
}

// redriveChoice is what `dlq redrive` chose to re-drive.
type redriveChoice struct {
	msgs []pipeline.Message
	// where is "P:OFFSET origin" of msgs[i].
	where []string
	// notDriven counts the chosen dead letters that hold no message to
	// re-drive; each was reported when chosen.
	notDriven int
	// partitions are the dead-letter topic's partitions chosen from.
	partitions map[int]bool
	// more is true when choosing stopped at the limit; last is the
	// "P:OFFSET" of the last dead letter chosen.
	more bool
	last string
}

// chosen is the number of dead letters chosen, re-drivable or not.
func (c *redriveChoice) chosen() int { return len(c.msgs) + c.notDriven }

// chooseDeadLetters reads topic's dead letters and keeps the selected ones
// that hold their message, up to o.limit; each selected one that does not
// is reported on notes at once.
func chooseDeadLetters(ctx context.Context, stack *wiring.Stack, topic string, o *dlqOptions, sel dlqSelection, notes io.Writer, log *slog.Logger) (*redriveChoice, error) {
	c := &redriveChoice{partitions: map[int]bool{}}
	ro := o.readOptions()
	if sel.lo > ro.From {
		ro.From = sel.lo
	}
	err := kafka.ReadDLQ(ctx, stack.Kafka, topic, ro, log, func(d *kafka.DeadLetter) error {
		if o.partition >= 0 && sel.lo >= 0 && d.Offset > sel.hi {
			return kafka.ErrStopDLQ // past the offsets chosen
		}
		if !sel.matches(d) {
			return nil
		}
		if c.chosen() == o.limit {
			c.more = true
			return kafka.ErrStopDLQ
		}
		c.add(d, notes)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("dlq redrive: %w", err)
	}
	return c, nil
}

// add chooses d: its message when it holds one, else a "not re-driven"
// line on notes.
func (c *redriveChoice) add(d *kafka.DeadLetter, notes io.Writer) {
	c.partitions[d.Partition] = true
	at := strconv.Itoa(d.Partition) + ":" + strconv.FormatInt(d.Offset, 10)
	c.last = at
	if d.Origin.Topic != "" {
		at += " " + d.Origin.String()
	}
	if err := d.Redrivable(); err != nil {
		c.notDriven++
		fmt.Fprintf(notes, "%s: not re-driven: %v\n", at, err)
		return
	}
	c.msgs = append(c.msgs, d.Message)
	c.where = append(c.where, at)
}

// check reports a choice that cannot go on (offsets of several
// partitions, nothing chosen) as an error, and a choice cut at limit on
// stderr.
func (c *redriveChoice) check(topic string, sel dlqSelection, limit int, stderr io.Writer) error {
	if sel.lo >= 0 && len(c.partitions) > 1 {
		return usageErrorf("dlq redrive: %s selects offsets of %d partitions of %s: give --partition", sel.offsetFl, len(c.partitions), topic)
	}
	if c.chosen() == 0 {
		fmt.Fprintf(stderr, "dlq redrive: no dead letter of %s matches\n", topic)
		return errReported
	}
	if c.more {
		fmt.Fprintf(stderr, "dlq redrive: stopped choosing at --limit %d; the dead letters after %s are not re-driven\n", limit, c.last)
	}
	return nil
}

// redrive re-applies (or, with dryRun, plans) the chosen messages with
// replayer: one line per dead letter on stdout, the summary on stderr.
func (c *redriveChoice) redrive(ctx context.Context, replayer *replay.Replayer, dryRun bool, stdout, stderr io.Writer) error {
	notApplied := c.notDriven
	in := replay.Input{Messages: c.msgs, Outcome: func(i int, out replay.MessageOutcome) {
		switch {
		case out.Poison != nil:
			notApplied++
			fmt.Fprintf(stdout, "%s: poison again: %v\n", c.where[i], out.Poison)
		case out.Failed > 0:
			notApplied++
			fmt.Fprintf(stdout, "%s: failed: %d of %d ops given up on (see the log)\n", c.where[i], out.Failed, out.Ops)
		default:
			fmt.Fprintf(stdout, "%s: applied: %d ops, %d counter or set keys recounted or rebuilt at the end\n", c.where[i], out.Ops, out.EndOps)
		}
	}}
	what := "dlq redrive"
	var sum replay.Summary
	var err error
	if dryRun {
		what = "dlq redrive (dry run)"
		sum, err = replayer.DryRun(ctx, in, stdout)
		notApplied = 0
	} else {
		sum, err = replayer.Replay(ctx, in)
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s stopped: %s\n", what, sum)
		return fmt.Errorf("dlq redrive: %w", err)
	}
	fmt.Fprintf(stderr, "%s done: %d dead letters chosen, %d not re-driven: %s\n", what, c.chosen(), c.notDriven, sum)
	if !dryRun && (notApplied > 0 || sum.Failed > 0) {
		return fmt.Errorf("dlq redrive: %d of %d dead letters not applied, %d ops failed", notApplied, c.chosen(), sum.Failed)
	}
	return nil
}
