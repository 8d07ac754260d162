package rules

import "unsafe"

// arenaChunk is the size of the memory blocks a StringArena copies into.
const arenaChunk = 8 << 10

// StringArena copies short strings into shared blocks of memory, so that
// keeping many of them costs one allocation per block rather than one per
// string: the planner renders the keys of its ops there, the decoder the
// binary log positions it keeps. Bytes once handed out are never written
// again; a block stays alive for as long as any string in it. The zero
// value is ready; a StringArena is not safe for concurrent use.
type StringArena struct{ block []byte }

// Copy returns a string equal to b that shares no memory with b.
func (a *StringArena) Copy(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if len(b) > arenaChunk/8 {
		return string(b) // large: a block of its own
	}
	if cap(a.block)-len(a.block) < len(b) {
		a.block = make([]byte, 0, arenaChunk)
	}
	start := len(a.block)
	a.block = append(a.block, b...)
	return unsafe.String(&a.block[start], len(b))
}

// CopyString is Copy for a string.
func (a *StringArena) CopyString(s string) string {
	return a.Copy(unsafe.Slice(unsafe.StringData(s), len(s)))
}
