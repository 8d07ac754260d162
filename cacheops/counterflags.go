package cacheops

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
