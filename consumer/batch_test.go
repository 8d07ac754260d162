package consumer

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestOffsetCommitter drives the committer with a commit function the
// test releases one call at a time.
func TestOffsetCommitter(t *testing.T) {
	calls := make(chan int64)
	results := make(chan error)
	c := newOffsetCommitter(func(next int64) error {
		calls <- next
		return <-results
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.run(ctx)
	}()
	room := func(limit int) int {
		t.Helper()
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer rcancel()
		n, err := c.room(rctx, limit)
		if errors.Is(err, context.DeadlineExceeded) {
			return 0 // would wait
		}
		if err != nil {
			t.Fatalf("room: %v", err)
		}
		return n
	}
	expectCommit := func(want int64) {
		t.Helper()
		select {
		case got := <-calls:
			if got != want {
				t.Fatalf("commit of %d, want %d", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("no commit of %d", want)
		}
	}

	if n := room(100); n != 100 {
		t.Fatalf("room before the first batch = %d, want 100", n)
	}
	c.begin(1000)
	c.applied(1040) // 40 applied, committing
	expectCommit(1040)
	if n := room(100); n != 60 {
		t.Fatalf("room with 40 uncommitted = %d, want 60", n)
	}
	c.applied(1070)
	c.applied(1100) // 100 uncommitted: the next batch must wait
	if n := room(100); n != 0 {
		t.Fatalf("room with 100 uncommitted = %d, want to wait", n)
	}
	results <- nil     // 1040 committed
	expectCommit(1100) // the latest applied, not 1070
	if n := room(100); n != 40 {
		t.Fatalf("room after committing 1040 = %d, want 40", n)
	}
	results <- nil
	// The commit's acknowledgement lands in the committer's goroutine.
	for deadline := time.Now().Add(5 * time.Second); room(100) != 100; {
		if time.Now().After(deadline) {
			t.Fatalf("room with everything committed = %d, want 100", room(100))
		}
		time.Sleep(time.Millisecond)
	}

	c.applied(1101)
	expectCommit(1101)
	results <- errors.New("coordinator moved")
	<-done // run stops at a failed commit
	if _, err := c.room(ctx, 100); err == nil || err.Error() != "offset 1101: coordinator moved" {
		t.Fatalf("room after a failed commit: %v", err)
	}
}
