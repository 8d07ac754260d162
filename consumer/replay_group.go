package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// groupActive reports whether the consumer group has members: a daemon
// that consumes (or, after a SIGKILL, one whose session has not yet timed
// out). A group the brokers do not know has none. It is the one place
// replay asks the brokers about the daemon's group (CheckSetAppend).
func groupActive(ctx context.Context, conn KafkaConn, group string) (bool, error) {
	client := &kafka.Client{Addr: kafka.TCP(conn.Brokers...), Timeout: 30 * time.Second, Transport: conn.Transport()}
	resp, err := client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{group}})
	if err != nil {
		return false, fmt.Errorf("describe consumer group %s: %w", group, err)
	}
	for _, g := range resp.Groups {
		if g.GroupID != group {
			continue
		}
		switch {
		case errors.Is(g.Error, kafka.GroupIdNotFound):
			return false, nil
		case g.Error != nil:
			return false, fmt.Errorf("describe consumer group %s: %w", group, g.Error)
		}
		return len(g.Members) > 0, nil
	}
	return false, fmt.Errorf("describe consumer group %s: not in the brokers' answer", group)
}
