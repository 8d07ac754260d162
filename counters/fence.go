package counters

import (
	"cmp"
	"errors"
	"fmt"
	"strconv"
	"strings"

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
// random fence ID, which the counter item's memcached flags repeat. A delta
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
// (then FinishKey keeps the result within memcached's key limit). A '%'
// followed by a lower-case letter never comes out of a substituted value
// (escaping writes upper-case hex), so only a template that spells
// "%fence" itself could collide with a fence key; such templates are
// reserved.
const FenceKeySuffix = "%fence"

// FenceKey returns the key of the fence item of the counter at key.
func FenceKey(key string) string {
	b := make([]byte, 0, len(key)+len(FenceKeySuffix))
	b = append(b, key...)
	b = append(b, FenceKeySuffix...)
	return rules.FinishKey(b)
}

// BinlogPosition is a place in a MySQL/MariaDB server's binary log: a file
// name such as "mysql-bin.000042" and a byte offset in it. The zero value
// means unknown.
type BinlogPosition struct {
	File string
	Pos  int64
}

// PositionOf returns the binary log position an event came from (zero when
// its format does not carry one).
func PositionOf(p rules.Position) BinlogPosition {
	return BinlogPosition{File: p.BinlogFile, Pos: p.BinlogPos}
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

// Fence is the position a counter was recounted at, and the ID that the
// counter item's flags carry while its value is that recount plus the
// deltas after it.
type Fence struct {
	At BinlogPosition
	// ID is never 0 in a stored fence; 0 is the flags of counter values
	// stored without a fence.
	ID uint32
}

// fenceFormat is the version tag that starts a fence item's value:
// "1 <id> <pos> <file>" (file last: it is the only free-form part).
const fenceFormat = "1"

// errBadFence reports a fence item this version cannot read.
var errBadFence = errors.New("counters: unreadable fence item")

func encodeFence(f Fence) []byte {
	b := make([]byte, 0, 32+len(f.At.File))
	b = append(b, fenceFormat...)
	b = append(b, ' ')
	b = strconv.AppendUint(b, uint64(f.ID), 10)
	b = append(b, ' ')
	b = strconv.AppendInt(b, f.At.Pos, 10)
	b = append(b, ' ')
	return append(b, f.At.File...)
}

func parseFence(v []byte) (Fence, error) {
	parts := strings.SplitN(string(v), " ", 4)
	if len(parts) != 4 || parts[0] != fenceFormat {
		return Fence{}, fmt.Errorf("%w: %.60q", errBadFence, v)
	}
	id, err1 := strconv.ParseUint(parts[1], 10, 32)
	pos, err2 := strconv.ParseInt(parts[2], 10, 64)
	if err1 != nil || err2 != nil || id == 0 || pos < 0 || parts[3] == "" {
		return Fence{}, fmt.Errorf("%w: %.60q", errBadFence, v)
	}
	return Fence{At: BinlogPosition{File: parts[3], Pos: pos}, ID: uint32(id)}, nil
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
func (v Verdict) String() string {
	switch v {
	case Apply:
		return "apply"
	case Skip:
		return "skip"
	case Recount:
		return "recount"
	}
	return "verdict(" + strconv.Itoa(int(v)) + ")"
}

// Verdict decides a delta from an event at pos:
//
//	no binlog position on the event        Apply (cannot be fenced)
//	counter missing                        Apply (the miss recounts anyway)
//	no fence item                          Apply (none yet, or expired:
//	                                       older events are long applied)
//	fence unreadable                       Recount
//	counter stored without fence (flags 0) Apply (as without fences; a
//	                                       fenced recount racing with it
//	                                       is caught by the recheck)
//	flags == fence ID                      Skip at or before the fence,
//	                                       Apply after it, Apply when the
//	                                       positions cannot be compared
//	flags != fence ID                      Recount
//
// incomparable reports the last case's positions that cannot be compared
// (another server's binary log: a failover, or recounts on a replica).
func (v FenceView) Verdict(pos rules.Position) (verdict Verdict, incomparable bool) {
	at := PositionOf(pos)
	switch {
	case !at.Known(), !v.Counter, !v.HasFence:
		return Apply, false
	case v.BadFence:
		return Recount, false
	case v.Flags == 0:
		return Apply, false
	case v.Flags != v.Fence.ID:
		return Recount, false
	}
	order, ok := ComparePositions(at, v.Fence.At)
	switch {
	case !ok:
		return Apply, true
	case order <= 0:
		return Skip, false
	}
	return Apply, false
}

// RecheckVerdict decides, after deltas were applied with incr or decr,
// whether they may have landed on a recount that already counted them:
// before and after are the looks at memcached around the apply, first the
// earliest event position among the deltas. Nothing stored in between:
// fine. A recount stored in between whose fence is before first: its
// value lacked the deltas, which landed on it or made its cas fail:
// fine. The counter gone: missing is correct. Anything else: recount.
func RecheckVerdict(before, after FenceView, first BinlogPosition) Verdict {
	if before.same(after) || !after.Counter {
		return Apply
	}
	if after.Consistent() {
		if order, ok := ComparePositions(first, after.Fence.At); ok && order > 0 {
			return Apply
		}
	}
	return Recount
}
