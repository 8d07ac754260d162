package metaproto

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/itemformat"
)

// anchorEvery is how many commands an exchange sends between two mn
// no-ops: the most commands one unplaceable error line can make
// resendable.
const anchorEvery = 32

// maxValue bounds the data block of a reply the reader accepts (1 GiB,
// memcached's largest item size), so that a corrupt stream cannot make it
// allocate without limit.
const maxValue = 1 << 30

// valueChunk is the most memory a value takes before its bytes
// arrive.
const valueChunk = 1 << 20

// readBuffer is the size of a connection's read buffer; reply lines
// (not values) must fit into it.
const readBuffer = 64 << 10

// Verb is a meta command.
type Verb uint8

const (
	// VerbGet: mg <key> c v, the value and its cas id; with t, N and R
	// for the read side's leases (Client).
	VerbGet Verb = iota + 1
	// VerbSet: ms <key> <len>, with a mode, an optional TTL and cas.
	VerbSet
	// VerbArith: ma <key>, increment or decrement.
	VerbArith
	// VerbDelete: md <key>; with I, marks the item stale instead.
	VerbDelete
)

func (v Verb) String() string {
	switch v {
	case VerbGet:
		return "mg"
	case VerbSet:
		return "ms"
	case VerbArith:
		return "ma"
	case VerbDelete:
		return "md"
	}
	return "meta(" + strconv.Itoa(int(v)) + ")"
}

// Modes of VerbSet (flag M).
const (
	ModeSet    = 'S'
	ModeAdd    = 'E'
	ModeAppend = 'A'
)

// Modes of VerbArith (flag M).
const (
	ModeIncr = 'I'
	ModeDecr = 'D'
)

// Cmd is one meta command of an exchange. Its key is checked
// (itemformat.CheckKey) before anything is written; data always travels as a data
// block with its length, never inside the command line.
type Cmd struct {
	Verb Verb
	Key  string
	// Quiet asks memcached not to answer a success (flag q).
	Quiet bool
	// Mode is the VerbSet or VerbArith mode; 0 means memcached's default
	// (set, increment).
	Mode byte
	// Data is the data block of a VerbSet.
	Data string
	// TTL is the exptime (seconds, or an absolute unix time beyond 30
	// days) of a VerbSet or an invalidating VerbDelete (flag T, when
	// HasTTL) or of the item a vivifying VerbArith or VerbGet creates
	// (flag N).
	TTL    int64
	HasTTL bool
	// CAS, when not 0, makes a VerbSet store, or a VerbDelete delete,
	// only over that cas id (flag C).
	CAS uint64
	// Delta is a VerbArith's delta (flag D).
	Delta uint64
	// Vivify makes a VerbArith create a missing item holding initial
	// (flags N and J); the delta is not applied to a created item. It
	// makes a VerbGet create a missing item holding nothing and hand its
	// sender the win (flag N): reply flag W to the first, Z to the others.
	Vivify  bool
	Initial uint64
	// ReturnValue asks a VerbArith for the resulting value (flag v).
	ReturnValue bool
	// Recache makes a VerbGet hand the win (W) to the first reader that
	// finds fewer than this many seconds left to the item (flag R).
	Recache int64
	// ReturnTTL asks a VerbGet for the item's remaining lifetime (flag t).
	ReturnTTL bool
	// Invalidate makes a VerbDelete mark the item stale rather than
	// remove it (flag I): readers get it with flag X and one gets W.
	Invalidate bool
	// Flags are the client flags a VerbSet stores (flag F, when not 0).
	Flags uint32
}

// Status is what became of one command of an exchange.
type Status uint8

const (
	// Pending: no reply yet. An exchange never returns it.
	Pending Status = iota
	// QuietOK: a quiet command that sent no reply, which means it
	// succeeded.
	QuietOK
	// HD: success. For a quiet vivifying VerbArith it means the item
	// was created (an increment of an existing item sends nothing).
	HD
	// VA: success with a value (value, and cas when asked for).
	VA
	// EN: VerbGet found nothing.
	EN
	// NF: not found (VerbArith, VerbDelete, VerbSet with cas).
	NF
	// NS: not stored (add of an existing item, append to a missing
	// or full one, vivify that could not create).
	NS
	// EX: the cas id did not match.
	EX
	// Failed: err says why; see resend and unknown.
	Failed
)

// String names the status as memcached's reply does (HD, VA, EN, NF, NS,
// EX), or says what it stands for.
func (s Status) String() string {
	switch s {
	case Pending:
		return "no reply"
	case QuietOK:
		return "quiet success"
	case HD:
		return "HD"
	case VA:
		return "VA"
	case EN:
		return "EN"
	case NF:
		return "NF"
	case NS:
		return "NS"
	case EX:
		return "EX"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("status %d", uint8(s))
}

// Reply is the outcome of one command.
type Reply struct {
	Status Status
	// Value is the data block of VA.
	Value []byte
	// CAS is the item's cas id in a VA reply to VerbGet.
	CAS uint64
	// TTL is the remaining lifetime in seconds a VerbGet asked for (-1:
	// none).
	TTL int64
	// Won, Stale and WinSent are a VerbGet's reply flags W (this reader
	// won the right to recompute the item), X (the item is stale) and Z
	// (another reader already won).
	Won, Stale, WinSent bool
	// Err is set for Failed: an error line from memcached
	// (*errorLine), or what broke the exchange.
	Err error
	// Resend: the command was quiet and may have succeeded, or it failed
	// with an error line that could not be told apart from its
	// neighbours'; either way sending it again without q is safe for a
	// command that may be quiet.
	Resend bool
	// Unknown: the exchange broke before the command's reply; memcached
	// may or may not have executed it.
	Unknown bool
	// Flags are the item's client flags, when the transport reads them
	// (the text protocol's gets does; this package's mg does not ask).
	Flags uint32
}

var (
	// ErrTooLarge means memcached refused a value because it exceeds its
	// item size limit (SERVER_ERROR object too large for cache).
	ErrTooLarge = errors.New("memcached item too large")
	// ErrRejected means memcached refused a command as wrong for the item
	// or for the server (CLIENT_ERROR, such as an increment of a value
	// that is not a number; ERROR, a command it does not know), or the
	// command could not be written at all (an unknown verb). Sent again,
	// it fails again.
	ErrRejected = errors.New("memcached rejected the command")
)

// errorLine is an error line memcached answered to a command. It
// unwraps to ErrTooLarge, memcache.ErrServerError or ErrRejected, which
// decide whether the command may succeed when sent again (see
// cacheops.Retryable).
type errorLine struct {
	line string
}

func (e *errorLine) Error() string { return "memcached answered " + strconv.Quote(e.line) }

func (e *errorLine) Unwrap() error {
	switch {
	case strings.HasPrefix(e.line, "SERVER_ERROR object too large"):
		// The value exceeds the item size limit.
		return ErrTooLarge
	case strings.HasPrefix(e.line, "SERVER_ERROR"):
		// Out of memory and the like: the server may manage next time.
		return memcache.ErrServerError
	}
	// CLIENT_ERROR: the request is wrong for the item (incr of a value
	// that is not a number) or for the server; ERROR: the server does
	// not know the command (no meta protocol). Sent again, it fails again.
	return ErrRejected
}

// isClient reports whether memcached answered CLIENT_ERROR (for VerbArith:
// the item is not a decimal number).
func (e *errorLine) isClient() bool { return strings.HasPrefix(e.line, "CLIENT_ERROR") }

// IsClientError reports whether err is a CLIENT_ERROR answer.
func IsClientError(err error) bool {
	var el *errorLine
	return errors.As(err, &el) && el.isClient()
}

// ErrProtocol means memcached's replies did not fit the commands sent;
// the connection is closed.
var ErrProtocol = errors.New("metaproto: memcached meta protocol: unexpected reply")

// appendCommand appends cmd, tagged with opaque, to buf.
func appendCommand(buf []byte, cmd *Cmd, opaque int) []byte {
	switch cmd.Verb {
	case VerbGet:
		buf = append(append(append(buf, "mg "...), cmd.Key...), " c v"...)
		if cmd.ReturnTTL {
			buf = append(buf, " t"...)
		}
		if cmd.Vivify {
			buf = appendIntFlag(buf, " N", cmd.TTL)
		}
		if cmd.Recache > 0 {
			buf = appendIntFlag(buf, " R", cmd.Recache)
		}
	case VerbSet:
		buf = append(append(append(buf, "ms "...), cmd.Key...), ' ')
		buf = strconv.AppendInt(buf, int64(len(cmd.Data)), 10)
		if cmd.Mode != 0 {
			buf = append(append(buf, " M"...), cmd.Mode)
		}
		if cmd.HasTTL {
			buf = appendIntFlag(buf, " T", cmd.TTL)
		}
		if cmd.CAS != 0 {
			buf = appendUintFlag(buf, " C", cmd.CAS)
		}
		if cmd.Flags != 0 {
			buf = appendUintFlag(buf, " F", uint64(cmd.Flags))
		}
	case VerbArith:
		buf = append(append(buf, "ma "...), cmd.Key...)
		if cmd.Mode != 0 {
			buf = append(append(buf, " M"...), cmd.Mode)
		}
		buf = appendUintFlag(buf, " D", cmd.Delta)
		if cmd.Vivify {
			buf = appendIntFlag(buf, " N", cmd.TTL)
			buf = appendUintFlag(buf, " J", cmd.Initial)
		}
		if cmd.ReturnValue {
			buf = append(buf, " v"...)
		}
	case VerbDelete:
		buf = append(append(buf, "md "...), cmd.Key...)
		if cmd.Invalidate {
			buf = append(buf, " I"...)
		}
		if cmd.CAS != 0 {
			buf = appendUintFlag(buf, " C", cmd.CAS)
		}
		if cmd.HasTTL {
			buf = appendIntFlag(buf, " T", cmd.TTL)
		}
	}
	if cmd.Quiet {
		buf = append(buf, " q"...)
	}
	buf = append(appendIntFlag(buf, " O", int64(opaque)), "\r\n"...)
	if cmd.Verb == VerbSet {
		buf = append(append(buf, cmd.Data...), "\r\n"...)
	}
	return buf
}

// appendIntFlag appends a flag with a signed number (" T3600").
func appendIntFlag(buf []byte, flag string, v int64) []byte {
	return strconv.AppendInt(append(buf, flag...), v, 10)
}

// appendUintFlag appends a flag with an unsigned number (" C42").
func appendUintFlag(buf []byte, flag string, v uint64) []byte {
	return strconv.AppendUint(append(buf, flag...), v, 10)
}

// appendPipeline appends the commands of an exchange to buf, with the
// mn anchors readReplies expects. A command that cannot be sent (an
// invalid key or verb) is not written: its reply is set to Failed at
// once. sent is the number of commands written.
func appendPipeline(buf []byte, cmds []Cmd, replies []Reply) (out []byte, sent int) {
	for i := range cmds {
		cmd := &cmds[i]
		err := itemformat.CheckKey(cmd.Key)
		if err == nil && (cmd.Verb < VerbGet || cmd.Verb > VerbDelete) {
			err = fmt.Errorf("%w: meta command %d", ErrRejected, cmd.Verb)
		}
		if err != nil {
			replies[i] = Reply{Status: Failed, Err: err}
		} else {
			replies[i] = Reply{}
			buf = appendCommand(buf, cmd, i)
			sent++
		}
		if (i+1)%anchorEvery == 0 || i == len(cmds)-1 {
			buf = append(buf, "mn\r\n"...)
		}
	}
	return buf, sent
}

// readReplies reads the replies to cmds (as written by
// appendPipeline) up to the final MN and fills replies. On an error
// (I/O, or replies that do not fit the commands) the replies of the
// commands not yet settled stay Pending and the connection must be
// closed.
func readReplies(r *bufio.Reader, cmds []Cmd, replies []Reply) error {
	rd := reader{r: r, cmds: cmds, replies: replies}
	return rd.run()
}

type reader struct {
	r       *bufio.Reader
	cmds    []Cmd
	replies []Reply
	// pos is the first command whose reply is not settled; windowEnd
	// ends the anchor window being read.
	pos, windowEnd int
	// errLines are the error lines read since the last placed reply.
	errLines []string
}

func (rd *reader) run() error {
	n := len(rd.cmds)
	rd.windowEnd = min(anchorEvery, n)
	for {
		line, err := rd.line()
		if err != nil {
			return err
		}
		switch {
		case string(line) == "MN":
			if err := rd.settle(rd.windowEnd); err != nil {
				return err
			}
			if rd.windowEnd == n {
				return nil
			}
			rd.windowEnd = min(rd.windowEnd+anchorEvery, n)
		case bytes.HasPrefix(line, []byte("CLIENT_ERROR")), bytes.HasPrefix(line, []byte("SERVER_ERROR")), string(line) == "ERROR":
			if len(rd.errLines) >= rd.windowEnd-rd.pos {
				return fmt.Errorf("%w: more error lines than commands awaiting a reply", ErrProtocol)
			}
			rd.errLines = append(rd.errLines, string(line))
		default:
			if err := rd.reply(line); err != nil {
				return err
			}
		}
	}
}

// line returns the next reply line without its "\r\n".
func (rd *reader) line() ([]byte, error) {
	line, err := rd.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: reply line longer than %d bytes", ErrProtocol, rd.r.Size())
		}
		if errors.Is(err, io.EOF) {
			// The server closed the connection before the last reply.
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: line %q does not end with CRLF", ErrProtocol, line)
	}
	return line[:len(line)-2], nil
}

// reply handles a status line: HD, VA, EN, NF, NS or EX with an opaque
// token.
func (rd *reader) reply(line []byte) error {
	status := lineStatus(line)
	if status == 0 {
		return fmt.Errorf("%w: %q", ErrProtocol, line)
	}
	rest := line[2:]
	size := -1
	if status == VA {
		tok, after := nextToken(rest)
		n, err := strconv.Atoi(string(tok))
		if err != nil || n < 0 || n > maxValue {
			return fmt.Errorf("%w: value size in %q", ErrProtocol, line)
		}
		size, rest = n, after
	}
	rep := Reply{Status: status, TTL: -1}
	opaque, err := replyFlags(rest, &rep)
	if err != nil {
		return fmt.Errorf("%w: %s in %q", ErrProtocol, err.Error(), line)
	}
	if opaque < rd.pos || opaque >= rd.windowEnd || rd.replies[opaque].Status != Pending {
		return fmt.Errorf("%w: %q does not answer a command awaiting a reply (%d..%d)", ErrProtocol, line, rd.pos, rd.windowEnd-1)
	}
	if status == VA && rd.cmds[opaque].Verb != VerbGet && !rd.cmds[opaque].ReturnValue {
		return fmt.Errorf("%w: %q answers a command that asked for no value", ErrProtocol, line)
	}
	if size >= 0 {
		value, err := readValue(rd.r, size)
		if err != nil {
			return err
		}
		rep.Value = value
	}
	if err := rd.settle(opaque); err != nil {
		return err
	}
	rd.replies[opaque] = rep
	rd.pos = opaque + 1
	return nil
}

// lineStatus returns the status a reply line starts with; 0 when it
// starts with none.
func lineStatus(line []byte) Status {
	if len(line) < 2 || (len(line) > 2 && line[2] != ' ') {
		return 0
	}
	switch string(line[:2]) {
	case "HD":
		return HD
	case "VA":
		return VA
	case "EN":
		return EN
	case "NF":
		return NF
	case "NS":
		return NS
	case "EX":
		return EX
	}
	return 0
}

// Flag names of the reply flags replyFlags reads, in its errors.
var (
	errOpaqueFlag = errors.New("opaque")
	errCASFlag    = errors.New("cas")
	errTTLFlag    = errors.New("ttl")
)

// replyFlags reads the flags of a reply line (after its status and
// value size) into rep and returns its opaque token; -1 without one. Its
// error names the flag that is not a number.
func replyFlags(rest []byte, rep *Reply) (opaque int, err error) {
	opaque = -1
	for len(rest) > 0 {
		var tok []byte
		tok, rest = nextToken(rest)
		if len(tok) == 0 {
			continue
		}
		switch tok[0] {
		case 'O':
			if opaque, err = strconv.Atoi(string(tok[1:])); err != nil {
				return -1, errOpaqueFlag
			}
		case 'c':
			if rep.CAS, err = strconv.ParseUint(string(tok[1:]), 10, 64); err != nil {
				return -1, errCASFlag
			}
		case 't':
			if rep.TTL, err = strconv.ParseInt(string(tok[1:]), 10, 64); err != nil {
				return -1, errTTLFlag
			}
		case 'W':
			rep.Won = true
		case 'X':
			rep.Stale = true
		case 'Z':
			rep.WinSent = true
		}
	}
	return opaque, nil
}

// readValue reads a data block of size bytes and its CRLF. Memory
// grows with the bytes that arrive, not with the size announced.
func readValue(r *bufio.Reader, size int) ([]byte, error) {
	n := size + 2
	value := make([]byte, 0, min(n, valueChunk))
	for len(value) < n {
		if len(value) == cap(value) {
			value = slices.Grow(value, min(n-len(value), cap(value)))
		}
		m, err := r.Read(value[len(value):min(cap(value), n)])
		value = value[:len(value)+m]
		if err != nil && len(value) < n {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, err
		}
	}
	if value[size] != '\r' || value[size+1] != '\n' {
		return nil, fmt.Errorf("%w: value of %d bytes not followed by CRLF", ErrProtocol, size)
	}
	return value[:size:size], nil
}

// settle settles the commands from rd.pos up to end (exclusive), none of
// which has sent a status line: quiet ones succeeded silently unless the
// pending error lines belong to them.
func (rd *reader) settle(end int) error {
	errLines := rd.errLines
	rd.errLines = rd.errLines[:0]
	var waiting []int
	for i := rd.pos; i < end; i++ {
		if rd.replies[i].Status == Pending {
			waiting = append(waiting, i)
		}
	}
	rd.pos = end
	if len(errLines) == 0 || len(waiting) == len(errLines) {
		return rd.place(waiting, errLines)
	}
	// Some error lines name the only command that can send them: place
	// each kind among the commands of its verb.
	byVerb := make(map[Verb][]string, 2)
	for _, line := range errLines {
		verb := errorVerb(line)
		if verb == 0 {
			return rd.place(waiting, errLines)
		}
		byVerb[verb] = append(byVerb[verb], line)
	}
	var cands []int
	for _, verb := range []Verb{VerbGet, VerbSet, VerbArith, VerbDelete} {
		cands = cands[:0]
		for _, i := range waiting {
			if rd.cmds[i].Verb == verb {
				cands = append(cands, i)
			}
		}
		if err := rd.place(cands, byVerb[verb]); err != nil {
			return err
		}
	}
	return nil
}

// place settles the waiting commands cands (in order) given the error
// lines they answered.
func (rd *reader) place(cands []int, errLines []string) error {
	loud := 0
	for _, i := range cands {
		if !rd.cmds[i].Quiet {
			loud++
		}
	}
	switch {
	case len(errLines) > len(cands) || len(errLines) < loud:
		// Every command that is not quiet answers with a status line or
		// an error line, and nothing else sends error lines.
		return fmt.Errorf("%w: %d error lines for %d commands without a reply, %d of them not quiet", ErrProtocol, len(errLines), len(cands), loud)
	case len(errLines) == len(cands) || len(errLines) == loud:
		// Every waiting command failed, or exactly the loud ones did:
		// the error lines are theirs, in order.
		next := 0
		for _, i := range cands {
			if len(errLines) == len(cands) || !rd.cmds[i].Quiet {
				rd.replies[i] = Reply{Status: Failed, Err: &errorLine{line: errLines[next]}}
				next++
			} else {
				rd.replies[i] = Reply{Status: QuietOK}
			}
		}
	default:
		// Some quiet commands failed, but not which ones.
		cause := &errorLine{line: errLines[0]}
		for _, i := range cands {
			rd.replies[i] = Reply{Status: Failed, Resend: true,
				Err: fmt.Errorf("one of %d commands failed, possibly this one: %w", len(cands), cause)}
		}
	}
	return nil
}

// errorVerb returns the only verb that can answer line, or 0 when
// several can.
func errorVerb(line string) Verb {
	switch line {
	case "CLIENT_ERROR cannot increment or decrement non-numeric value":
		return VerbArith
	case "SERVER_ERROR object too large for cache", "SERVER_ERROR out of memory storing object":
		return VerbSet
	}
	return 0
}

// nextToken returns the first space-separated token of b and the rest.
func nextToken(b []byte) (tok, rest []byte) {
	for len(b) > 0 && b[0] == ' ' {
		b = b[1:]
	}
	i := bytes.IndexByte(b, ' ')
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i:]
}

// ReplyError returns the error of a reply that is neither what the
// command hoped for nor one of its expected refusals: its Err, or
// ErrProtocol naming its status.
func ReplyError(rep *Reply) error {
	if rep.Err != nil {
		return rep.Err
	}
	return fmt.Errorf("%w: unexpected reply %v", ErrProtocol, rep.Status)
}
