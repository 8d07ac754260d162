package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// groupActive reports whether the consumer group has members: a daemon
// that consumes (or, after a SIGKILL, one whose session has not yet timed
// out). A group the brokers do not know has none. It is the one place
// replay asks the brokers about the daemon's group (CheckSetAppend).
func groupActive(ctx context.Context, conn KafkaConn, group string) (bool, error) {
	cl, err := conn.NewClient(slog.New(slog.DiscardHandler))
	if err != nil {
		return false, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	defer cl.Close()
	described, err := kadm.NewClient(cl).DescribeGroups(ctx, group)
	if err != nil {
		return false, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	g, ok := described[group]
	switch {
	case !ok:
		return false, fmt.Errorf("describe consumer group %s: not in the brokers' answer", group)
	case errors.Is(g.Err, kerr.GroupIDNotFound):
		return false, nil
	case g.Err != nil:
		return false, fmt.Errorf("describe consumer group %s: %w", group, g.Err)
	}
	return len(g.Members) > 0 && g.State != "Dead", nil
}

// ErrSetAppendUnsafe is the error CheckSetAppend wraps when appending old
// set tokens could leave a set wrong.
var ErrSetAppendUnsafe = errors.New("appending set tokens could leave sets wrong")

// CheckSetAppend tells whether a replay may append set tokens
// (ReplayConfig.SetAppend) rather than rebuild the sets it touches: only
// when SetAppendRange allows its range and the daemon's consumer group has
// no member, so that no newer token can land before an old one the replay
// appends. Otherwise it returns an error wrapping ErrSetAppendUnsafe that
// says which condition fails, or the error that kept it from asking the
// brokers. Run it before the replay and again after it: a daemon that
// joined meanwhile may have appended newer tokens the replay then covered.
func CheckSetAppend(ctx context.Context, conn KafkaConn, group string, to ReplayBound, file bool) error {
	if err := SetAppendRange(to, file); err != nil {
		return err
	}
	if group == "" {
		return fmt.Errorf("replay: %w: no consumer group to check (kafka.group)", ErrSetAppendUnsafe)
	}
	active, err := groupActive(ctx, conn, group)
	if err != nil {
		return fmt.Errorf("replay: cannot tell whether the daemon runs: %w", err)
	}
	if active {
		return fmt.Errorf("replay: %w: consumer group %s has active members (a daemon runs, or a killed one's session has not timed out yet); stop the daemons first", ErrSetAppendUnsafe, group)
	}
	return nil
}

// SetAppendRange reports whether a replay's range allows appending set
// tokens: Kafka input (file false) read to the live end of every
// partition (to not given). Its error wraps ErrSetAppendUnsafe.
func SetAppendRange(to ReplayBound, file bool) error {
	switch {
	case file:
		return fmt.Errorf("replay: %w: a file is not the live end of the stream", ErrSetAppendUnsafe)
	case !to.IsZero():
		return fmt.Errorf("replay: %w: the replay ends at %s, before the live end: later removals would be undone", ErrSetAppendUnsafe, to)
	}
	return nil
}
