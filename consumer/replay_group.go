package consumer

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
