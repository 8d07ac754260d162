// Package retry holds how the daemon waits between attempts of work it
// retries: exponential backoff with jitter, and which attempts are
// logged. Which errors are retried is decided by the caller.
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff returns the wait before attempt (0-based) retry: lo doubled
// per attempt up to hi, less up to a fifth at random so that many
// waiters do not retry in step.
func Backoff(attempt int, lo, hi time.Duration) time.Duration {
	d := lo
	for range min(attempt, 30) {
		d *= 2
		if d >= hi {
			d = hi
			break
		}
	}
	return d - time.Duration(rand.Int64N(int64(d)/5+1))
}

// Logged reports whether retry attempt (0-based) is logged: the first
// ones and then every power of two, so a long outage logs a few lines an
// hour rather than one per retry.
func Logged(attempt int) bool {
	n := attempt + 1
	return n <= 3 || n&(n-1) == 0
}

// Sleep waits d or until ctx ends, returning ctx's error then.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
