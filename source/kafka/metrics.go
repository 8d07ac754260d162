package kafka

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/internal/promx"
)

// Metrics are the Kafka source's Prometheus metrics: the consumer group
// member's lag, commits, assignments, stalls, handoffs and membership
// lease, and the schema registry's requests. Create them with NewMetrics
// beside the pipeline's (pipeline.NewMetrics) on the same registry; a
// Metrics is safe for concurrent use.
type Metrics struct {
	schemaFetches   *prometheus.CounterVec
	lag             *prometheus.GaugeVec
	commitDuration  prometheus.Histogram
	commits         *prometheus.CounterVec
	groupJoined     prometheus.Gauge
	assigned        prometheus.Gauge
	generations     prometheus.Counter
	partitionErrors prometheus.Counter
	stalled         *prometheus.GaugeVec
	commitRetries   prometheus.Counter
	handoffs        *prometheus.CounterVec
	abandoned       prometheus.Counter
	leaseAge        prometheus.Gauge
}

// NewMetrics creates the metrics and registers them with reg (which must
// not hold them already). A nil reg leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	b := promx.Maker{Reg: reg}
	m.schemaFetches = b.CounterVec("cachewarden_schema_registry_requests_total", "Schemas of Avro messages asked of the schema registry (once per schema id), by outcome: found, not_found (its messages are poison), error (asked again; the partition waits).", "outcome")
	m.lag = b.GaugeVec("cachewarden_consumer_lag", "Messages behind the partition's high watermark after the last applied batch.", "topic", "partition")
	m.commitDuration = b.Histogram("cachewarden_commit_duration_seconds", promx.LatencyBuckets, "Time of one offset commit.")
	m.commits = b.CounterVec("cachewarden_commits_total", "Offset commits, by outcome (ok, error).", "outcome")
	m.groupJoined = b.Gauge("cachewarden_group_joined", "1 while the daemon is a member of a consumer group generation.")
	m.assigned = b.Gauge("cachewarden_assigned_partitions", "Partitions assigned in the current generation.")
	m.generations = b.Counter("cachewarden_group_generations_total", "Consumer group generations joined (rebalances).")
	m.partitionErrors = b.Counter("cachewarden_partition_errors_total", "Partitions stopped by a fetch or commit error the client does not retry (they stay stalled until assigned again).")
	m.stalled = b.GaugeVec("cachewarden_partition_stalled", "1 for an assigned partition that stopped on a failure, or applied no batch for kafka.stall_timeout while messages waited; the daemon is not ready while one is.", "topic", "partition")
	m.commitRetries = b.Counter("cachewarden_commit_retries_total", "Offset commits of a partition that failed and were tried again (the group coordinator moving or rebalancing, or unreachable).")
	m.handoffs = b.CounterVec("cachewarden_partition_handoffs_total", "Partitions released on a rebalance or shutdown, by outcome: clean (exactly the applied messages committed, the next owner recounts nothing), abandoned (a batch was abandoned half applied; the next owner recounts its first batch) or lost (held under a membership that may have expired, or the group's commit was past it: nothing committed, the next owner recounts).", "outcome")
	m.abandoned = b.Counter("cachewarden_batches_abandoned_total", "Batches abandoned before a write because the group membership may have expired (no heartbeat acknowledged within three quarters of kafka.session_timeout, or the member joined again): nothing more of them was sent and nothing committed. Any increase means the process stalled or lost the coordinator for most of a session timeout.")
	m.leaseAge = b.Gauge("cachewarden_group_heartbeat_age_seconds", "Time since the last group heartbeat the coordinator acknowledged was sent; writes stop when it reaches three quarters of kafka.session_timeout.")
	return m
}

func (m *Metrics) setLag(topic string, partition int, lag int64) {
	m.lag.WithLabelValues(topic, strconv.Itoa(partition)).Set(float64(max(lag, 0)))
}

func (m *Metrics) setStalled(topic string, partition int, stalled bool) {
	promx.SetBool(m.stalled.WithLabelValues(topic, strconv.Itoa(partition)), stalled)
}

func (m *Metrics) forgetPartition(topic string, partition int) {
	m.lag.DeleteLabelValues(topic, strconv.Itoa(partition))
	m.stalled.DeleteLabelValues(topic, strconv.Itoa(partition))
}
