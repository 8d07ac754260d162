package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The group protocol timers franz-go uses when Config leaves them zero.
const (
	defaultSessionTimeout    = 45 * time.Second
	defaultHeartbeatInterval = 3 * time.Second
)

// ErrMembershipExpired is the refusal of a write or a commit by a member
// whose group session may have expired: no heartbeat of its membership was
// acknowledged by the coordinator within the lease (memberLease), or the
// member joined again under a new member ID since the partition was
// assigned to it (docs/reliability.md, "A frozen member").
var ErrMembershipExpired = errors.New("kafka: the group session may have expired")

// memberLease tells whether the daemon's group membership is surely
// still live. The coordinator expels a member session_timeout after the
// last heartbeat it received; a heartbeat sent at t and acknowledged
// proves the member was live until t + session_timeout at least, on any
// clock that advanced while the process was stopped. So the lease holds
// while less than valid (session timeout minus a quarter) has passed, on
// the monotonic clock, since the last acknowledged heartbeat was sent,
// and only for the member ID it was sent for.
//
// franz-go reports a heartbeat's timing to hooks (kgo.HookBrokerE2E) but
// not its answer: a heartbeat answered UNKNOWN_MEMBER_ID looks like any
// other there. So the daemon sends heartbeats of its own membership
// beside the client's (heartbeat, every heartbeat interval), with the
// member ID and generation the client holds, and reads the answers.
//
// It is safe for concurrent use.
type memberLease struct {
	valid time.Duration

	mu     sync.Mutex
	member string
	sentAt time.Time // zero: no acknowledged heartbeat for member yet
	// acked is closed and replaced at each acknowledgement.
	acked chan struct{}
}

func newMemberLease(session time.Duration) *memberLease {
	return &memberLease{valid: session - session/4, acked: make(chan struct{})}
}

// ack records that the coordinator acknowledged a heartbeat of member
// sent at sentAt.
func (l *memberLease) ack(member string, sentAt time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if member == l.member && !sentAt.After(l.sentAt) {
		return
	}
	l.member, l.sentAt = member, sentAt
	close(l.acked)
	l.acked = make(chan struct{})
}

// check returns nil when member's lease holds at now, else an error
// wrapping ErrMembershipExpired that says why.
func (l *memberLease) check(member string, now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.member == "":
		return fmt.Errorf("%w: no heartbeat acknowledged yet", ErrMembershipExpired)
	case member == "" || member != l.member:
		return fmt.Errorf("%w: no heartbeat of member %q acknowledged (the member joined again since)", ErrMembershipExpired, member)
	}
	if age := now.Sub(l.sentAt); age >= l.valid {
		return fmt.Errorf("%w: the last heartbeat acknowledged was sent %v ago (lease %v)", ErrMembershipExpired, age.Round(time.Millisecond), l.valid)
	}
	return nil
}

// age returns how long ago the last acknowledged heartbeat was sent, and
// false when none was.
func (l *memberLease) age(now time.Time) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sentAt.IsZero() {
		return 0, false
	}
	return now.Sub(l.sentAt), true
}

// wait returns nil once member's lease holds, or ctx's error when ctx
// ends first.
func (l *memberLease) wait(ctx context.Context, member string) error {
	for {
		l.mu.Lock()
		ch := l.acked
		l.mu.Unlock()
		if l.check(member, time.Now()) == nil {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// heartbeatLoop sends a heartbeat of the client's membership every
// interval, and at once when poke is signalled, until ctx ends, and
// records the acknowledged ones in l. A heartbeat answered without error,
// or with REBALANCE_IN_PROGRESS (the coordinator counts it as one), is an
// acknowledgement; any other answer (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION
// while the client joins a new generation) or no answer is not, and the
// lease runs out unless a later one is.
func (l *memberLease) heartbeatLoop(ctx context.Context, cl *kgo.Client, group string, interval, session time.Duration, poke <-chan struct{}, log *slog.Logger) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var lastErr error
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-poke:
		}
		member, gen := cl.GroupMetadata()
		if member == "" || gen < 0 {
			continue // not in a generation: nothing to prove
		}
		req := kmsg.NewPtrHeartbeatRequest()
		req.Group, req.MemberID, req.Generation = group, member, gen
		sent := time.Now()
		rctx, cancel := context.WithTimeout(ctx, session)
		resp, err := req.RequestWith(rctx, cl)
		cancel()
		if err == nil {
			err = kerr.ErrorForCode(resp.ErrorCode)
		}
		if err == nil || errors.Is(err, kerr.RebalanceInProgress) {
			l.ack(member, sent)
			lastErr = nil
			continue
		}
		if ctx.Err() != nil {
			return
		}
		if lastErr == nil || lastErr.Error() != err.Error() {
			log.Info("group heartbeat not acknowledged", "member", member, "generation", gen, "error", err.Error())
		}
		lastErr = err
	}
}
