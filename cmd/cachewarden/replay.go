package main

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/decode"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/source/binlog"
	"github.com/cachewarden/cachewarden/source/kafka"
	"github.com/cachewarden/cachewarden/source/replay"
	"github.com/cachewarden/cachewarden/wiring"
)

// replayCmd implements `replay`: re-apply a range of the CDC stream, or
// an NDJSON file of messages.
func (a *app) replayCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o replayOptions
	fs := o.flagSet(stderr)
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if err := o.check(fs); err != nil {
		return err
	}

	cfg, err := loadConfig(*o.path, stderr)
	if err != nil {
		return err
	}
	if err := o.checkBounds(cfg.Source); err != nil {
		return err
	}
	interval := o.progressEvery
	if interval == 0 {
		interval = -1 // ReplayProgress: no periodic lines
	}
	progress := replay.NewProgress(stderr, isTerminal(stderr), interval)
	out := progress.Writer()
	log := a.configLogger(cfg.Log, out)

	stack, err := wiring.NewStack(cfg, log, wiring.StackOptions{NoDLQ: true, RecountReason: "replay", MemoryRebumps: true, Build: binaryBuild()})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer stack.Close()

	in, closeInput, err := a.replayInput(ctx, &o, cfg, stack, log)
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer closeInput()

	if err := o.checkSetAppend(ctx, stack, cfg); err != nil {
		if errors.Is(err, kafka.ErrSetAppendUnsafe) {
			return usageErrorf("replay: --sets append refused: %v (without --sets append the sets are rebuilt)", err)
		}
		return fmt.Errorf("replay: --sets append: %w", err)
	}
	replayer, err := replay.New(o.replayConfig(cfg, stack, progress, log))
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	sum, err := o.run(ctx, replayer, in, stdout, out)
	if err != nil {
		return err
	}
	if err := o.checkSetAppend(ctx, stack, cfg); err != nil {
		return fmt.Errorf("replay: --sets append: after the replay: %w; the sets it touched may be wrong: replay the same range without --sets append to rebuild them", err)
	}
	if o.strict && sum.Failures() > 0 {
		return fmt.Errorf("replay: %d poison messages and %d failed ops (--strict)", sum.Poison, sum.Failed)
	}
	return nil
}

// checkSetAppend checks, with --sets append and no --dry-run, that
// appending old set tokens is safe: only to the live end with no daemon
// applying newer ones. replayCmd checks before and again after the replay.
func (o *replayOptions) checkSetAppend(ctx context.Context, stack *wiring.Stack, cfg *config.Config) error {
	if !o.setAppend || o.dryRun {
		return nil
	}
	return kafka.CheckSetAppend(ctx, stack.Kafka, cfg.Kafka.Group, o.to, o.file != "")
}

// replayConfig is the replayer's configuration from the flags, the config
// (batch.max_events unless --batch) and the stack; it reports through
// progress.
func (o *replayOptions) replayConfig(cfg *config.Config, stack *wiring.Stack, progress *replay.Progress, log *slog.Logger) replay.Config {
	batchSize := o.batch
	if batchSize == 0 {
		batchSize = cfg.Batch.MaxEvents
	}
	return replay.Config{
		Pipeline:           stack.Pipeline,
		BatchSize:          batchSize,
		Parallel:           o.parallel,
		MaxPendingRecounts: o.maxRecounts,
		SetAppend:          o.setAppend,
		Report:             progress.Writer(),
		Progress:           progress,
		Logger:             log,
	}
}

// run replays in (or, with --dry-run, prints its plan on stdout) and
// writes the summary to out.
func (o *replayOptions) run(ctx context.Context, replayer *replay.Replayer, in replay.Input, stdout, out io.Writer) (replay.Summary, error) {
	var sum replay.Summary
	var err error
	what := "replay"
	if o.dryRun {
		what = "replay (dry run)"
		sum, err = replayer.DryRun(ctx, in, stdout)
	} else {
		sum, err = replayer.Replay(ctx, in)
	}
	if err != nil {
		fmt.Fprintf(out, "%s stopped: %s\n", what, sum)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return sum, fmt.Errorf("replay: interrupted: %w", context.Cause(ctx))
		}
		if errors.Is(err, decode.ErrLineTooLong) {
			return sum, fmt.Errorf("replay: %s: %w", o.file, err)
		}
		return sum, fmt.Errorf("replay: %w", err)
	}
	fmt.Fprintf(out, "%s done: %s\n", what, sum)
	if sum.Messages == 0 {
		fmt.Fprintf(out, "%s: the range holds no messages: nothing was replayed (the lines above name the bounds of the range: each partition's, or the binary log's)\n", what)
	}
	return sum, nil
}

// replayOptions are replay's flags (fromFlag to setsMode as given), and
// what check makes of them.
type replayOptions struct {
	path                                   *string
	fromFlag, toFlag, topicsFlag, setsMode string
	file, formatName, table                string
	dryRun, strict                         bool
	batch, parallel, maxRecounts           int
	progressEvery                          time.Duration

	// Set by check.
	from, to kafka.ReplayBound
	binFrom  binlog.Bound // --from and --to with source binlog
	binTo    binlog.Bound
	// kafkaErr and binlogErr are the usage mistakes of --from, --to
	// and --sets for each source (see parseBounds).
	kafkaErr, binlogErr error
	topics              []string
	setAppend           bool
	// format is --format, nil without it (the config's format applies).
	format *decode.Format
}

// replayHelp is the description `cachewarden replay -h` prints.
const replayHelp = `Re-reads a range of the CDC topics (JSON, or Avro with kafka.schema_registry),
or a file with one JSON message value per
line, and applies it as the daemon would, except that every counter a
change touches is recounted and every set rebuilt from its load query
(deleted when its rule has none), once per key at the end. Kafka
partitions are read directly: the consumer group is neither joined nor
committed.

--sets append appends the set tokens instead, as the daemon does; it is
refused unless the replay reads Kafka to the live end (no --to) and the
config's consumer group has no active member (the daemons are stopped).

START is "earliest", an RFC 3339 time (2026-05-01T12:00:00Z) or a list
topic:partition:offset,... (only the listed partitions are replayed). END is
a time or such a list (other partitions end at their end offset); the
default is each partition's end offset when the replay starts. Times
select records by timestamp: --from T1 --to T2 replays [T1, T2); offsets
are likewise included at the start and excluded at the end.

With source binlog the source server's binary log is read instead, as a
replica with a random server id from 2147483648 up (never binlog.server_id).
START is "earliest" (the oldest log the server has), gtid:SET (the
transactions not in SET), file:NAME:POS (from that position) or an RFC 3339
time (from the first transaction that began at or after it; the log is read
from its oldest file to find it). END is gtid:SET (no transaction outside
SET), file:NAME:POS (no transaction ending after it) or a time (up to the
first transaction that began at or after it); every range also ends at the
server's position when the replay starts. Batches hold whole transactions;
progress counts messages. --topics, --dry-run and --sets append are for
Kafka only.

--dry-run prints the planned ops as ` + "`cachewarden plan`" + ` does instead of
applying them, then one line per key recounted, rebuilt or deleted at the
end (op recount, set_rebuild or set_delete, no "line" field); for Kafka
input "line" is the message's ordinal in the replay (partitions in topic
and partition order). Messages that cannot be
decoded or planned are reported on stderr ("line N: reason" for a file,
"topic:partition:offset: reason" for Kafka), counted, and not sent to the
DLQ. Progress goes to stderr. Exit status 0, or 1 when the replay could
not finish, or with --strict when any message or op failed. Logs follow
the config's log section; the global --log-format and --log-level, when
given, override it.`

// flagSet returns replay's flags, bound to o.
func (o *replayOptions) flagSet(stderr io.Writer) *flag.FlagSet {
	fs := newFlagSet("replay", "replay -c FILE --from START [--to END] [--topics T,...] [--sets rebuild|append] [--dry-run] [--strict]\n"+
		"       cachewarden replay -c FILE --from START [--to END] [--strict]   (source binlog)\n"+
		"       cachewarden replay -c FILE --file NDJSON [--format FORMAT] [--table db.table] [--dry-run] [--strict]", replayHelp, stderr)
	o.path = configFlag(fs)
	fs.StringVar(&o.fromFlag, "from", "", "where to start: earliest, an RFC 3339 time, or topic:partition:offset,... (source binlog: earliest, a time, gtid:SET or file:NAME:POS)")
	fs.StringVar(&o.toFlag, "to", "", "where to end (excluded): an RFC 3339 time or topic:partition:offset,... (default: the end offsets at start; source binlog: a time, gtid:SET or file:NAME:POS, default the server's position at start)")
	fs.StringVar(&o.topicsFlag, "topics", "", "comma-separated topics to replay (default: the config's kafka.topics); with --file, the one topic the file comes from (its topic_formats/topic_tables apply)")
	fs.StringVar(&o.file, "file", "", "replay this file of JSON lines (\"-\": stdin) instead of Kafka")
	fs.StringVar(&o.formatName, "format", "", "JSON message format of --file: "+decode.Alternatives(decode.FileNames())+" (default: the config's)")
	fs.StringVar(&o.table, "table", "", "db.table of --file's flattened rows that name no table")
	fs.BoolVar(&o.dryRun, "dry-run", false, "print the planned ops on stdout instead of applying them")
	fs.StringVar(&o.setsMode, "sets", "rebuild", "rebuild: rebuild (or delete) every set the replay touches; append: append its set tokens (only to the live end with the daemons stopped)")
	fs.BoolVar(&o.strict, "strict", false, "exit with status 1 when any message or op failed")
	fs.IntVar(&o.batch, "batch", 0, "messages per batch (default: the config's batch.max_events)")
	fs.IntVar(&o.parallel, "parallel", replay.DefaultParallel, "partitions read and applied at once")
	fs.IntVar(&o.maxRecounts, "max-recount-keys", replay.DefaultMaxPendingRecounts, "counter keys collected before their recounts run early (bounds memory)")
	fs.DurationVar(&o.progressEvery, "progress", replay.DefaultProgressInterval, "interval of progress lines when stderr is not a terminal (0: none); a terminal gets one line updated in place")
	return fs
}

// check reports the first usage mistake in the parsed flags, and sets
// from, to, topics and setAppend.
func (o *replayOptions) check(fs *flag.FlagSet) error {
	if err := checkConfigArgs(fs, "replay", *o.path); err != nil {
		return err
	}
	switch {
	case o.file != "" && (o.fromFlag != "" || o.toFlag != ""):
		return usageErrorf("replay: --file replays a file; --from and --to are for Kafka")
	case o.file == "" && o.fromFlag == "":
		fs.Usage()
		return usageErrorf("replay: give --from (Kafka or the binary log) or --file")
	case o.file == "" && (o.formatName != "" || o.table != ""):
		return usageErrorf("replay: --format and --table apply to --file only; Kafka topics use the config's formats")
	case o.batch < 0 || o.parallel < 1 || o.maxRecounts < 1:
		return usageErrorf("replay: --batch must not be negative, --parallel and --max-recount-keys must be at least 1")
	case o.progressEvery < 0:
		return usageErrorf("replay: --progress must not be negative")
	case o.setsMode != "rebuild" && o.setsMode != "append":
		return usageErrorf("replay: --sets %q: want rebuild or append", o.setsMode)
	}
	o.setAppend = o.setsMode == "append"
	if err := o.parseBounds(); err != nil {
		return err
	}
	if o.topicsFlag != "" {
		for t := range strings.SplitSeq(o.topicsFlag, ",") {
			if t = strings.TrimSpace(t); t != "" {
				o.topics = append(o.topics, t)
			}
		}
	}
	if o.file != "" && len(o.topics) > 1 {
		return usageErrorf("replay: --file comes from one topic; --topics names %d", len(o.topics))
	}
	if o.table != "" {
		if db, tbl, ok := strings.Cut(o.table, "."); !ok || db == "" || tbl == "" {
			return usageErrorf("replay: --table %q: want db.table", o.table)
		}
	}
	if o.formatName != "" {
		f, err := decode.ParseFileFormat(o.formatName)
		switch {
		case errors.Is(err, decode.ErrNotInFile):
			return usageErrorf("replay: --format %s: a --file holds JSON lines; replay an Avro topic from Kafka with --from", o.formatName)
		case err != nil:
			return usageErrorf("replay: --format: %v", err)
		}
		o.format = &f
	}
	return nil
}

// parseBounds parses --from and --to in the forms of both sources before
// the config (which names the source) is loaded: a mistake in both
// forms is reported at once, in the binary log's words when a flag has
// the form of a binary log position (gtid:, file:), else in Kafka's;
// checkBounds reports the one of the config's source.
func (o *replayOptions) parseBounds() error {
	o.kafkaErr = o.checkKafkaBounds()
	o.binlogErr = o.parseBinlogBounds()
	if o.kafkaErr == nil || o.binlogErr == nil {
		return nil
	}
	for _, f := range []string{o.fromFlag, o.toFlag} {
		if strings.HasPrefix(f, "gtid:") || strings.HasPrefix(f, "file:") {
			return o.binlogErr
		}
	}
	return o.kafkaErr
}

// checkBounds reports, once the config is loaded, the mistake in --from
// and --to in the forms of the config's source, and the flags that
// source does not take.
func (o *replayOptions) checkBounds(source config.SourceKind) error {
	if source == config.SourceBinlog {
		if o.binlogErr != nil {
			return o.binlogErr
		}
		return o.checkBinlogFlags()
	}
	return o.kafkaErr
}

// checkKafkaBounds sets from and to from --from and --to with the Kafka
// source.
func (o *replayOptions) checkKafkaBounds() error {
	var err error
	if o.fromFlag != "" {
		if o.from, err = kafka.ParseReplayBound(o.fromFlag); err != nil {
			return usageErrorf("replay: --from: %v; %s", err, replayStartForms)
		}
		if err := checkReplayStart(o.from, time.Now()); err != nil {
			return usageErrorf("replay: %v", err)
		}
	}
	if o.toFlag != "" {
		if o.to, err = kafka.ParseReplayBound(o.toFlag); err != nil {
			return usageErrorf("replay: --to: %v; %s", err, replayEndForms)
		}
		if o.to.Earliest {
			return usageErrorf("replay: --to: earliest is not an end; %s", replayEndForms)
		}
		if err := checkReplayOrder(o.from, o.to); err != nil {
			return usageErrorf("replay: %v", err)
		}
	}
	if o.setAppend && !o.dryRun {
		if err := kafka.SetAppendRange(o.to, o.file != ""); err != nil {
			return usageErrorf("replay: --sets append refused: %v (without --sets append the sets are rebuilt)", err)
		}
	}
	return nil
}

// replayInput opens what o replays: the --file (with its line count, the
// progress total, when it is a regular file), or the Kafka ranges between
// --from and --to. The returned function closes the file.
func (a *app) replayInput(ctx context.Context, o *replayOptions, cfg *config.Config, stack *wiring.Stack, log *slog.Logger) (replay.Input, func(), error) {
	var in replay.Input
	if o.file == "" && cfg.Source == config.SourceBinlog {
		return a.binlogReplayInput(ctx, o, cfg, log)
	}
	if o.file == "" {
		topics := o.topics
		if len(topics) == 0 && len(o.from.Offsets) == 0 {
			topics = cfg.Kafka.Topics
		}
		var err error
		ranges, err := kafka.ResolveReplayRanges(ctx, stack.Kafka, topics, o.from, o.to, log)
		if err != nil {
			return in, nil, err
		}
		var n int64
		for _, r := range ranges {
			n += r.Len()
			log.Debug("replay range", "range", r.String())
		}
		log.Info("replay ranges", "partitions", len(ranges), "messages", n, "from", o.from.String(), "to", o.to.String())
		for _, st := range kafka.RangeStreams(stack.Kafka, ranges, 0, log) {
			in.Streams = append(in.Streams, st)
		}
		return in, func() {}, nil
	}
	topic := ""
	if len(o.topics) == 1 {
		topic = o.topics[0]
	}
	var err error
	if in.Decoder, err = wiring.ReplayFileDecoder(cfg.Kafka, topic, o.format, o.table); err != nil {
		return in, nil, err
	}
	if o.file == "-" {
		in.File = a.stdin
		return in, func() {}, nil
	}
	f, err := os.Open(o.file)
	if err != nil {
		return in, nil, err
	}
	// The line count is the progress total; a pipe has none.
	if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
		if in.FileLines, err = countLines(f); err != nil {
			f.Close()
			return in, nil, fmt.Errorf("%s: %w", o.file, err)
		}
	}
	in.File = f
	return in, func() { f.Close() }, nil
}

// binlogReplayInput opens the range of the source server's binary log
// between --from and --to. The returned function closes the connection.
func (a *app) binlogReplayInput(ctx context.Context, o *replayOptions, cfg *config.Config, log *slog.Logger) (replay.Input, func(), error) {
	var in replay.Input
	db, err := sql.Open("mysql", cfg.Binlog.DSN)
	if err != nil {
		return in, nil, fmt.Errorf("binlog.dsn: %w", err)
	}
	db.SetMaxOpenConns(2)
	qctx, cancel := context.WithTimeout(ctx, binlog.DefaultQueryTimeout)
	defer cancel()
	rs, err := binlog.OpenRange(qctx, binlog.RangeConfig{
		Stream: binlog.Config{DSN: cfg.Binlog.DSN, ServerID: uint32(cfg.Binlog.ServerID), MaxEvents: cfg.Batch.MaxEvents},
		From:   o.binFrom, To: o.binTo, Tables: ruleTables(cfg),
	}, db, log.With("component", "binlog-replay"))
	if err != nil {
		db.Close()
		return in, nil, err
	}
	log.Info("replay range", "range", rs.String())
	in.Streams = []replay.Stream{rs}
	return in, func() { db.Close() }, nil
}

// ruleTables reports whether a rule of the config matches db.table: a
// replay of the binary log maps only those tables' rows.
func ruleTables(cfg *config.Config) func(db, table string) bool {
	set := make(map[string]bool)
	for _, t := range cfg.RuleSet.Tables() {
		set[t] = true
	}
	return func(db, table string) bool { return set[db+"."+table] || set[table] }
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// countLines counts the lines of f the way replay reads them (a last
// line without a newline counts) and rewinds f.
func countLines(f *os.File) (int64, error) {
	buf := make([]byte, 64<<10)
	var n int64
	var last byte = '\n'
	for {
		k, err := f.Read(buf)
		if k > 0 {
			n += int64(bytes.Count(buf[:k], []byte{'\n'}))
			last = buf[k-1]
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, err
		}
	}
	if last != '\n' {
		n++
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	return n, nil
}
