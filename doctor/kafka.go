package doctor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/wiring"
)

// checkKafka asks the brokers for the topics' and the DLQ's metadata
// (with the operations the client may perform on them) and for the
// group's committed offsets and lag.
func checkKafka(ctx context.Context, cfg *config.Config, log *slog.Logger, rep *Report) {
	const area = "kafka"
	kc, err := wiring.KafkaConnFromConfig(cfg.Kafka)
	if err != nil {
		rep.add(area, "kafka", Fail, "%v", err)
		return
	}
	cl, err := kc.NewClient(log.With("component", "kafka"))
	if err != nil {
		rep.add(area, "kafka", Fail, "%v", err)
		return
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)

	topics := slices.Clone(cfg.Kafka.Topics)
	if cfg.Kafka.DLQTopic != "" {
		topics = append(topics, cfg.Kafka.DLQTopic)
	}
	md, err := adm.Metadata(kadm.WithAuthorizedOps(ctx), topics...)
	if err != nil {
		rep.add(area, "brokers "+fmt.Sprint(cfg.Kafka.Brokers), Fail, "metadata: %v", kafkaCause(err))
		return
	}
	rep.add(area, "brokers "+fmt.Sprint(cfg.Kafka.Brokers), OK, "%d brokers, cluster %q", len(md.Brokers), md.Cluster)

	for _, t := range cfg.Kafka.Topics {
		td, ok := md.Topics[t]
		switch {
		case !ok || td.Err != nil:
			rep.add(area, "topic "+t, Fail, "%s: not readable (kafka.topics): %v", t, topicErr(td, ok))
		case !allowed(td.AuthorizedOperations, kadm.OpRead):
			rep.add(area, "topic "+t, Fail, "%d partitions, but the client may not read them (grant READ on the topic)", len(td.Partitions))
		default:
			rep.add(area, "topic "+t, OK, "%d partitions", len(td.Partitions))
		}
	}
	if dlq := cfg.Kafka.DLQTopic; dlq != "" {
		td, ok := md.Topics[dlq]
		switch {
		case !ok || td.Err != nil:
			rep.add(area, "dlq "+dlq, Fail, "kafka.dlq_topic %s: %v; poison messages will hold their partitions until it can be written", dlq, topicErr(td, ok))
		case len(td.AuthorizedOperations) == 0:
			rep.add(area, "dlq "+dlq, Warn, "%d partitions; the brokers do not say whether the client may write to it", len(td.Partitions))
		case !allowed(td.AuthorizedOperations, kadm.OpWrite):
			rep.add(area, "dlq "+dlq, Fail, "the client may not write to it (grant WRITE on the topic); poison messages will hold their partitions")
		default:
			rep.add(area, "dlq "+dlq, OK, "%d partitions, writable", len(td.Partitions))
		}
	} else {
		rep.add(area, "dlq", Warn, "no kafka.dlq_topic: poison messages are only logged and counted")
	}

	lags, err := adm.Lag(ctx, cfg.Kafka.Group)
	if err != nil {
		rep.add(area, "group "+cfg.Kafka.Group, Fail, "%v", kafkaCause(err))
		return
	}
	gl, ok := lags[cfg.Kafka.Group]
	switch {
	case !ok:
		rep.add(area, "group "+cfg.Kafka.Group, Warn, "not described by the coordinator")
	case errors.Is(gl.DescribeErr, kerr.GroupIDNotFound) || gl.State == "Dead":
		rep.add(area, "group "+cfg.Kafka.Group, Warn, "not known to the coordinator: no daemon of this group has ever joined (never joined); it starts at kafka.start_offset (%s)", cfg.Kafka.StartOffset)
	case gl.DescribeErr != nil || gl.FetchErr != nil:
		rep.add(area, "group "+cfg.Kafka.Group, Fail, "%v", kafkaCause(errors.Join(gl.DescribeErr, gl.FetchErr)))
	default:
		groupLag(rep, cfg, gl)
	}
}

// groupLag reports the group's state and, per topic, what it committed
// and how far behind it is.
func groupLag(rep *Report, cfg *config.Config, gl kadm.DescribedGroupLag) {
	const area = "kafka"
	subject := "group " + cfg.Kafka.Group
	rep.add(area, subject, OK, "state %s, %d members", gl.State, len(gl.Members))
	for _, t := range cfg.Kafka.Topics {
		parts := gl.Lag[t]
		if len(parts) == 0 {
			rep.add(area, subject+" "+t, Warn, "nothing committed yet: a new group starts at kafka.start_offset (%s)", cfg.Kafka.StartOffset)
			continue
		}
		ids := make([]int32, 0, len(parts))
		for p := range parts {
			ids = append(ids, p)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		var total int64
		var behindStart []int32
		for _, p := range ids {
			l := parts[p]
			if l.Lag > 0 {
				total += l.Lag
			}
			if l.Commit.At >= 0 && l.Start.Err == nil && l.Commit.At < l.Start.Offset {
				behindStart = append(behindStart, p)
			}
		}
		if len(behindStart) > 0 {
			rep.add(area, subject+" "+t, Warn, "committed offsets of partitions %v are older than the log start (retention removed unread records): kafka.offset_reset decides what happens", behindStart)
			continue
		}
		rep.add(area, subject+" "+t, OK, "%d partitions committed, lag %d messages", len(ids), total)
	}
}

func allowed(ops []kadm.ACLOperation, op kadm.ACLOperation) bool {
	// Brokers that do not report operations leave the list empty: that is
	// not a refusal.
	return len(ops) == 0 || slices.Contains(ops, op) || slices.Contains(ops, kadm.OpAll)
}

func topicErr(td kadm.TopicDetail, ok bool) error {
	if !ok {
		return errors.New("not in the brokers' answer")
	}
	return td.Err
}

// kafkaCause words an authentication or authorization failure plainly.
func kafkaCause(err error) error {
	var ae *kadm.AuthError
	if errors.As(err, &ae) {
		return fmt.Errorf("not authorized: %w", err)
	}
	return err
}
