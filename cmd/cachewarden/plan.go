package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/planout"

	"github.com/cachewarden/cachewarden/rules/rulefile"
)

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }

func (l *stringList) Set(s string) error {
	if s == "" {
		return fmt.Errorf("empty value")
	}
	*l = append(*l, s)
	return nil
}

// planHelp is the description `cachewarden plan -h` prints.
const planHelp = `Reads one CDC message value per line from stdin, as JSON (Debezium, flattened
Debezium, Maxwell, Canal), and prints one JSON object per planned cache
operation, e.g.
  {"line":4,"rule":"user-interests","op":"set_add","key":"shop:interests:42","member":"7"}
Empty lines are tombstones and are skipped. A line that cannot be decoded or
planned is reported on stderr as "line N: reason" and skipped; so is a message
whose operation type (Debezium op, Maxwell or Canal type) is not one it knows,
which the daemon sends to the dead-letter topic as poison.
Avro messages (Confluent-framed, with a schema registry) are binary, not
lines: ` + "`cachewarden replay -c FILE --from START --dry-run`" + ` plans an Avro
topic from Kafka.`

// planCmd implements `plan`: the planner run over messages from stdin.
func (a *app) planCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", "plan --rules PATH [--rules PATH]... [--format FORMAT] [--table db.table] [--strict] < messages.ndjson", planHelp, stderr)
	var rulePaths stringList
	fs.Var(&rulePaths, "rules", "rule file, or directory of *.yaml/*.yml files (repeatable; required)")
	formatName := fs.String("format", decode.FormatAuto.String(), "message format: "+decode.Alternatives(decode.FileNames()))
	table := fs.String("table", "", "db.table of flattened rows that name no table (__db/__table)")
	strict := fs.Bool("strict", false, "exit with status 1 when any line failed")
	if err := fs.Parse(args); err != nil {
		return flagError(err)
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return usageErrorf("plan: unexpected argument %q (messages are read from stdin)", fs.Arg(0))
	}
	if len(rulePaths) == 0 {
		fs.Usage()
		return usageErrorf("plan: --rules is required")
	}
	if *table != "" {
		if db, tbl, ok := strings.Cut(*table, "."); !ok || db == "" || tbl == "" {
			return usageErrorf("plan: --table %q: want db.table", *table)
		}
	}
	format, err := decode.ParseFileFormat(*formatName)
	switch {
	case errors.Is(err, decode.ErrNotInFile):
		return usageErrorf("plan: --format %s: plan reads JSON lines; plan an Avro topic from Kafka with `cachewarden replay -c FILE --from START --dry-run`", *formatName)
	case err != nil:
		return usageErrorf("plan: --format: %v", err)
	}
	rs, err := rulefile.LoadPaths(rulePaths...)
	if err != nil {
		return reportLoadError(stderr, err)
	}
	dec := &decode.Decoder{Format: format, Table: *table}

	// PlanStream checks ctx between lines, but a read from a terminal or
	// pipe blocks; on a signal stop waiting and let the process exit.
	type result struct {
		sum planout.Summary
		err error
	}
	done := make(chan result, 1)
	go func() {
		sum, err := planout.Stream(ctx, a.stdin, stdout, stderr, dec, rs, planout.Options{Log: a.log})
		done <- result{sum, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-ctx.Done():
		return fmt.Errorf("plan: interrupted: %w", context.Cause(ctx))
	}
	if res.err != nil {
		return fmt.Errorf("plan: %w", res.err)
	}
	if *strict && res.sum.Failed > 0 {
		return fmt.Errorf("plan: %d of %d lines failed (--strict)", res.sum.Failed, res.sum.Lines)
	}
	return nil
}
