package itemformat

import (
	"math"
	"time"
)

// maxRelativeExpiry is the longest exptime memcached reads as seconds
// from now; larger values are absolute Unix times.
const maxRelativeExpiry = 30 * 24 * 60 * 60

// Expiration converts an item TTL into memcached's exptime field: 0 (or a
// negative ttl) means no expiry; a TTL is rounded up to whole seconds;
// TTLs beyond 30 days become absolute Unix times from now. The writers,
// the counters and the read side all use it.
func Expiration(ttl time.Duration, now time.Time) int32 {
	if ttl <= 0 {
		return 0
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	if secs > maxRelativeExpiry {
		secs += now.Unix()
	}
	return int32(min(secs, math.MaxInt32))
}
