package decode

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"unicode/utf8"

	"github.com/cachewarden/cachewarden/rules"
)

// PlanOptions tunes PlanStream. The zero value is ready to use.
type PlanOptions struct {
	// Log receives a debug record for every skipped line and a summary at
	// the end; nil discards them.
	Log *slog.Logger
}

// PlanSummary counts what PlanStream read and wrote.
type PlanSummary struct {
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

// PlanStream reads newline-delimited CDC message values from r, decodes
// each line with dec, plans its row changes with rs and writes one JSON
// object per operation to stdout (the `cachewarden plan` contract):
//
//	{"line":4,"rule":"user-interests","op":"set_add","key":"shop:interests:42","member":"7"}
//
// Objects come in input order, then the planner's order; "member" is
// present for set_add/set_remove, "delta" for count, "tokens" for the
// coalesced set_append (never planned, listed for completeness). Lines may
// be up to MaxLineBytes long (a longer one stops the stream with an error
// wrapping ErrLineTooLong) and may end in "\n" or "\r\n". Lines that carry no
// row change are skipped: empty or blank lines and "null" (tombstones),
// DDL, heartbeats, transaction markers (see Decoder.Decode). A line that
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
// PlanStream stops at the end of r, at the first read or write error
// (returned), or when ctx is done (returns ctx.Err()); it checks ctx
// between lines only. stdout is buffered internally and flushed before
// returning. dec and rs are only read, so several PlanStream calls may
// share them.
func PlanStream(ctx context.Context, r io.Reader, stdout, stderr io.Writer, dec *Decoder, rs *rules.RuleSet, opts PlanOptions) (PlanSummary, error) {
	p := NewPlanWriter(rs, stdout, stderr, opts.Log)
	lines := NewLineReader(r)
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

// PlanWriter plans messages one at a time and writes the `plan` output
// (see PlanStream): operations on one stream, "line N: reason" reports on
// the other. PlanStream and replay's dry run share it. Its buffers are
// reused from line to line. A PlanWriter is not safe for concurrent use.
type PlanWriter struct {
	rs      *rules.RuleSet
	out     *bufio.Writer
	err     io.Writer
	log     *slog.Logger
	decoded Decoded
	ops     []rules.Op
	buf     []byte
	sum     PlanSummary
	observe func(op *rules.Op)
}

// NewPlanWriter returns a PlanWriter that plans with rs and writes
// operations to stdout (buffered: call Flush) and reports to stderr. log
// receives a debug record for every skipped line; nil discards them.
func NewPlanWriter(rs *rules.RuleSet, stdout, stderr io.Writer, log *slog.Logger) *PlanWriter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &PlanWriter{rs: rs, out: bufio.NewWriterSize(stdout, 64<<10), err: stderr, log: log}
}

// ObserveOps makes the PlanWriter call fn with every op it writes for an
// input line, after writing it (replay's dry run collects the keys it
// would recount or rebuild at the end). fn must not keep op.
func (p *PlanWriter) ObserveOps(fn func(op *rules.Op)) { p.observe = fn }

// EndOp writes an op that no input line planned (replay's final recounts
// and set rebuilds): a plan line without the "line" field.
func (p *PlanWriter) EndOp(op *rules.Op) error {
	p.buf = AppendPlanOp(p.buf[:0], 0, op)
	if _, err := p.out.Write(p.buf); err != nil {
		return fmt.Errorf("cdc: plan: write: %w", err)
	}
	return nil
}

// Summary returns the counts so far.
func (p *PlanWriter) Summary() PlanSummary { return p.sum }

// Flush writes any buffered operations.
func (p *PlanWriter) Flush() error {
	if err := p.out.Flush(); err != nil {
		return fmt.Errorf("cdc: plan: write: %w", err)
	}
	return nil
}

// Line decodes value with dec as the next input line and writes its
// plan. where, when not empty, is written after "line N: " in error
// reports (replay names a Kafka message's coordinates there). It returns
// only write errors.
func (p *PlanWriter) Line(dec *Decoder, value []byte, where string) error {
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
	p.ops, _ = PlanMessage(p.rs, events, p.ops[:0], &stats, func(_, _ int, err error) {
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
		p.buf = AppendPlanOp(p.buf[:0], n, &p.ops[i])
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
func (p *PlanWriter) fail(n int, where string, reason error) error {
	p.sum.Failed++
	return p.report(n, where, reason)
}

// report writes "line N: reason" on the error stream.
func (p *PlanWriter) report(n int, where string, reason error) error {
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

// AppendPlanOp appends op as one line of `cachewarden plan` output, newline
// included, with fields in the order line, rule, op, key, then member
// (set_add, set_remove), delta (count) or tokens (set_append). A line of
// 0 or less leaves the "line" field out (an op no input line planned). See
// PlanStream for how bytes that are not UTF-8 are written.
func AppendPlanOp(dst []byte, line int, op *rules.Op) []byte {
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
	dst = appendJSONString(dst, name)
	dst = append(dst, `,"op":`...)
	dst = appendJSONString(dst, op.Kind.String())
	dst = append(dst, `,"key":`...)
	dst = appendJSONString(dst, op.Key)
	switch op.Kind {
	case rules.OpSetAdd, rules.OpSetRemove:
		dst = append(dst, `,"member":`...)
		dst = appendJSONString(dst, op.Member)
	case rules.OpCount:
		dst = append(dst, `,"delta":`...)
		dst = strconv.AppendInt(dst, op.Delta, 10)
	case rules.OpSetAppend:
		dst = append(dst, `,"tokens":`...)
		dst = appendJSONString(dst, op.Tokens)
	}
	if op.Legacy {
		dst = append(dst, `,"legacy":true`...)
	}
	return append(dst, "}\n"...)
}

const lowerHex = "0123456789abcdef"

// appendJSONString appends s as a JSON string: '"' and '\\' escaped,
// control bytes and U+2028/U+2029 as \uXXXX, each invalid UTF-8 byte as
// U+FFFD, everything else as is.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', lowerHex[c>>4], lowerHex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', lowerHex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// MaxLineBytes bounds a line of LineReader, its "\n" or "\r\n" not
// counted: 16 MiB, far beyond a Kafka message's default limit (1 MiB),
// so that an input without newlines (/dev/zero) is refused once that
// much is read.
const MaxLineBytes = 16 << 20

// ErrLineTooLong is matched (errors.Is) by LineReader's error for a line
// of more than MaxLineBytes.
var ErrLineTooLong = errors.New("line too long")

// LineReader splits a stream into lines of up to MaxLineBytes without the
// trailing "\n" or "\r\n". Its results are valid until the next call.
// It is not safe for concurrent use.
type LineReader struct {
	r    *bufio.Reader
	long []byte
	done bool
	err  error
}

// NewLineReader returns a LineReader over r, read through a 64 KiB buffer.
func NewLineReader(r io.Reader) *LineReader {
	return &LineReader{r: bufio.NewReaderSize(r, 64<<10)}
}

// Next returns the next line; ok is false at the end of the input. A last
// line without a newline is returned; an empty input has no lines. A line
// of more than MaxLineBytes is an error wrapping ErrLineTooLong, returned
// once at most MaxLineBytes+2 bytes of it were read, and by every later
// call.
func (lr *LineReader) Next() (line []byte, ok bool, err error) {
	if lr.err != nil {
		return nil, false, lr.err
	}
	if lr.done {
		return nil, false, nil
	}
	line, err = lr.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		lr.long = append(lr.long[:0], line...)
		for err == bufio.ErrBufferFull && len(lr.long) <= MaxLineBytes+2 {
			line, err = lr.r.ReadSlice('\n')
			lr.long = append(lr.long, line...)
		}
		line = lr.long
	}
	if n := len(bytes.TrimSuffix(bytes.TrimSuffix(line, []byte{'\n'}), []byte{'\r'})); n > MaxLineBytes {
		lr.err = fmt.Errorf("%w: more than %d bytes, the limit", ErrLineTooLong, MaxLineBytes)
		return nil, false, lr.err
	}
	switch {
	case err == io.EOF:
		lr.done = true
		if len(line) == 0 {
			return nil, false, nil
		}
	case err != nil:
		return nil, false, err
	}
	line = bytes.TrimSuffix(line, []byte{'\n'})
	line = bytes.TrimSuffix(line, []byte{'\r'})
	return line, true, nil
}
