package itemformat

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// Source positions (docs/formats.md, "Source positions"). The daemon
// keeps, per source database server, the newest source position of the
// changes it has sent ops for: one item at PositionKey(server_id), written
// before a batch's ops and only ever moved forward (MergePositions). A
// reader that fills from a replica reads it after deciding to fill and
// waits until the replica has applied it (SourcePosition.Wait).

// PositionKeyMark starts a position item's key: '%' followed by a byte
// that is not a hex digit is a mark no rendered key holds (docs/formats.md,
// "Keys", "Marks").
const PositionKeyMark = "%pos:"

// PositionKey returns the key of the position item of the source server
// whose server_id is serverID.
func PositionKey(serverID uint32) string {
	return PositionKeyMark + strconv.FormatUint(uint64(serverID), 10)
}

// BinlogPosition is a place in a MySQL/MariaDB server's binary log: a file
// name such as "mysql-bin.000042" and a byte offset in it. The zero value
// means unknown.
type BinlogPosition struct {
	File string
	Pos  int64
}

// Known reports whether p names a place in a binary log.
func (p BinlogPosition) Known() bool { return p.File != "" }

// String returns "file:pos", or "" for the zero position.
func (p BinlogPosition) String() string {
	if !p.Known() {
		return ""
	}
	return p.File + ":" + strconv.FormatInt(p.Pos, 10)
}

// ComparePositions orders two positions of one server's binary log: by the
// file's numeric suffix ("mysql-bin.000009" < "mysql-bin.000010", and
// "mysql-bin.999999" < "mysql-bin.1000000"), then by offset. ok is false
// when they cannot be compared: either is unknown, or their files have
// different base names or no numeric suffix (another server, or a renamed
// log), which says nothing about their order.
func ComparePositions(a, b BinlogPosition) (order int, ok bool) {
	if !a.Known() || !b.Known() {
		return 0, false
	}
	if a.File == b.File {
		return cmp.Compare(a.Pos, b.Pos), true
	}
	baseA, seqA, okA := splitBinlogName(a.File)
	baseB, seqB, okB := splitBinlogName(b.File)
	if !okA || !okB || baseA != baseB {
		return 0, false
	}
	if c := cmp.Compare(seqA, seqB); c != 0 {
		return c, true
	}
	return cmp.Compare(a.Pos, b.Pos), true
}

// splitBinlogName splits "base.000123" into "base" and 123.
func splitBinlogName(name string) (base string, seq uint64, ok bool) {
	dot := strings.LastIndexByte(name, '.')
	if dot < 0 || dot == len(name)-1 {
		return "", 0, false
	}
	for i := dot + 1; i < len(name); i++ {
		if name[i] < '0' || name[i] > '9' {
			return "", 0, false
		}
	}
	seq, err := strconv.ParseUint(name[dot+1:], 10, 64)
	if err != nil {
		return "", 0, false
	}
	return name[:dot], seq, true
}

// GTID is one global transaction id: MariaDB's domain-server-seq (UUID
// empty), or MySQL's uuid:n (UUID the source's lower-case UUID, Seq n;
// Domain and Server zero).
type GTID struct {
	Domain, Server uint32
	Seq            uint64
	UUID           string
}

// ParseGTID parses one GTID as change events carry it: MariaDB's
// "0-1-1040" or MySQL's "3e11fa47-71ca-11e1-9e33-c80aa9429562:23" (either
// case). ok is false for anything else (a GTID set, MySQL 8.4's tagged
// GTIDs, an empty text).
func ParseGTID(s string) (GTID, bool) {
	if i := strings.IndexByte(s, ':'); i >= 0 {
		uuid, n := strings.ToLower(s[:i]), s[i+1:]
		if !isUUID(uuid) || !allDigits(n) {
			return GTID{}, false
		}
		seq, err := strconv.ParseUint(n, 10, 64)
		if err != nil || seq == 0 {
			return GTID{}, false
		}
		return GTID{UUID: uuid, Seq: seq}, true
	}
	d, rest, ok1 := strings.Cut(s, "-")
	sv, n, ok2 := strings.Cut(rest, "-")
	if !ok1 || !ok2 || !allDigits(d) || !allDigits(sv) || !allDigits(n) {
		return GTID{}, false
	}
	domain, err1 := strconv.ParseUint(d, 10, 32)
	server, err2 := strconv.ParseUint(sv, 10, 32)
	seq, err3 := strconv.ParseUint(n, 10, 64)
	if err1 != nil || err2 != nil || err3 != nil {
		return GTID{}, false
	}
	return GTID{Domain: uint32(domain), Server: uint32(server), Seq: seq}, true
}

// MySQL reports whether g is a MySQL GTID (uuid:n).
func (g GTID) MySQL() bool { return g.UUID != "" }

// String returns the GTID as written in a position item.
func (g GTID) String() string {
	if g.MySQL() {
		return g.UUID + ":" + strconv.FormatUint(g.Seq, 10)
	}
	return strconv.FormatUint(uint64(g.Domain), 10) + "-" + strconv.FormatUint(uint64(g.Server), 10) + "-" + strconv.FormatUint(g.Seq, 10)
}

// sameStream reports whether g and o belong to one replication stream,
// whose GTIDs are ordered by their sequence numbers: MariaDB's
// domain, MySQL's source UUID.
func (g GTID) sameStream(o GTID) bool {
	return g.UUID == o.UUID && (g.MySQL() || g.Domain == o.Domain)
}

func compareStreams(a, b GTID) int {
	if a.MySQL() != b.MySQL() {
		if a.MySQL() {
			return 1 // MariaDB entries first
		}
		return -1
	}
	if a.MySQL() {
		return strings.Compare(a.UUID, b.UUID)
	}
	return cmp.Compare(a.Domain, b.Domain)
}

// SourcePosition is how far one source server's changes go: the newest
// GTID of each replication stream (MariaDB domain, MySQL UUID), sorted,
// and the newest binary log position. The zero value is no position.
type SourcePosition struct {
	GTIDs  []GTID
	Binlog BinlogPosition
}

// Known reports whether p holds a GTID or a binary log position.
func (p SourcePosition) Known() bool { return len(p.GTIDs) > 0 || p.Binlog.Known() }

// PositionOfEvent returns the source position an event carries: its
// GTID when it parses (ParseGTID) and its binary log position.
func PositionOfEvent(src rules.Position) SourcePosition {
	var p SourcePosition
	if g, ok := ParseGTID(src.GTID); ok {
		p.GTIDs = []GTID{g}
	}
	if src.BinlogFile != "" {
		p.Binlog = BinlogPosition{File: src.BinlogFile, Pos: src.BinlogPos}
	}
	return p
}

// Include moves p forward to cover an event's position (as
// MergePositions with PositionOfEvent(src), in place): for the batch's
// newest position, event by event. It allocates only for a stream p does
// not hold yet.
func (p *SourcePosition) Include(src rules.Position) {
	if g, ok := ParseGTID(src.GTID); ok {
		p.addGTID(g)
	}
	if src.BinlogFile != "" {
		p.addBinlog(BinlogPosition{File: src.BinlogFile, Pos: src.BinlogPos})
	}
}

// addGTID keeps g when it is newer than p's GTID of its stream.
func (p *SourcePosition) addGTID(g GTID) {
	i := slices.IndexFunc(p.GTIDs, g.sameStream)
	switch {
	case i < 0:
		p.GTIDs = append(p.GTIDs, g)
		slices.SortFunc(p.GTIDs, compareStreams)
	case g.Seq > p.GTIDs[i].Seq:
		p.GTIDs[i] = g
	}
}

// addBinlog keeps b when it is after p's binary log position, or when the
// two cannot be compared (another server's log).
func (p *SourcePosition) addBinlog(b BinlogPosition) {
	if order, ok := ComparePositions(p.Binlog, b); !ok || order < 0 {
		p.Binlog = b
	}
}

// Encode returns the position item's value: "gtid=" and the GTIDs
// comma-separated, a space, "binlog=" file:pos; either left out when
// empty.
func (p SourcePosition) Encode() []byte {
	var b []byte
	if len(p.GTIDs) > 0 {
		b = append(b, "gtid="...)
		for i, g := range p.GTIDs {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, g.String()...)
		}
	}
	if p.Binlog.Known() {
		if len(b) > 0 {
			b = append(b, ' ')
		}
		b = append(b, "binlog="...)
		b = append(b, p.Binlog.String()...)
	}
	return b
}

// maxPositionGTIDs bounds the GTIDs of one item (one per domain or
// source UUID): a value with more is not a position item.
const maxPositionGTIDs = 64

// DecodePosition parses a position item's value. Tokens other than gtid=
// and binlog= are ignored, as are spaces, tabs, CR and LF around them. It
// fails (with the reason) when a gtid= or binlog= token does not parse, a
// stream appears twice, or the item holds more than 64 GTIDs.
func DecodePosition(value []byte) (SourcePosition, error) {
	var p SourcePosition
	for _, tok := range strings.FieldsFunc(string(value), func(r rune) bool { return r == ' ' || r == '\t' || r == '\r' || r == '\n' }) {
		switch {
		case strings.HasPrefix(tok, "gtid="):
			list := strings.Split(tok[len("gtid="):], ",")
			if len(list) > maxPositionGTIDs {
				return SourcePosition{}, fmt.Errorf("position item: %d GTIDs, at most %d", len(list), maxPositionGTIDs)
			}
			for _, s := range list {
				g, ok := ParseGTID(s)
				if !ok {
					return SourcePosition{}, fmt.Errorf("position item: %q is not a GTID", s)
				}
				for _, h := range p.GTIDs {
					if h.sameStream(g) {
						return SourcePosition{}, fmt.Errorf("position item: two GTIDs of one stream: %s and %s", h, g)
					}
				}
				p.GTIDs = append(p.GTIDs, g)
			}
		case strings.HasPrefix(tok, "binlog="):
			fp := tok[len("binlog="):]
			i := strings.LastIndexByte(fp, ':')
			if i <= 0 || !allDigits(fp[i+1:]) {
				return SourcePosition{}, fmt.Errorf("position item: binlog %q is not file:offset", fp)
			}
			pos, err := strconv.ParseInt(fp[i+1:], 10, 64)
			if err != nil {
				return SourcePosition{}, fmt.Errorf("position item: binlog %q: offset out of range", fp)
			}
			p.Binlog = BinlogPosition{File: fp[:i], Pos: pos}
		}
	}
	slices.SortFunc(p.GTIDs, compareStreams)
	return p, nil
}

// MergePositions returns the position at or after both a and b: for each
// stream the greater GTID, and the greater binary log position when both
// name the same log; when they cannot be compared (another server's log
// after a failover), b's. Merging b into the stored a is how a position
// item moves: never backwards.
func MergePositions(a, b SourcePosition) SourcePosition {
	out := SourcePosition{GTIDs: slices.Clone(a.GTIDs), Binlog: a.Binlog}
	for _, g := range b.GTIDs {
		out.addGTID(g)
	}
	if b.Binlog.Known() {
		out.addBinlog(b.Binlog)
	}
	return out
}

// Equal reports whether p and q are the same position.
func (p SourcePosition) Equal(q SourcePosition) bool {
	return p.Binlog == q.Binlog && slices.Equal(p.GTIDs, q.GTIDs)
}

// ReplicaWait is the statement that waits on a replica until it has
// applied a position (docs/formats.md, "Source positions"): Query with
// Args bound to its placeholders, the last one the bound in seconds.
type ReplicaWait struct {
	// Function names the server function: MASTER_GTID_WAIT,
	// WAIT_FOR_EXECUTED_GTID_SET or MASTER_POS_WAIT.
	Function string
	Query    string
	Args     []any
}

// Wait returns the statement that waits until a replica has applied p,
// for at most maxWaitSeconds: MariaDB GTIDs with MASTER_GTID_WAIT, MySQL
// GTIDs with WAIT_FOR_EXECUTED_GTID_SET ("uuid:1-n" each), else the
// binary log position with MASTER_POS_WAIT (offset plus one: the event's
// transaction starts at its offset). ok is false for a position that is
// not known, or that mixes MariaDB and MySQL GTIDs.
func (p SourcePosition) Wait(maxWaitSeconds float64) (w ReplicaWait, ok bool) {
	if len(p.GTIDs) > 0 {
		mysql := p.GTIDs[0].MySQL()
		parts := make([]string, len(p.GTIDs))
		for i, g := range p.GTIDs {
			if g.MySQL() != mysql {
				return ReplicaWait{}, false
			}
			if mysql {
				parts[i] = g.UUID + ":1-" + strconv.FormatUint(g.Seq, 10)
			} else {
				parts[i] = g.String()
			}
		}
		if mysql {
			return ReplicaWait{Function: "WAIT_FOR_EXECUTED_GTID_SET", Query: "SELECT WAIT_FOR_EXECUTED_GTID_SET(?, ?)",
				Args: []any{strings.Join(parts, ","), maxWaitSeconds}}, true
		}
		return ReplicaWait{Function: "MASTER_GTID_WAIT", Query: "SELECT MASTER_GTID_WAIT(?, ?)",
			Args: []any{strings.Join(parts, ","), maxWaitSeconds}}, true
	}
	if p.Binlog.Known() {
		return ReplicaWait{Function: "MASTER_POS_WAIT", Query: "SELECT MASTER_POS_WAIT(?, ?, ?)",
			Args: []any{p.Binlog.File, p.Binlog.Pos + 1, maxWaitSeconds}}, true
	}
	return ReplicaWait{}, false
}

// WaitOutcome is what a ReplicaWait's single result says.
type WaitOutcome uint8

const (
	// WaitReached: the replica has applied the position.
	WaitReached WaitOutcome = iota + 1
	// WaitTimedOut: the bound passed first.
	WaitTimedOut
	// WaitUnusable: NULL (not a replica, replication not running) or a
	// result the function never gives.
	WaitUnusable
)

// Outcome reads the wait's result: result is its text, null when NULL.
func (w ReplicaWait) Outcome(result string, null bool) WaitOutcome {
	if null {
		return WaitUnusable
	}
	n, err := strconv.ParseInt(strings.TrimSpace(result), 10, 64)
	if err != nil {
		return WaitUnusable
	}
	switch w.Function {
	case "MASTER_GTID_WAIT":
		switch n {
		case 0:
			return WaitReached
		case -1:
			return WaitTimedOut
		}
	case "WAIT_FOR_EXECUTED_GTID_SET":
		switch n {
		case 0:
			return WaitReached
		case 1:
			return WaitTimedOut
		}
	case "MASTER_POS_WAIT":
		switch {
		case n >= 0:
			return WaitReached
		case n == -1:
			return WaitTimedOut
		}
	}
	return WaitUnusable
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// isUUID reports whether s is a lower-case 8-4-4-4-12 hex UUID.
func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
				return false
			}
		}
	}
	return true
}
