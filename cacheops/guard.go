package cacheops

import (
	"context"
	"errors"
	"fmt"
)

// ErrWriteRefused marks ops that were not sent because the guard the caller
// attached to the context (WithGuard) refused: the caller may no longer
// write (the daemon's group membership may have expired). It is not
// Retryable: the caller decides what to do with the batch.
var ErrWriteRefused = errors.New("cacheops: write refused by the caller's guard")

type guardKey struct{}

// WithGuard returns a context carrying guard, which the Applier and the
// counters package call before each write they send (each request over
// the text transport, each exchange over the meta transport, each counter
// write): a non-nil error fails the ops not yet sent with
// ErrWriteRefused, and nothing more is sent. guard must be cheap and safe for concurrent use.
func WithGuard(ctx context.Context, guard func() error) context.Context {
	return context.WithValue(ctx, guardKey{}, guard)
}

// CheckGuard calls ctx's guard (see WithGuard) and returns its refusal
// wrapped in ErrWriteRefused; nil when ctx has no guard or it allows
// writing.
func CheckGuard(ctx context.Context) error {
	g, _ := ctx.Value(guardKey{}).(func() error)
	if g == nil {
		return nil
	}
	if err := g(); err != nil {
		return fmt.Errorf("%w: %w", ErrWriteRefused, err)
	}
	return nil
}
