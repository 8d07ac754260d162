package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/cachewarden/cachewarden/consumer/cdc"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/consumer"
)

// replayCmd implements `replay`: re-apply a range of the CDC stream, or
// an NDJSON file of messages.
func (a *app) replayCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("replay",
		"replay -c FILE --from START [--to END] [--topics T,...] [--sets rebuild|append] [--dry-run] [--strict]\n"+
			"       cachewarden replay -c FILE --file NDJSON [--format FORMAT] [--table db.table] [--dry-run] [--strict]",
		"Re-reads a range of the CDC topics (JSON, or Avro with kafka.schema_registry),\n"+
			"or a file with one JSON message value per\n"+
			"line, and applies it as the daemon would, except that every counter a\n"+
			"change touches is recounted and every set rebuilt from its load query\n"+
			"(deleted when its rule has none), once per key at the end. Kafka\n"+
			"partitions are read directly: the consumer group is neither joined nor\n"+
			"committed.\n"+
			"\n"+
			"--sets append appends the set tokens instead, as the daemon does; it is\n"+
			"refused unless the replay reads Kafka to the live end (no --to) and the\n"+
			"config's consumer group has no active member (the daemons are stopped).\n"+
			"\n"+
			"START is \"earliest\", an RFC 3339 time (2026-05-01T12:00:00Z) or a list\n"+
			"topic:partition:offset,... (only the listed partitions are replayed). END is\n"+
			"a time or such a list (other partitions end at their end offset); the\n"+
			"default is each partition's end offset when the replay starts. Times\n"+
			"select records by timestamp: --from T1 --to T2 replays [T1, T2); offsets\n"+
			"are likewise included at the start and excluded at the end.\n"+
			"\n"+
			"--dry-run prints the planned ops as `cachewarden plan` does instead of\n"+
			"applying them, then one line per key recounted, rebuilt or deleted at the\n"+
			"end (op recount, set_rebuild or set_delete, no \"line\" field); for Kafka\n"+
			"input \"line\" is the message's ordinal in the replay (partitions in topic\n"+
			"and partition order). Messages that cannot be\n"+
			"decoded or planned are reported on stderr (\"line N: reason\" for a file,\n"+
			"\"topic:partition:offset: reason\" for Kafka), counted, and not sent to the\n"+
			"DLQ. Progress goes to stderr. Exit status 0, or 1 when the replay could\n"+
			"not finish, or with --strict when any message or op failed. Logs follow\n"+
			"the config's log section; the global --log-format and --log-level, when\n"+
			"given, override it.",
		stderr)
	var path string
	fs.StringVar(&path, "c", "", "config file (required)")
	fs.StringVar(&path, "config", "", "same as -c")
	fromFlag := fs.String("from", "", "where to start: earliest, an RFC 3339 time, or topic:partition:offset,...")
	toFlag := fs.String("to", "", "where to end (excluded): an RFC 3339 time or topic:partition:offset,... (default: the end offsets at start)")
	topicsFlag := fs.String("topics", "", "comma-separated topics to replay (default: the config's kafka.topics); with --file, the one topic the file comes from (its topic_formats/topic_tables apply)")
	file := fs.String("file", "", "replay this file of JSON lines (\"-\": stdin) instead of Kafka")
	formatName := fs.String("format", "", "JSON message format of --file: auto, debezium, debezium-flat, maxwell or canal (default: the config's)")
	table := fs.String("table", "", "db.table of --file's flattened rows that name no table")
	dryRun := fs.Bool("dry-run", false, "print the planned ops on stdout instead of applying them")
	setsMode := fs.String("sets", "rebuild", "rebuild: rebuild (or delete) every set the replay touches; append: append its set tokens (only to the live end with the daemons stopped)")
	strict := fs.Bool("strict", false, "exit with status 1 when any message or op failed")
	batch := fs.Int("batch", 0, "messages per batch (default: the config's batch.max_events)")
	parallel := fs.Int("parallel", consumer.DefaultReplayParallel, "partitions read and applied at once")
	maxRecounts := fs.Int("max-recount-keys", consumer.DefaultMaxPendingRecounts, "counter keys collected before their recounts run early (bounds memory)")
	progressEvery := fs.Duration("progress", consumer.DefaultProgressInterval, "interval of progress lines when stderr is not a terminal (0: none); a terminal gets one line updated in place")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("replay: unexpected argument %q", fs.Arg(0))
	}
	if path == "" {
		fs.Usage()
		return usageErrorf("replay: -c FILE is required")
	}
	var from, to consumer.ReplayBound
	var err error
	switch {
	case *file != "" && (*fromFlag != "" || *toFlag != ""):
		return usageErrorf("replay: --file replays a file; --from and --to are for Kafka")
	case *file == "" && *fromFlag == "":
		fs.Usage()
		return usageErrorf("replay: give --from (Kafka) or --file")
	case *file == "" && (*formatName != "" || *table != ""):
		return usageErrorf("replay: --format and --table apply to --file only; Kafka topics use the config's formats")
	case *formatName == "avro":
		return usageErrorf("replay: --format avro: a --file holds JSON lines; replay an Avro topic from Kafka with --from")
	case *batch < 0 || *parallel < 1 || *maxRecounts < 1:
		return usageErrorf("replay: --batch must not be negative, --parallel and --max-recount-keys must be at least 1")
	case *progressEvery < 0:
		return usageErrorf("replay: --progress must not be negative")
	case *setsMode != "rebuild" && *setsMode != "append":
		return usageErrorf("replay: --sets %q: want rebuild or append", *setsMode)
	}
	setAppend := *setsMode == "append"
	if *fromFlag != "" {
		if from, err = consumer.ParseReplayBound(*fromFlag); err != nil {
			return usageErrorf("replay: --from: %v; %s", err, replayStartForms)
		}
	}
	if *toFlag != "" {
		if to, err = consumer.ParseReplayBound(*toFlag); err != nil {
			return usageErrorf("replay: --to: %v; %s", err, replayEndForms)
		}
		if to.Earliest {
			return usageErrorf("replay: --to: earliest is not an end; %s", replayEndForms)
		}
		if err := checkReplayOrder(from, to); err != nil {
			return usageErrorf("replay: %v", err)
		}
	}
	if setAppend && !*dryRun {
		if err := consumer.SetAppendRange(to, *file != ""); err != nil {
			return usageErrorf("replay: --sets append refused: %v (without --sets append the sets are rebuilt)", err)
		}
	}
	var topics []string
	if *topicsFlag != "" {
		for t := range strings.SplitSeq(*topicsFlag, ",") {
			if t = strings.TrimSpace(t); t != "" {
				topics = append(topics, t)
			}
		}
	}
	if *file != "" && len(topics) > 1 {
		return usageErrorf("replay: --file comes from one topic; --topics names %d", len(topics))
	}
	if *table != "" {
		if db, tbl, ok := strings.Cut(*table, "."); !ok || db == "" || tbl == "" {
			return usageErrorf("replay: --table %q: want db.table", *table)
		}
	}
	if *formatName != "" {
		if _, err := cdc.ParseFormat(*formatName); err != nil {
			return usageErrorf("replay: --format: %v", err)
		}
	}

	cfg, err := config.Load(path)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return errReported
	}
	interval := *progressEvery
	if interval == 0 {
		interval = -1 // ReplayProgress: no periodic lines
	}
	progress := consumer.NewReplayProgress(stderr, isTerminal(stderr), interval)
	out := progress.Writer()
	log := a.configLogger(cfg.Log, out)

	stack, err := consumer.NewStack(cfg, log, consumer.StackOptions{NoDLQ: true, RecountReason: "replay", MemoryRebumps: true})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	defer stack.Close()

	var in consumer.ReplayInput
	if *file != "" {
		topic := ""
		if len(topics) == 1 {
			topic = topics[0]
		}
		if in.Decoder, err = consumer.ReplayFileDecoder(cfg.Kafka, topic, *formatName, *table); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		if *file == "-" {
			in.File = a.stdin
		} else {
			f, err := os.Open(*file)
			if err != nil {
				return fmt.Errorf("replay: %w", err)
			}
			defer f.Close()
			// The line count is the progress total; a pipe has none.
			if st, err := f.Stat(); err == nil && st.Mode().IsRegular() {
				if in.FileLines, err = countLines(f); err != nil {
					return fmt.Errorf("replay: %s: %w", *file, err)
				}
			}
			in.File = f
		}
	} else {
		if len(topics) == 0 && len(from.Offsets) == 0 {
			topics = cfg.Kafka.Topics
		}
		if in.Ranges, err = consumer.ResolveReplayRanges(ctx, stack.Kafka, topics, from, to, log); err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		var n int64
		for _, r := range in.Ranges {
			n += r.Len()
		}
		log.Info("replay ranges", "partitions", len(in.Ranges), "messages", n, "from", from.String(), "to", to.String())
		for _, r := range in.Ranges {
			log.Debug("replay range", "range", r.String())
		}
	}

	// Appending old set tokens is safe only to the live end with no
	// daemon applying newer ones; checked again when the replay ends.
	checkSetAppend := func() error {
		if !setAppend || *dryRun {
			return nil
		}
		return consumer.CheckSetAppend(ctx, stack.Kafka, cfg.Kafka.Group, to, *file != "")
	}
	if err := checkSetAppend(); err != nil {
		if errors.Is(err, consumer.ErrSetAppendUnsafe) {
			return usageErrorf("replay: --sets append refused: %v (without --sets append the sets are rebuilt)", err)
		}
		return fmt.Errorf("replay: --sets append: %w", err)
	}

	batchSize := *batch
	if batchSize == 0 {
		batchSize = cfg.Batch.MaxEvents
	}
	replayer, err := consumer.NewReplayer(consumer.ReplayConfig{
		Pipeline:           stack.Pipeline,
		Kafka:              stack.Kafka,
		BatchSize:          batchSize,
		Parallel:           *parallel,
		MaxPendingRecounts: *maxRecounts,
		SetAppend:          setAppend,
		Report:             out,
		Progress:           progress,
		Logger:             log,
	})
	if err != nil {
		return fmt.Errorf("replay: %w", err)
	}
	var sum consumer.ReplaySummary
	what := "replay"
	if *dryRun {
		what = "replay (dry run)"
		sum, err = replayer.DryRun(ctx, in, stdout)
	} else {
		sum, err = replayer.Replay(ctx, in)
	}
	if err != nil {
		fmt.Fprintf(out, "%s stopped: %s\n", what, sum)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return fmt.Errorf("replay: interrupted: %w", context.Cause(ctx))
		}
		return fmt.Errorf("replay: %w", err)
	}
	fmt.Fprintf(out, "%s done: %s\n", what, sum)
	if err := checkSetAppend(); err != nil {
		return fmt.Errorf("replay: --sets append: after the replay: %w; the sets it touched may be wrong: replay the same range without --sets append to rebuild them", err)
	}
	if *strict && sum.Failures() > 0 {
		return fmt.Errorf("replay: %d poison messages and %d failed ops (--strict)", sum.Poison, sum.Failed)
	}
	return nil
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
