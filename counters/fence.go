package counters

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Exact counters (docs/exact-counters.md).
//
// A recount reads MySQL's present state while change events that MySQL
// committed earlier may still be on their way. Applied after the recount
// was stored, their deltas would count twice. So a recount runs inside a
// consistent snapshot whose binary log position F the server reports
// (MariaDB and Percona Server: binlog_snapshot_file/_position), and F is
// stored as the counter's fence: a sibling item (FenceKey) holding F and a
// random fence ID, which the counter item's memcached flags repeat (bits
// 16-31 only: itemformat.CounterFlagsMask). A delta
// whose event sits at or before F in the binary log is already in the
// recount and is skipped; later ones are applied. Every daemon instance
// and every reader sees the same fence, because it lives in memcached.
//
// The flags tie a counter value to the fence it was counted at: incr and
// decr keep an item's flags, so "flags == fence ID" means the value is the
// recount at F plus deltas after F. Any other combination means a recount
// is in progress, or died between writing its fence and its value, and the
// delta becomes a recount of its own.

// FenceKeySuffix is appended to a counter key to name its fence item
// (then FinishKey keeps the result within memcached's key limit). It is
// one of the daemon's key marks (rules.CheckLiteral): a rendered key holds
// '%' only followed by two upper-case hex digits (escaped values, and
// literal text and prefixes held to it when rule files load), so no row
// value or template spells a fence key.
const FenceKeySuffix = "%fence"

// FenceKey returns the key of the fence item of the counter at key.
func FenceKey(key string) string {
	if len(key)+len(FenceKeySuffix) <= rules.MaxKeyLen {
		return key + FenceKeySuffix // FinishKey would keep it as it is
	}
	b := make([]byte, 0, len(key)+len(FenceKeySuffix))
	b = append(b, key...)
	b = append(b, FenceKeySuffix...)
	return rules.FinishKey(b)
}

// BinlogPosition is a place in a MySQL/MariaDB server's binary log
// (itemformat.BinlogPosition: the position items of readers on replicas
// compare them the same way).
type BinlogPosition = itemformat.BinlogPosition

// PositionOf returns the binary log position an event came from (zero when
// its format does not carry one).
func PositionOf(p rules.Position) BinlogPosition {
	return BinlogPosition{File: p.BinlogFile, Pos: p.BinlogPos}
}

// ComparePositions orders two positions of one server's binary log
// (itemformat.ComparePositions).
func ComparePositions(a, b BinlogPosition) (order int, ok bool) {
	return itemformat.ComparePositions(a, b)
}

// Fence is the position a counter was recounted at, and the ID that the
// counter item's flags carry while its value is that recount plus the
// deltas after it.
type Fence struct {
	At BinlogPosition
	// ServerID is the @@server_id of the server that counted; 0 when
	// unknown (fences written before it was recorded).
	ServerID uint32
	// GTID is the snapshot's GTID position or set (gtidSet), "" when the
	// server did not name it.
	GTID string
	// ID is never 0 in a stored fence; 0 is the flags of counter values
	// stored without a fence. It is the counter item's flags value: fences
	// written now use bits 16-31 only (newFenceID); earlier ones, any of
	// the 32 bits.
	ID uint32
}

// fenceFormat is the version tag that starts a fence item's value:
// "2 <id> <pos> <server_id> <gtid or -> <file>" (file last: it is the
// only free-form part). Version 1, "1 <id> <pos> <file>", is still read.
const fenceFormat = "2"

// errBadFence reports a fence item this version cannot read.
var errBadFence = errors.New("counters: unreadable fence item")

func encodeFence(f Fence) []byte {
	b := make([]byte, 0, 48+len(f.At.File)+len(f.GTID))
	b = append(b, fenceFormat...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(f.ID), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, f.At.Pos, 10)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(f.ServerID), 10)
	b = append(b, ' ')
	if gtid := strings.Join(strings.Fields(f.GTID), ""); gtid != "" {
		b = append(b, gtid...)
	} else {
		b = append(b, '-')
	}
	b = append(b, ' ')
	return append(b, f.At.File...)
}

// ParseFence reads a fence item's value (the item at FenceKey of a
// counter's key); the error names a value that is not one.
func ParseFence(v []byte) (Fence, error) {
	f, ok := parseFenceFields(string(v))
	if !ok {
		return Fence{}, fmt.Errorf("%w: %.60q", errBadFence, v)
	}
	return f, nil
}

// parseFenceFields reads a fence item's value (encodeFence, or version 1);
// ok is false when it is not one.
func parseFenceFields(v string) (f Fence, ok bool) {
	version, rest, ok := strings.Cut(v, " ")
	if !ok {
		return Fence{}, false
	}
	idField, rest, ok1 := strings.Cut(rest, " ")
	posField, rest, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return Fence{}, false
	}
	switch version {
	case "1":
		f.At.File = rest
	case fenceFormat:
		sidField, rest, ok1 := strings.Cut(rest, " ")
		gtidField, file, ok2 := strings.Cut(rest, " ")
		if !ok1 || !ok2 {
			return Fence{}, false
		}
		sid, err := strconv.ParseUint(sidField, 10, 32)
		if err != nil {
			return Fence{}, false
		}
		f.ServerID = uint32(sid)
		if gtidField != "-" {
			if _, ok := parseGTIDSet(gtidField); !ok {
				return Fence{}, false
			}
			f.GTID = strings.Join(strings.Fields(gtidField), "")
		}
		f.At.File = file
	default:
		return Fence{}, false
	}
	id, err1 := strconv.ParseUint(idField, 10, 32)
	pos, err2 := strconv.ParseInt(posField, 10, 64)
	if err1 != nil || err2 != nil || id == 0 || pos < 0 || f.At.File == "" {
		return Fence{}, false
	}
	f.ID, f.At.Pos = uint32(id), pos
	return f, true
}

// Why says why a delta could not be decided by its position alone.
type Why uint8

const (
	// Decided: the fence said whether the recount includes the event.
	Decided Why = iota
	// NoPosition: the event carries no binary log position and no GTID
	// the fence can be compared with; the delta is applied unfenced.
	NoPosition
	// OtherServer: the event's position belongs to another server's log
	// than the fence's (server ids or log base names differ, or the
	// positions cannot be compared); the counter is recounted.
	OtherServer
	// FenceMissing: the counter's flags name a fence that is gone
	// (evicted or expired alone); the counter is recounted.
	FenceMissing
)

// String returns the reason's metric label.
func (w Why) String() string { return enumName(whyNames[:], uint8(w), "why") }

var whyNames = [...]string{
	Decided:      "decided",
	NoPosition:   "no_position",
	OtherServer:  "other_server",
	FenceMissing: "fence_missing",
}

// enumName returns names[v], the name of the value v of an enumeration,
// or kind(v) for a value that has none.
func enumName(names []string, v uint8, kind string) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return kind + "(" + strconv.Itoa(int(v)) + ")"
}

// includes reports whether the recount at f holds the change of the event
// at pos (in), or why that cannot be told:
//
//  1. Both carry GTIDs of one kind: the event is in the recount exactly
//     when its GTID is in the snapshot's GTID set. GTIDs name a
//     transaction on every server of a replication topology, so this
//     holds across replicas and failovers.
//  2. Else both carry binary log positions: positions of one server's
//     log are ordered, so the event is in the recount when it is at or
//     before f.At. The server ids, when both are known, must be equal,
//     and so must the log's base names: else OtherServer.
//  3. Else NoPosition when the event has no binary log position (GTID
//     only, and the fence has no GTID set), OtherServer otherwise.
func (f Fence) includes(pos rules.Position) (in bool, why Why) {
	if pos.GTID != "" && f.GTID != "" {
		if set, ok := parseGTIDSet(f.GTID); ok {
			if in, ok := set.contains(pos.GTID); ok {
				return in, Decided
			}
		}
	}
	at := PositionOf(pos)
	if !at.Known() {
		return false, NoPosition
	}
	if pos.ServerID != 0 && f.ServerID != 0 && pos.ServerID != f.ServerID {
		return false, OtherServer
	}
	order, ok := ComparePositions(at, f.At)
	if !ok {
		return false, OtherServer
	}
	return order <= 0, Decided
}

// fenceable reports whether an event's position can ever be compared
// with a fence: it carries a binary log position or a GTID.
func fenceable(pos rules.Position) bool {
	return PositionOf(pos).Known() || pos.GTID != ""
}

// FenceView is what one look at memcached saw of a counter and its fence.
type FenceView struct {
	// Counter reports whether the counter item exists; Flags are its
	// memcached flags (the fence ID it was recounted at, 0 when it was
	// stored without a fence).
	Counter bool
	Flags   uint32
	// HasFence reports whether a fence item exists; Fence is its content
	// unless BadFence says it could not be read.
	HasFence bool
	BadFence bool
	Fence    Fence
}

// Consistent reports whether the counter's value is the recount at
// v.Fence plus the deltas applied after it.
func (v FenceView) Consistent() bool {
	return v.Counter && v.HasFence && !v.BadFence && v.Fence.ID != 0 && v.Flags == v.Fence.ID
}

// same reports whether nothing stored a counter value or a fence between
// the two looks (deltas may have changed the value).
func (v FenceView) same(w FenceView) bool {
	return v.Counter == w.Counter && v.Flags == w.Flags && v.HasFence == w.HasFence &&
		v.BadFence == w.BadFence && v.Fence == w.Fence
}

// Verdict is what to do with a counter delta, given the fence.
type Verdict uint8

const (
	// Apply the delta: its change is not in the counter yet, or nothing
	// can tell (no position, no fence: the behaviour without fences).
	Apply Verdict = iota
	// Skip the delta: its event is at or before the fence, so the recount
	// stored there includes it.
	Skip
	// Recount the counter instead: its value and its fence disagree (a
	// recount is in progress, or failed half-way), so neither applying
	// nor skipping is known to be right.
	Recount
)

// String returns the verdict's lower-case name.
func (v Verdict) String() string { return enumName(verdictNames[:], uint8(v), "verdict") }

var verdictNames = [...]string{Apply: "apply", Skip: "skip", Recount: "recount"}

// Verdict decides a delta from an event at pos:
//
//	no binlog position and no GTID         Apply (cannot be fenced)
//	counter missing                        Apply (the miss recounts anyway)
//	counter stored by a reader's unfenced  Recount (its count may hold the
//	recount (itemformat.ReaderCountFlags)    event, or not: nothing tells)
//	no fence item, counter flags 0         Apply (none yet, or expired:
//	                                       older events are long applied)
//	no fence item, counter flags set       Recount (FenceMissing: the fence
//	                                       was evicted or expired alone)
//	fence unreadable                       Recount
//	counter stored without fence (flags 0) Apply (as without fences; a
//	                                       fenced recount racing with it
//	                                       is caught by the recheck)
//	flags != fence ID                      Recount
//	flags == fence ID                      Fence.includes: Skip when the
//	                                       recount includes the event,
//	                                       Apply when not; Recount when the
//	                                       event comes from another server's
//	                                       log (OtherServer); Apply when the
//	                                       event has only a GTID and the
//	                                       fence none (NoPosition)
//
// why says which undecided case it was (Decided otherwise).
func (v FenceView) Verdict(pos rules.Position) (verdict Verdict, why Why) {
	switch {
	case !fenceable(pos):
		return Apply, NoPosition
	case !v.Counter:
		return Apply, Decided
	case v.Flags == itemformat.ReaderCountFlags:
		return Recount, Decided
	case !v.HasFence && v.Flags != 0:
		return Recount, FenceMissing
	case !v.HasFence:
		return Apply, Decided
	case v.BadFence:
		return Recount, Decided
	case v.Flags == 0:
		return Apply, Decided
	case v.Flags != v.Fence.ID:
		return Recount, Decided
	}
	in, why := v.Fence.includes(pos)
	switch {
	case why == OtherServer:
		return Recount, why
	case why != Decided:
		return Apply, why
	case in:
		return Skip, Decided
	}
	return Apply, Decided
}

// RecheckVerdict decides, after deltas were applied with incr or decr,
// whether they may have landed on a recount that already counted them:
// before and after are the looks at memcached around the apply, sources
// the event positions of the deltas. Nothing stored in between: fine. A
// recount stored in between that includes none of the deltas: its value
// lacked them, and they landed on it or made its cas fail: fine. The
// counter gone: missing is correct. Anything else: recount.
func RecheckVerdict(before, after FenceView, sources []rules.Position) Verdict {
	if before.same(after) || !after.Counter {
		return Apply
	}
	if !after.Consistent() || len(sources) == 0 {
		return Recount
	}
	for _, pos := range sources {
		if in, why := after.Fence.includes(pos); in || why != Decided {
			return Recount
		}
	}
	return Apply
}
