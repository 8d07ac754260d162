package itemformat

import "strconv"

// Client flags of counter items (docs/formats.md, "Counters"). A counter's
// value is plain ASCII decimal; its flags say how it was counted, and use
// only bits 16 to 31, so that every common client reads it as the plain
// number it holds: php-memcached takes bits 0-3 as its value type and bits
// 4-15 as compression and its own flags, but leaves bits 16-31 to the
// application (OPT_USER_FLAGS); pylibmc and pymemcache's serdes interpret
// bits 0-5 only.
const (
	// CounterFlagsMask covers the bits counter flags may use.
	CounterFlagsMask uint32 = 0xffff0000
	// ReaderCountFlags marks a counter a reader recounted without a fence
	// (client.Count): the daemon does not apply deltas to it but recounts
	// it, fenced, at the first delta that can be fenced. No fence id is
	// ever this value.
	ReaderCountFlags uint32 = 1 << 16
)

// ParseCount reads a counter item's value (docs/formats.md, "Counters"):
// one or more ASCII digits worth at most 2^63-1, followed by any number of
// spaces (memcached pads a number that an incr or decr shortened), and
// nothing else: no sign, no other white space. ok is false for anything
// else.
func ParseCount(value []byte) (n int64, ok bool) {
	end := len(value)
	for end > 0 && value[end-1] == ' ' {
		end--
	}
	if end == 0 {
		return 0, false
	}
	for _, b := range value[:end] {
		if b < '0' || b > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(string(value[:end]), 10, 64)
	return n, err == nil
}
