package itemformat

import (
	"strconv"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

// Generations (docs/formats.md, "Generations"). A table's generation item
// (rules.GenerationKey) holds its generation as a namespace version: a
// missing one is created with add of NewGeneration and bumped with
// incr. Sets carry the generation they were loaded under as their first
// token; counters live at a key that ends with it (CounterKey). A set or
// counter of another generation than the current one, or of a table whose
// generation item is missing, is not valid.

// NewGeneration returns the value a missing generation item is created
// with at t: the namespace start (NamespaceStart), so that a generation
// never repeats one an evicted item held.
func NewGeneration(t time.Time) uint64 { return NamespaceStart(t) }

// ParseGeneration parses a generation item's value as ParseVersion does.
func ParseGeneration(value []byte) (uint64, bool) { return ParseVersion(value) }

// generationTokenByte starts a set's generation token.
const generationTokenByte = 'g'

// AppendGenerationToken appends the generation token of gen: 'g', gen in
// decimal, a space.
func AppendGenerationToken(dst []byte, gen uint64) []byte {
	dst = append(dst, generationTokenByte)
	dst = strconv.AppendUint(dst, gen, 10)
	return append(dst, ' ')
}

// parseGenerationToken parses a token (without its separator) as a
// generation token: 'g' and one or more ASCII digits worth at most
// 2^64-1, nothing else.
func parseGenerationToken(tok []byte) (uint64, bool) {
	if len(tok) < 2 || tok[0] != generationTokenByte {
		return 0, false
	}
	for _, b := range tok[1:] {
		if b < '0' || b > '9' {
			return 0, false
		}
	}
	g, err := strconv.ParseUint(string(tok[1:]), 10, 64)
	return g, err == nil
}

// EncodeSetAt returns the compact set of generation gen holding exactly
// the given escaped members: the generation token, then a "+m " token
// per member.
func EncodeSetAt(gen uint64, escapedMembers []string) []byte {
	n := 22
	for _, m := range escapedMembers {
		n += len(m) + 2
	}
	out := AppendGenerationToken(make([]byte, 0, n), gen)
	for _, m := range escapedMembers {
		out = AppendEscapedToken(out, true, m)
	}
	return out
}

// EncodeLoadedSetAt is EncodeLoadedSet for a set loaded under generation
// gen (read before the load query ran).
func EncodeLoadedSetAt(gen uint64, members []string) []byte {
	return EncodeSetAt(gen, loadedEscaped(members))
}

// CounterKey returns the key of the counter at key (a count rule's
// rendered key, after rules.FinishKey) under generation gen: key, "%@",
// gen in decimal, through rules.FinishKey again. The daemon applies
// deltas only at the current generation's key, so a counter of an
// earlier generation is never read or changed again.
func CounterKey(key string, gen uint64) string {
	buf := make([]byte, 0, len(key)+21)
	buf = append(buf, key...)
	buf = append(buf, rules.CounterGenerationMark...)
	buf = strconv.AppendUint(buf, gen, 10)
	return rules.FinishKey(buf)
}
