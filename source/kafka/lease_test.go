package kafka

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestMemberLease checks when a membership lease holds: only for the
// member whose heartbeat was acknowledged, and for less than three
// quarters of the session timeout after that heartbeat was sent.
func TestMemberLease(t *testing.T) {
	t0 := time.Now()
	const session = 8 * time.Second // lease 6s
	tests := []struct {
		name   string
		acks   []string // members acknowledged, one per second from t0
		member string
		at     time.Duration // since t0
		live   bool
	}{
		{name: "never acknowledged", member: "m1", at: 0, live: false},
		{name: "fresh", acks: []string{"m1"}, member: "m1", at: time.Second, live: true},
		{name: "just inside", acks: []string{"m1"}, member: "m1", at: 6*time.Second - time.Millisecond, live: true},
		{name: "expired at three quarters", acks: []string{"m1"}, member: "m1", at: 6 * time.Second, live: false},
		{name: "renewed", acks: []string{"m1", "m1", "m1"}, member: "m1", at: 7 * time.Second, live: true},
		{name: "another member", acks: []string{"m1"}, member: "m2", at: time.Second, live: false},
		{name: "joined again as another member", acks: []string{"m1", "m2"}, member: "m1", at: 2 * time.Second, live: false},
		{name: "the new member", acks: []string{"m1", "m2"}, member: "m2", at: 2 * time.Second, live: true},
		{name: "empty member", acks: []string{""}, member: "", at: time.Second, live: false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newMemberLease(session)
			for i, m := range tc.acks {
				l.ack(m, t0.Add(time.Duration(i)*time.Second))
			}
			err := l.check(tc.member, t0.Add(tc.at))
			if (err == nil) != tc.live {
				t.Fatalf("check = %v, want live %v", err, tc.live)
			}
			if err != nil && !errors.Is(err, ErrMembershipExpired) {
				t.Fatalf("check = %v, want ErrMembershipExpired", err)
			}
		})
	}
}

// TestMemberLeaseWait checks that wait returns at the acknowledgement of
// the member's heartbeat, and not at another member's.
func TestMemberLeaseWait(t *testing.T) {
	l := newMemberLease(time.Minute)
	done := make(chan error, 1)
	go func() { done <- l.wait(context.Background(), "m1") }()
	l.ack("m2", time.Now())
	select {
	case err := <-done:
		t.Fatalf("wait returned %v at another member's heartbeat", err)
	case <-time.After(50 * time.Millisecond):
	}
	l.ack("m1", time.Now())
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return at the member's heartbeat")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.wait(ctx, "m3"); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with an ended context = %v", err)
	}
}
