package itemformat

import (
	"strconv"
	"strings"
	"time"
)

// namespaceStartShift is the number of low bits a namespace's starting
// version leaves free for its bumps.
const namespaceStartShift = 20

// NamespaceStart returns the version a namespace created at t starts at:
// its Unix time in milliseconds times 2^20 (1,048,576). Every writer (both
// of the daemon's and the read side) creates namespaces with it, so a
// namespace that is evicted and created again starts above every version
// its earlier incarnation handed out, as long as that incarnation was
// bumped fewer than 2^20 times per millisecond of its life (memcached
// serves about a million commands a second, a thousand per millisecond)
// and the creators' clocks disagree by less than the time between the two
// creations. The values stay below 2^63, so readers that hold them in a
// signed 64-bit integer are fine, until the year 2248.
func NamespaceStart(t time.Time) uint64 {
	return uint64(max(t.UnixMilli(), 0)) << namespaceStartShift
}

// versionTrim are the bytes ParseVersion ignores around a version.
const versionTrim = " \t\r\n"

// ParseVersion reads a namespace version (docs/formats.md, "Namespace
// versions"): ASCII decimal digits worth an unsigned 64-bit number.
// memcached pads a number with trailing spaces when an incr or decr
// shortens it; ASCII spaces, tabs, CR and LF on either side are ignored,
// and nothing else (no sign, no other white space). ok is false for
// anything else.
func ParseVersion(value []byte) (v uint64, ok bool) {
	v, err := strconv.ParseUint(strings.Trim(string(value), versionTrim), 10, 64)
	return v, err == nil
}
