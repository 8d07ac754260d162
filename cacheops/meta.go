package cacheops

// The memcached meta protocol (memcached 1.6), pipelined: the connection
// layer under PipelineWriter.
//
// One exchange writes many commands on one connection in a single write and
// then reads their replies in bulk. Every command carries an opaque token
// O<i>, i being its index in the exchange, which memcached copies into its
// reply. Commands that may be quiet (flag q) send no reply when they
// succeed, so a pipeline of successful appends reads back next to nothing.
//
// memcached answers errors (CLIENT_ERROR, SERVER_ERROR, ERROR) without the
// opaque token, so an error line can only be placed by its position and
// its kind: replies come back in command order, so the error belongs to
// one of the commands between the last reply that could be placed and the
// next one, and some errors can come from one verb only. To keep that
// window small an exchange puts a no-op (mn, answered MN) after every
// metaAnchorEvery commands and at its end; the final MN also tells the
// reader that every reply has arrived. When the error lines of a window
// cannot be matched to its commands exactly, the candidates are marked
// resendable: each either succeeded silently or failed, and is sent again
// without q (see metaReply.resend). Only commands whose repetition is
// harmless may be quiet.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/itemformat"
)

// metaAnchorEvery is how many commands an exchange sends between two mn
// no-ops: the most commands one unplaceable error line can make
// resendable.
const metaAnchorEvery = 32

// metaMaxValue bounds the data block of a reply the reader accepts (1 GiB,
// memcached's largest item size), so that a corrupt stream cannot make it
// allocate without limit.
const metaMaxValue = 1 << 30

// metaValueChunk is the most memory a value takes before its bytes
// arrive.
const metaValueChunk = 1 << 20

// metaReadBuffer is the size of a connection's read buffer; reply lines
// (not values) must fit into it.
const metaReadBuffer = 64 << 10

// metaVerb is a meta command.
type metaVerb uint8

const (
	// metaGet: mg <key> c v, the value and its cas id; with t, N and R
	// for the read side's leases (MetaClient).
	metaGet metaVerb = iota + 1
	// metaSet: ms <key> <len>, with a mode, an optional TTL and cas.
	metaSet
	// metaArith: ma <key>, increment or decrement.
	metaArith
	// metaDelete: md <key>; with I, marks the item stale instead.
	metaDelete
)

func (v metaVerb) String() string {
	switch v {
	case metaGet:
		return "mg"
	case metaSet:
		return "ms"
	case metaArith:
		return "ma"
	case metaDelete:
		return "md"
	}
	return "meta(" + strconv.Itoa(int(v)) + ")"
}

// Modes of metaSet (flag M).
const (
	metaModeSet    = 'S'
	metaModeAdd    = 'E'
	metaModeAppend = 'A'
)

// Modes of metaArith (flag M).
const (
	metaModeIncr = 'I'
	metaModeDecr = 'D'
)

// metaCmd is one meta command of an exchange. Its key is checked
// (itemformat.CheckKey) before anything is written; data always travels as a data
// block with its length, never inside the command line.
type metaCmd struct {
	verb metaVerb
	key  string
	// quiet asks memcached not to answer a success (flag q).
	quiet bool
	// mode is the metaSet or metaArith mode; 0 means memcached's default
	// (set, increment).
	mode byte
	// data is the data block of a metaSet.
	data string
	// ttl is the exptime (seconds, or an absolute unix time beyond 30
	// days) of a metaSet or an invalidating metaDelete (flag T, when
	// hasTTL) or of the item a vivifying metaArith or metaGet creates
	// (flag N).
	ttl    int64
	hasTTL bool
	// cas, when not 0, makes a metaSet store, or a metaDelete delete,
	// only over that cas id (flag C).
	cas uint64
	// delta is a metaArith's delta (flag D).
	delta uint64
	// vivify makes a metaArith create a missing item holding initial
	// (flags N and J); the delta is not applied to a created item. It
	// makes a metaGet create a missing item holding nothing and hand its
	// sender the win (flag N): reply flag W to the first, Z to the others.
	vivify  bool
	initial uint64
	// returnValue asks a metaArith for the resulting value (flag v).
	returnValue bool
	// recache makes a metaGet hand the win (W) to the first reader that
	// finds fewer than this many seconds left to the item (flag R).
	recache int64
	// returnTTL asks a metaGet for the item's remaining lifetime (flag t).
	returnTTL bool
	// invalidate makes a metaDelete mark the item stale rather than
	// remove it (flag I): readers get it with flag X and one gets W.
	invalidate bool
}

// metaStatus is what became of one command of an exchange.
type metaStatus uint8

const (
	// metaPending: no reply yet. An exchange never returns it.
	metaPending metaStatus = iota
	// metaQuietOK: a quiet command that sent no reply, which means it
	// succeeded.
	metaQuietOK
	// metaHD: success. For a quiet vivifying metaArith it means the item
	// was created (an increment of an existing item sends nothing).
	metaHD
	// metaVA: success with a value (value, and cas when asked for).
	metaVA
	// metaEN: metaGet found nothing.
	metaEN
	// metaNF: not found (metaArith, metaDelete, metaSet with cas).
	metaNF
	// metaNS: not stored (add of an existing item, append to a missing
	// or full one, vivify that could not create).
	metaNS
	// metaEX: the cas id did not match.
	metaEX
	// metaFailed: err says why; see resend and unknown.
	metaFailed
)

// metaReply is the outcome of one command.
type metaReply struct {
	status metaStatus
	// value is the data block of metaVA.
	value []byte
	// cas is the item's cas id in a metaVA reply to metaGet.
	cas uint64
	// ttl is the remaining lifetime in seconds a metaGet asked for (-1:
	// none).
	ttl int64
	// won, stale and winSent are a metaGet's reply flags W (this reader
	// won the right to recompute the item), X (the item is stale) and Z
	// (another reader already won).
	won, stale, winSent bool
	// err is set for metaFailed: an error line from memcached
	// (*metaErrorLine), or what broke the exchange.
	err error
	// resend: the command was quiet and may have succeeded, or it failed
	// with an error line that could not be told apart from its
	// neighbours'; either way sending it again without q is safe for a
	// command that may be quiet.
	resend bool
	// unknown: the exchange broke before the command's reply; memcached
	// may or may not have executed it.
	unknown bool
}

// metaErrorLine is an error line memcached answered to a command. It
// unwraps to ErrTooLarge, memcache.ErrServerError or ErrInvalidOp, which
// decide whether the command may succeed when sent again (see Retryable).
type metaErrorLine struct {
	line string
}

func (e *metaErrorLine) Error() string { return "memcached answered " + strconv.Quote(e.line) }

func (e *metaErrorLine) Unwrap() error {
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
	return ErrInvalidOp
}

// isClient reports whether memcached answered CLIENT_ERROR (for metaArith:
// the item is not a decimal number).
func (e *metaErrorLine) isClient() bool { return strings.HasPrefix(e.line, "CLIENT_ERROR") }

// metaIsClientError reports whether err is a CLIENT_ERROR answer.
func metaIsClientError(err error) bool {
	var el *metaErrorLine
	return errors.As(err, &el) && el.isClient()
}

// errMetaProtocol means memcached's replies did not fit the commands sent;
// the connection is closed.
var errMetaProtocol = errors.New("cacheops: memcached meta protocol: unexpected reply")

// metaAppendCommand appends cmd, tagged with opaque, to buf.
func metaAppendCommand(buf []byte, cmd *metaCmd, opaque int) []byte {
	switch cmd.verb {
	case metaGet:
		buf = append(buf, "mg "...)
		buf = append(buf, cmd.key...)
		buf = append(buf, " c v"...)
		if cmd.returnTTL {
			buf = append(buf, " t"...)
		}
		if cmd.vivify {
			buf = append(buf, " N"...)
			buf = strconv.AppendInt(buf, cmd.ttl, 10)
		}
		if cmd.recache > 0 {
			buf = append(buf, " R"...)
			buf = strconv.AppendInt(buf, cmd.recache, 10)
		}
	case metaSet:
		buf = append(buf, "ms "...)
		buf = append(buf, cmd.key...)
		buf = append(buf, ' ')
		buf = strconv.AppendInt(buf, int64(len(cmd.data)), 10)
		if cmd.mode != 0 {
			buf = append(buf, " M"...)
			buf = append(buf, cmd.mode)
		}
		if cmd.hasTTL {
			buf = append(buf, " T"...)
			buf = strconv.AppendInt(buf, cmd.ttl, 10)
		}
		if cmd.cas != 0 {
			buf = append(buf, " C"...)
			buf = strconv.AppendUint(buf, cmd.cas, 10)
		}
	case metaArith:
		buf = append(buf, "ma "...)
		buf = append(buf, cmd.key...)
		if cmd.mode != 0 {
			buf = append(buf, " M"...)
			buf = append(buf, cmd.mode)
		}
		buf = append(buf, " D"...)
		buf = strconv.AppendUint(buf, cmd.delta, 10)
		if cmd.vivify {
			buf = append(buf, " N"...)
			buf = strconv.AppendInt(buf, cmd.ttl, 10)
			buf = append(buf, " J"...)
			buf = strconv.AppendUint(buf, cmd.initial, 10)
		}
		if cmd.returnValue {
			buf = append(buf, " v"...)
		}
	case metaDelete:
		buf = append(buf, "md "...)
		buf = append(buf, cmd.key...)
		if cmd.invalidate {
			buf = append(buf, " I"...)
		}
		if cmd.cas != 0 {
			buf = append(buf, " C"...)
			buf = strconv.AppendUint(buf, cmd.cas, 10)
		}
		if cmd.hasTTL {
			buf = append(buf, " T"...)
			buf = strconv.AppendInt(buf, cmd.ttl, 10)
		}
	}
	if cmd.quiet {
		buf = append(buf, " q"...)
	}
	buf = append(buf, " O"...)
	buf = strconv.AppendInt(buf, int64(opaque), 10)
	buf = append(buf, "\r\n"...)
	if cmd.verb == metaSet {
		buf = append(buf, cmd.data...)
		buf = append(buf, "\r\n"...)
	}
	return buf
}

// metaAppendPipeline appends the commands of an exchange to buf, with the
// mn anchors metaReadReplies expects. A command that cannot be sent (an
// invalid key or verb) is not written: its reply is set to metaFailed at
// once. sent is the number of commands written.
func metaAppendPipeline(buf []byte, cmds []metaCmd, replies []metaReply) (out []byte, sent int) {
	for i := range cmds {
		cmd := &cmds[i]
		err := itemformat.CheckKey(cmd.key)
		if err == nil && (cmd.verb < metaGet || cmd.verb > metaDelete) {
			err = fmt.Errorf("%w: meta command %d", ErrInvalidOp, cmd.verb)
		}
		if err != nil {
			replies[i] = metaReply{status: metaFailed, err: err}
		} else {
			replies[i] = metaReply{}
			buf = metaAppendCommand(buf, cmd, i)
			sent++
		}
		if (i+1)%metaAnchorEvery == 0 || i == len(cmds)-1 {
			buf = append(buf, "mn\r\n"...)
		}
	}
	return buf, sent
}

// metaReadReplies reads the replies to cmds (as written by
// metaAppendPipeline) up to the final MN and fills replies. On an error
// (I/O, or replies that do not fit the commands) the replies of the
// commands not yet settled stay metaPending and the connection must be
// closed.
func metaReadReplies(r *bufio.Reader, cmds []metaCmd, replies []metaReply) error {
	rd := metaReader{r: r, cmds: cmds, replies: replies}
	return rd.run()
}

type metaReader struct {
	r       *bufio.Reader
	cmds    []metaCmd
	replies []metaReply
	// pos is the first command whose reply is not settled; windowEnd
	// ends the anchor window being read.
	pos, windowEnd int
	// errLines are the error lines read since the last placed reply.
	errLines []string
}

func (rd *metaReader) run() error {
	n := len(rd.cmds)
	rd.windowEnd = min(metaAnchorEvery, n)
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
			rd.windowEnd = min(rd.windowEnd+metaAnchorEvery, n)
		case bytes.HasPrefix(line, []byte("CLIENT_ERROR")), bytes.HasPrefix(line, []byte("SERVER_ERROR")), string(line) == "ERROR":
			if len(rd.errLines) >= rd.windowEnd-rd.pos {
				return fmt.Errorf("%w: more error lines than commands awaiting a reply", errMetaProtocol)
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
func (rd *metaReader) line() ([]byte, error) {
	line, err := rd.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("%w: reply line longer than %d bytes", errMetaProtocol, rd.r.Size())
		}
		if errors.Is(err, io.EOF) {
			// The server closed the connection before the last reply.
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, fmt.Errorf("%w: line %q does not end with CRLF", errMetaProtocol, line)
	}
	return line[:len(line)-2], nil
}

// reply handles a status line: HD, VA, EN, NF, NS or EX with an opaque
// token.
func (rd *metaReader) reply(line []byte) error {
	var status metaStatus
	if len(line) >= 2 && (len(line) == 2 || line[2] == ' ') {
		switch string(line[:2]) {
		case "HD":
			status = metaHD
		case "VA":
			status = metaVA
		case "EN":
			status = metaEN
		case "NF":
			status = metaNF
		case "NS":
			status = metaNS
		case "EX":
			status = metaEX
		}
	}
	if status == 0 {
		return fmt.Errorf("%w: %q", errMetaProtocol, line)
	}
	rest := line[2:]
	size := -1
	if status == metaVA {
		tok, after := metaNextToken(rest)
		n, err := strconv.Atoi(string(tok))
		if err != nil || n < 0 || n > metaMaxValue {
			return fmt.Errorf("%w: value size in %q", errMetaProtocol, line)
		}
		size, rest = n, after
	}
	opaque := -1
	rep := metaReply{status: status, ttl: -1}
	for len(rest) > 0 {
		var tok []byte
		tok, rest = metaNextToken(rest)
		if len(tok) == 0 {
			continue
		}
		switch tok[0] {
		case 'O':
			n, err := strconv.Atoi(string(tok[1:]))
			if err != nil {
				return fmt.Errorf("%w: opaque in %q", errMetaProtocol, line)
			}
			opaque = n
		case 'c':
			n, err := strconv.ParseUint(string(tok[1:]), 10, 64)
			if err != nil {
				return fmt.Errorf("%w: cas in %q", errMetaProtocol, line)
			}
			rep.cas = n
		case 't':
			n, err := strconv.ParseInt(string(tok[1:]), 10, 64)
			if err != nil {
				return fmt.Errorf("%w: ttl in %q", errMetaProtocol, line)
			}
			rep.ttl = n
		case 'W':
			rep.won = true
		case 'X':
			rep.stale = true
		case 'Z':
			rep.winSent = true
		}
	}
	if opaque < rd.pos || opaque >= rd.windowEnd || rd.replies[opaque].status != metaPending {
		return fmt.Errorf("%w: %q does not answer a command awaiting a reply (%d..%d)", errMetaProtocol, line, rd.pos, rd.windowEnd-1)
	}
	if status == metaVA && rd.cmds[opaque].verb != metaGet && !rd.cmds[opaque].returnValue {
		return fmt.Errorf("%w: %q answers a command that asked for no value", errMetaProtocol, line)
	}
	if size >= 0 {
		value, err := metaReadValue(rd.r, size)
		if err != nil {
			return err
		}
		rep.value = value
	}
	if err := rd.settle(opaque); err != nil {
		return err
	}
	rd.replies[opaque] = rep
	rd.pos = opaque + 1
	return nil
}

// metaReadValue reads a data block of size bytes and its CRLF. Memory
// grows with the bytes that arrive, not with the size announced.
func metaReadValue(r *bufio.Reader, size int) ([]byte, error) {
	n := size + 2
	value := make([]byte, 0, min(n, metaValueChunk))
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
		return nil, fmt.Errorf("%w: value of %d bytes not followed by CRLF", errMetaProtocol, size)
	}
	return value[:size:size], nil
}

// settle settles the commands from rd.pos up to end (exclusive), none of
// which has sent a status line: quiet ones succeeded silently unless the
// pending error lines belong to them.
func (rd *metaReader) settle(end int) error {
	errLines := rd.errLines
	rd.errLines = rd.errLines[:0]
	var waiting []int
	for i := rd.pos; i < end; i++ {
		if rd.replies[i].status == metaPending {
			waiting = append(waiting, i)
		}
	}
	rd.pos = end
	if len(errLines) == 0 || len(waiting) == len(errLines) {
		return rd.place(waiting, errLines)
	}
	// Some error lines name the only command that can send them: place
	// each kind among the commands of its verb.
	byVerb := make(map[metaVerb][]string, 2)
	for _, line := range errLines {
		verb := metaErrorVerb(line)
		if verb == 0 {
			return rd.place(waiting, errLines)
		}
		byVerb[verb] = append(byVerb[verb], line)
	}
	var cands []int
	for _, verb := range []metaVerb{metaGet, metaSet, metaArith, metaDelete} {
		cands = cands[:0]
		for _, i := range waiting {
			if rd.cmds[i].verb == verb {
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
func (rd *metaReader) place(cands []int, errLines []string) error {
	loud := 0
	for _, i := range cands {
		if !rd.cmds[i].quiet {
			loud++
		}
	}
	switch {
	case len(errLines) > len(cands) || len(errLines) < loud:
		// Every command that is not quiet answers with a status line or
		// an error line, and nothing else sends error lines.
		return fmt.Errorf("%w: %d error lines for %d commands without a reply, %d of them not quiet", errMetaProtocol, len(errLines), len(cands), loud)
	case len(errLines) == len(cands) || len(errLines) == loud:
		// Every waiting command failed, or exactly the loud ones did:
		// the error lines are theirs, in order.
		next := 0
		for _, i := range cands {
			if len(errLines) == len(cands) || !rd.cmds[i].quiet {
				rd.replies[i] = metaReply{status: metaFailed, err: &metaErrorLine{line: errLines[next]}}
				next++
			} else {
				rd.replies[i] = metaReply{status: metaQuietOK}
			}
		}
	default:
		// Some quiet commands failed, but not which ones.
		cause := &metaErrorLine{line: errLines[0]}
		for _, i := range cands {
			rd.replies[i] = metaReply{status: metaFailed, resend: true,
				err: fmt.Errorf("one of %d commands failed, possibly this one: %w", len(cands), cause)}
		}
	}
	return nil
}

// metaErrorVerb returns the only verb that can answer line, or 0 when
// several can.
func metaErrorVerb(line string) metaVerb {
	switch line {
	case "CLIENT_ERROR cannot increment or decrement non-numeric value":
		return metaArith
	case "SERVER_ERROR object too large for cache", "SERVER_ERROR out of memory storing object":
		return metaSet
	}
	return 0
}

// metaNextToken returns the first space-separated token of b and the rest.
func metaNextToken(b []byte) (tok, rest []byte) {
	for len(b) > 0 && b[0] == ' ' {
		b = b[1:]
	}
	i := bytes.IndexByte(b, ' ')
	if i < 0 {
		return b, nil
	}
	return b[:i], b[i:]
}

// metaConn is one connection to a memcached server.
type metaConn struct {
	nc   net.Conn
	r    *bufio.Reader
	wbuf []byte
	// closed is set once nc is closed; the connection is then discarded.
	closed bool
}

// metaMaxKeptBuffer bounds the write buffer a connection keeps between
// exchanges.
const metaMaxKeptBuffer = 4 << 20

// exchange sends cmds and reads their replies into replies (len(replies)
// >= len(cmds)). timeout bounds the whole exchange; a cancelled ctx ends it
// at once. A non-nil error means the connection is broken and must be
// closed; then every command without a settled reply has a metaFailed
// reply with unknown set.
func (c *metaConn) exchange(ctx context.Context, cmds []metaCmd, replies []metaReply, timeout time.Duration) (sent int, err error) {
	buf, sent := metaAppendPipeline(c.wbuf[:0], cmds, replies)
	if cap(buf) <= metaMaxKeptBuffer {
		c.wbuf = buf[:0]
	} else {
		c.wbuf = nil
	}
	if sent == 0 {
		return 0, nil
	}
	if err := c.nc.SetDeadline(time.Now().Add(timeout)); err != nil {
		metaFailPending(replies[:len(cmds)], err)
		return sent, err
	}
	stop := context.AfterFunc(ctx, func() { c.nc.SetDeadline(time.Unix(1, 0)) })
	written := make(chan error, 1)
	go func() {
		_, err := c.nc.Write(buf)
		written <- err
	}()
	err = metaReadReplies(c.r, cmds, replies[:len(cmds)])
	if err != nil {
		// Unblocks a write that waits for the server to read.
		c.close()
	}
	if werr := <-written; err == nil && werr != nil {
		// The server sent every reply, so it read every command; a
		// write error now is a failure to report all the same.
		err = werr
	}
	if !stop() {
		// ctx was cancelled during the exchange; the deadline may be in
		// the past, and the callback may still be running.
		c.close()
		if err == nil {
			return sent, nil // done before the cancellation took effect
		}
		err = fmt.Errorf("%w (%w)", ctx.Err(), err)
	}
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
			err = fmt.Errorf("no complete reply within %v: %w", timeout, err)
		}
		metaFailPending(replies[:len(cmds)], err)
	}
	return sent, err
}

func (c *metaConn) close() {
	if !c.closed {
		c.closed = true
		c.nc.Close()
	}
}

// metaFailPending marks the replies still pending as failed with unknown
// outcome.
func metaFailPending(replies []metaReply, err error) {
	for i := range replies {
		if replies[i].status == metaPending {
			replies[i] = metaReply{status: metaFailed, err: err, unknown: true}
		}
	}
}

// metaServer is the connection pool of one memcached server: at most
// len(slots) connections exist, each either idle in slots or used by one
// exchange.
type metaServer struct {
	addr  net.Addr
	slots chan *metaConn // nil entries: a connection may be dialed
}

func newMetaServer(addr net.Addr, conns int) *metaServer {
	s := &metaServer{addr: addr, slots: make(chan *metaConn, conns)}
	for range conns {
		s.slots <- nil
	}
	return s
}

// metaPool holds the connection pools of the servers a selector names.
// It is safe for concurrent use.
type metaPool struct {
	sel            memcache.ServerSelector
	connsPerServer int
	timeout        time.Duration
	dial           func(ctx context.Context, network, addr string) (net.Conn, error)

	mu sync.Mutex
	// servers holds the pools by network and address; byAddr caches them
	// by the net.Addr values the selector returns.
	servers map[string]*metaServer
	byAddr  map[net.Addr]*metaServer
	closed  bool
}

// metaMaxAddrs bounds metaPool.byAddr.
const metaMaxAddrs = 1024

// server returns the pool of the server that key lives on: the one the
// selector picks, exactly as gomemcache's client does.
func (p *metaPool) server(key string) (*metaServer, error) {
	addr, err := p.sel.PickServer(key)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if s := p.byAddr[addr]; s != nil {
		return s, nil
	}
	// A selector may return new net.Addr values for the same servers
	// (memcache.ServerList after SetServers): pools go by address.
	name := addr.Network() + "://" + addr.String()
	s := p.servers[name]
	if s == nil {
		s = newMetaServer(addr, p.connsPerServer)
		p.servers[name] = s
	}
	if len(p.byAddr) >= metaMaxAddrs {
		clear(p.byAddr)
	}
	p.byAddr[addr] = s
	return s, nil
}

// acquire takes a connection of s, dialing one if needed; it waits while
// every connection is in use. Give it back with release.
func (p *metaPool) acquire(ctx context.Context, s *metaServer) (c *metaConn, dialed bool, err error) {
	select {
	case c = <-s.slots:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	if c != nil {
		return c, false, nil
	}
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		s.slots <- nil
		return nil, false, fmt.Errorf("cacheops: pipeline closed: %w", net.ErrClosed)
	}
	dctx, cancel := context.WithTimeout(ctx, p.timeout)
	nc, err := p.dial(dctx, s.addr.Network(), s.addr.String())
	cancel()
	if err != nil {
		s.slots <- nil
		return nil, false, fmt.Errorf("dial memcached %s: %w", s.addr, err)
	}
	return &metaConn{nc: nc, r: bufio.NewReaderSize(nc, metaReadBuffer)}, true, nil
}

// release gives c back to s; a broken c is closed and its slot freed.
func (p *metaPool) release(s *metaServer, c *metaConn, broken bool) {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if broken || closed || c.closed {
		c.close()
		c = nil
	}
	s.slots <- c
}

// close closes the idle connections; connections in use are closed when
// released.
func (p *metaPool) close() {
	p.mu.Lock()
	p.closed = true
	servers := make([]*metaServer, 0, len(p.servers))
	for _, s := range p.servers {
		servers = append(servers, s)
	}
	p.mu.Unlock()
	for _, s := range servers {
		taken := 0
	drain:
		for range cap(s.slots) {
			select {
			case c := <-s.slots:
				taken++
				if c != nil {
					c.close()
				}
			default:
				break drain
			}
		}
		for range taken {
			s.slots <- nil
		}
	}
}
