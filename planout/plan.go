// Package planout prints planned cache operations as JSON lines: the
// output of `cachewarden plan` (Stream) and of `replay --dry-run`
// (Writer). It decodes with package decode and plans with package
// rules, and does no I/O but to the writers it is given.
package planout

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/internal/jsonstr"
	"github.com/cachewarden/cachewarden/rules"
)

// Options tunes Stream. The zero value is ready to use.
type Options struct {
	// Log receives a debug record for every skipped line and a summary at
	// the end; nil discards them.
	Log *slog.Logger
}

// Summary counts what Stream read and wrote.
type Summary struct {
	// Lines is the number of input lines read, empty ones included.
	Lines int
	// Skipped counts lines that carry no row change: empty lines
	// (tombstones) and messages the decoder skips (DDL, heartbeats,
	// transaction markers). A message whose operation type the decoder
	// does not know is not skipped but Failed, as the daemon makes it
	// poison.
	Skipped int
	// Failed counts lines that could not be decoded or planned; each was
	// reported on the error stream.
	Failed int
	// Events is the number of row changes planned.
	Events int
	// Ops is the number of operations written.
	Ops int
	// Stats sums the planner's counts over the lines that were planned.
	Stats rules.PlanStats
}

// Stream reads newline-delimited CDC message values from r, decodes
// each line with dec, plans its row changes with rs and writes one JSON
// object per operation to stdout (the `cachewarden plan` contract):
//
//	{"line":4,"rule":"user-interests","op":"set_add","key":"shop:interests:42","member":"7"}
//
// Objects come in input order, then the planner's order; "member" is
// present for set_add/set_remove, "delta" for count, "tokens" for the
// coalesced set_append (never planned, listed for completeness). Lines may
// be up to decode.MaxLineBytes long (a longer one stops the stream with an error
// wrapping decode.ErrLineTooLong) and may end in "\n" or "\r\n". Lines that carry no
// row change are skipped: empty or blank lines and "null" (tombstones),
// DDL, heartbeats, transaction markers (see decode.Decoder.Decode). A line that
// fails to decode, an unknown operation type included, is reported on stderr as "line N: reason"; so is each
// row change that fails to plan, while the operations of the line's other
// rows are written, exactly as the daemon applies them.
//
// Keys and members are written as JSON strings exactly when they are valid
// UTF-8. JSON text cannot carry other bytes, so each byte that is not part
// of a valid UTF-8 sequence is written as U+FFFD, as encoding/json does;
// such keys arise from binary column values and from long keys cut at 200
// bytes in the middle of a character.
//
// Stream stops at the end of r, at the first read or write error
// (returned), or when ctx is done (returns ctx.Err()); it checks ctx
// between lines only. stdout is buffered internally and flushed before
// returning. dec and rs are only read, so several Stream calls may
// share them.
func Stream(ctx context.Context, r io.Reader, stdout, stderr io.Writer, dec *decode.Decoder, rs *rules.RuleSet, opts Options) (Summary, error) {
	p := NewWriter(rs, stdout, stderr, opts.Log)
	lines := decode.NewLineReader(r)
	var err error
	for {
		if err = ctx.Err(); err != nil {
			break
		}
		line, ok, rerr := lines.Next()
		if rerr != nil {
			err = fmt.Errorf("cdc: plan: read line %d: %w", p.sum.Lines+1, rerr)
			break
		}
		if !ok {
			break
		}
		if err = p.Line(dec, line, ""); err != nil {
			break
		}
	}
	if ferr := p.Flush(); ferr != nil && err == nil {
		err = ferr
	}
	p.log.Debug("plan finished", "lines", p.sum.Lines, "events", p.sum.Events, "ops", p.sum.Ops,
		"skipped", p.sum.Skipped, "failed", p.sum.Failed, "null_keys", p.sum.Stats.NullKeys, "unchanged", p.sum.Stats.Unchanged)
	return p.sum, err
}

// Writer plans messages one at a time and writes the `plan` output
// (see Stream): operations on one stream, "line N: reason" reports on
// the other. Stream and replay's dry run share it. Its buffers are
// reused from line to line. A Writer is not safe for concurrent use.
type Writer struct {
	rs      *rules.RuleSet
	out     *bufio.Writer
	err     io.Writer
	log     *slog.Logger
	decoded decode.Decoded
	ops     []rules.Op
	buf     []byte
	sum     Summary
	observe func(op *rules.Op)
}

// NewWriter returns a Writer that plans with rs and writes
// operations to stdout (buffered: call Flush) and reports to stderr. log
// receives a debug record for every skipped line; nil discards them.
func NewWriter(rs *rules.RuleSet, stdout, stderr io.Writer, log *slog.Logger) *Writer {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Writer{rs: rs, out: bufio.NewWriterSize(stdout, 64<<10), err: stderr, log: log}
}

// ObserveOps makes the Writer call fn with every op it writes for an
// input line, after writing it (replay's dry run collects the keys it
// would recount or rebuild at the end). fn must not keep op.
func (p *Writer) ObserveOps(fn func(op *rules.Op)) { p.observe = fn }

// EndOp writes an op that no input line planned (replay's final recounts
// and set rebuilds): a plan line without the "line" field.
func (p *Writer) EndOp(op *rules.Op) error {
	p.buf = AppendOp(p.buf[:0], 0, op)
	if _, err := p.out.Write(p.buf); err != nil {
		return fmt.Errorf("cdc: plan: write: %w", err)
	}
	return nil
}

// Summary returns the counts so far.
func (p *Writer) Summary() Summary { return p.sum }

// Flush writes any buffered operations.
func (p *Writer) Flush() error {
	if err := p.out.Flush(); err != nil {
		return fmt.Errorf("cdc: plan: write: %w", err)
	}
	return nil
}

// Line decodes value with dec as the next input line and writes its
// plan. where, when not empty, is written after "line N: " in error
// reports (replay names a Kafka message's coordinates there). It returns
// only write errors.
func (p *Writer) Line(dec *decode.Decoder, value []byte, where string) error {
	p.sum.Lines++
	n := p.sum.Lines
	if err := dec.Decode(value, rules.Position{Line: n}, &p.decoded); err != nil {
		return p.fail(n, where, err)
	}
	if p.decoded.Skip != "" {
		p.sum.Skipped++
		p.log.Debug("skipped line", "line", n, "reason", p.decoded.Skip)
		return nil
	}
	events := p.decoded.Events
	var stats rules.PlanStats
	var werr error
	var failed bool
	p.ops, _ = decode.PlanMessage(p.rs, events, p.ops[:0], &stats, func(_, _ int, err error) {
		if err != nil && werr == nil {
			failed = true
			werr = p.report(n, where, err)
		}
	})
	if failed {
		p.sum.Failed++
	}
	if werr != nil {
		return werr
	}
	p.sum.Events += len(events)
	p.sum.Stats.Add(stats)
	for i := range p.ops {
		p.buf = AppendOp(p.buf[:0], n, &p.ops[i])
		if _, err := p.out.Write(p.buf); err != nil {
			return fmt.Errorf("cdc: plan: write: %w", err)
		}
		if p.observe != nil {
			p.observe(&p.ops[i])
		}
	}
	p.sum.Ops += len(p.ops)
	return nil
}

// fail reports a bad line on the error stream.
func (p *Writer) fail(n int, where string, reason error) error {
	p.sum.Failed++
	return p.report(n, where, reason)
}

// report writes "line N: reason" on the error stream.
func (p *Writer) report(n int, where string, reason error) error {
	p.buf = append(p.buf[:0], "line "...)
	p.buf = strconv.AppendInt(p.buf, int64(n), 10)
	p.buf = append(p.buf, ": "...)
	if where != "" {
		p.buf = append(p.buf, where...)
		p.buf = append(p.buf, ": "...)
	}
	p.buf = append(p.buf, reason.Error()...)
	p.buf = append(p.buf, '\n')
	if _, err := p.err.Write(p.buf); err != nil {
		return fmt.Errorf("cdc: plan: write error report: %w", err)
	}
	return nil
}

// AppendOp appends op as one line of `cachewarden plan` output, newline
// included, with fields in the order line, rule, op, key, then member
// (set_add, set_remove), delta (count) or tokens (set_append). A line of
// 0 or less leaves the "line" field out (an op no input line planned). See
// Stream for how bytes that are not UTF-8 are written.
func AppendOp(dst []byte, line int, op *rules.Op) []byte {
	dst = append(dst, '{')
	if line > 0 {
		dst = append(dst, `"line":`...)
		dst = strconv.AppendInt(dst, int64(line), 10)
		dst = append(dst, ',')
	}
	dst = append(dst, `"rule":`...)
	name := ""
	if op.Rule != nil {
		name = op.Rule.Name
	}
	dst = jsonstr.Append(dst, name)
	dst = append(dst, `,"op":`...)
	dst = jsonstr.Append(dst, op.Kind.String())
	dst = append(dst, `,"key":`...)
	dst = jsonstr.Append(dst, op.Key)
	switch op.Kind {
	case rules.OpSetAdd, rules.OpSetRemove:
		dst = append(dst, `,"member":`...)
		dst = jsonstr.Append(dst, op.Member)
	case rules.OpCount:
		dst = append(dst, `,"delta":`...)
		dst = strconv.AppendInt(dst, op.Delta, 10)
	case rules.OpSetAppend:
		dst = append(dst, `,"tokens":`...)
		dst = jsonstr.Append(dst, op.Tokens)
	}
	if op.Legacy {
		dst = append(dst, `,"legacy":true`...)
	}
	return append(dst, "}\n"...)
}
