package consumer

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the daemon's Prometheus metrics. Create them with NewMetrics
// on a registry of your own; a Metrics is safe for concurrent use.
//
// Outcomes of cachewarden_events_total: "planned" (a row change that
// produced ops), "unmatched" (a row change no rule turned into an op),
// "skipped" (a message without row changes: DDL, heartbeat, tombstone...),
// "poison" (a message that could not be decoded or planned). Outcomes of
// cachewarden_ops_total are cacheops outcome names ("incr", "added",
// "appended", "loaded", "deleted", "recounted", ...) and "failed" for an op
// given up on after a permanent error; retried attempts are counted in
// cachewarden_apply_retries_total, not as outcomes.
type Metrics struct {
	events          *prometheus.CounterVec
	ops             *prometheus.CounterVec
	batchMessages   prometheus.Histogram
	batchOps        prometheus.Histogram
	batchDuration   prometheus.Histogram
	eventAge        prometheus.Histogram
	coalesceSaved   prometheus.Counter
	applyDuration   *prometheus.HistogramVec
	applyRetries    prometheus.Counter
	mysqlDuration   *prometheus.HistogramVec
	memcachedRTT    prometheus.Histogram
	recounts        *prometheus.CounterVec
	poison          *prometheus.CounterVec
	dlqMessages     *prometheus.CounterVec
	dlqErrors       prometheus.Counter
	lag             *prometheus.GaugeVec
	commitDuration  prometheus.Histogram
	commits         *prometheus.CounterVec
	rebumpsPending  prometheus.Gauge
	rebumps         *prometheus.CounterVec
	ready           prometheus.Gauge
	memcachedUp     prometheus.Gauge
	mysqlUp         *prometheus.GaugeVec
	groupJoined     prometheus.Gauge
	assigned        prometheus.Gauge
	generations     prometheus.Counter
	partitionErrors prometheus.Counter
	stalled         *prometheus.GaugeVec
	handoffs        *prometheus.CounterVec
	// abandoned and leaseAge: the membership lease (lease.go).
	abandoned     prometheus.Counter
	leaseAge      prometheus.Gauge
	commitRetries prometheus.Counter
	lost          *prometheus.CounterVec
	unorderedSets *prometheus.GaugeVec
	// rebumpsRecovered and rebumpJournalErrors: the rebump journal.
	rebumpsRecovered    prometheus.Counter
	rebumpJournalErrors *prometheus.CounterVec
	// schemaFetches and schemaWaiting: the schema registry.
	schemaFetches *prometheus.CounterVec
	schemaWaiting prometheus.Gauge
}

// latencyBuckets span 0.5ms to ~16s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// NewMetrics creates the metrics and registers them with reg (which must
// not hold them already). A nil reg leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_events_total",
			Help: "Change events read, by topic, CDC format and outcome (planned, unmatched, skipped, poison).",
		}, []string{"topic", "format", "outcome"}),
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_ops_total",
			Help: "Coalesced cache ops applied, by kind and outcome (failed: given up after a permanent error).",
		}, []string{"kind", "outcome"}),
		batchMessages: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cachewarden_batch_messages",
			Help:    "Messages per batch.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		batchOps: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cachewarden_batch_ops",
			Help:    "Cache ops per batch after coalescing.",
			Buckets: prometheus.ExponentialBuckets(1, 4, 9),
		}),
		batchDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cachewarden_batch_duration_seconds",
			Help:    "Time to decode, plan, coalesce and apply one batch, retries and DLQ writes included.",
			Buckets: latencyBuckets,
		}),
		eventAge: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cachewarden_event_age_seconds",
			Help:    "Age of each applied row change when its batch was applied: now minus the source timestamp (Debezium ts_ms of the source, Maxwell ts, Canal es). The staleness readers see; it includes the connector's and Kafka's delay and any clock difference with the database.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 22),
		}),
		coalesceSaved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_coalesce_saved_ops_total",
			Help: "Planned ops that coalescing merged away (memcached operations saved).",
		}),
		applyDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachewarden_apply_duration_seconds",
			Help:    "Time of one apply call, by applier (cacheops: bumps and sets in memcached; counters: memcached incr/decr and MySQL recounts).",
			Buckets: latencyBuckets,
		}, []string{"applier"}),
		applyRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_apply_retries_total",
			Help: "Apply attempts repeated after a transient memcached or MySQL error.",
		}),
		memcachedRTT: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cachewarden_memcached_round_trip_duration_seconds",
			Help:    "Time of one memcached round trip: one command with memcached.protocol text, one pipelined exchange of many commands with meta.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 18),
		}),
		mysqlDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "cachewarden_mysql_query_duration_seconds",
			Help:    "Time of one MySQL query, by query kind (recount, load) and outcome (ok, error).",
			Buckets: latencyBuckets,
		}, []string{"query", "outcome"}),
		recounts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_recounts_total",
			Help: "Counter recounts requested, by reason (planned: an update without before image; reassigned: deltas of the first batch after a partition assignment; replay).",
		}, []string{"reason"}),
		poison: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_poison_messages_total",
			Help: "Messages that could not be decoded or planned, by topic.",
		}, []string{"topic"}),
		dlqMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_dlq_messages_total",
			Help: "Poison messages written to the dead-letter topic, by original topic.",
		}, []string{"topic"}),
		dlqErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_dlq_write_errors_total",
			Help: "Failed attempts to write poison messages to the dead-letter topic (retried).",
		}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachewarden_consumer_lag",
			Help: "Messages behind the partition's high watermark after the last applied batch.",
		}, []string{"topic", "partition"}),
		commitDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "cachewarden_commit_duration_seconds",
			Help:    "Time of one offset commit.",
			Buckets: latencyBuckets,
		}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_commits_total",
			Help: "Offset commits, by outcome (ok, error).",
		}, []string{"outcome"}),
		rebumpsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_rebumps_pending",
			Help: "Delayed second bumps (rebump_after) waiting in memory.",
		}),
		rebumps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_rebumps_total",
			Help: "Delayed second bumps applied, by outcome (ok, error, dropped).",
		}, []string{"outcome"}),
		rebumpsRecovered: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_rebumps_recovered_total",
			Help: "Delayed second bumps found recorded in memcached that this daemon had not scheduled (left by a killed or stopped daemon), scheduled at their due time.",
		}),
		rebumpJournalErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_rebump_journal_errors_total",
			Help: "Failed writes and reads of the delayed bump journal in memcached, by op (record, remove, read).",
		}, []string{"op"}),
		ready: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_ready",
			Help: "1 when memcached (and MySQL, when a rule queries it) answers, the consumer group is joined, no partition is stalled and no batch waits for the schema registry (/readyz).",
		}),
		memcachedUp: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_memcached_up",
			Help: "1 when every memcached server answered the last health check.",
		}),
		mysqlUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachewarden_mysql_up",
			Help: "1 when MySQL (addr: host:port of mysql.dsn) answered the last health check, 0 when not; exported only when some rule runs load or recount queries, which make the daemon not ready while it is 0.",
		}, []string{"addr"}),
		groupJoined: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_group_joined",
			Help: "1 while the daemon is a member of a consumer group generation.",
		}),
		assigned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_assigned_partitions",
			Help: "Partitions assigned in the current generation.",
		}),
		generations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_group_generations_total",
			Help: "Consumer group generations joined (rebalances).",
		}),
		partitionErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_partition_errors_total",
			Help: "Partitions stopped by a fetch or commit error the client does not retry (they stay stalled until assigned again).",
		}),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachewarden_partition_stalled",
			Help: "1 for an assigned partition that stopped on a failure, or applied no batch for kafka.stall_timeout while messages waited; the daemon is not ready while one is.",
		}, []string{"topic", "partition"}),
		commitRetries: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_commit_retries_total",
			Help: "Offset commits of a partition that failed and were tried again (the group coordinator moving or rebalancing, or unreachable).",
		}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_invalidations_lost_total",
			Help: "Changes whose exact invalidation could not be delivered, by reason (poison: undecodable or unplannable message; op_failed: a cache op failed permanently; retention: records removed before they were read; offset_reset: consumption restarted elsewhere in the log) and by covered (fallback: the table's fallback namespace was bumped instead; none: no rule file of the table has a fallback, so keys may serve stale data until they expire).",
		}, []string{"reason", "covered"}),
		unorderedSets: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "cachewarden_set_rule_unordered",
			Help: "1 for a set rule whose changes of one member may arrive out of order on a topic (several partitions, and a message key not made of the set's key and member columns); see kafka.unordered_sets.",
		}, []string{"rule", "topic"}),
		handoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_partition_handoffs_total",
			Help: "Partitions released on a rebalance or shutdown, by outcome: clean (exactly the applied messages committed, the next owner recounts nothing), abandoned (a batch was abandoned half applied; the next owner recounts its first batch) or lost (held under a membership that may have expired, or the group's commit was past it: nothing committed, the next owner recounts).",
		}, []string{"outcome"}),
		abandoned: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "cachewarden_batches_abandoned_total",
			Help: "Batches abandoned before a write because the group membership may have expired (no heartbeat acknowledged within three quarters of kafka.session_timeout, or the member joined again): nothing more of them was sent and nothing committed. Any increase means the process stalled or lost the coordinator for most of a session timeout.",
		}),
		leaseAge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_group_heartbeat_age_seconds",
			Help: "Time since the last group heartbeat the coordinator acknowledged was sent; writes stop when it reaches three quarters of kafka.session_timeout.",
		}),
		schemaFetches: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cachewarden_schema_registry_requests_total",
			Help: "Schemas of Avro messages asked of the schema registry (once per schema id), by outcome: found, not_found (its messages are poison), error (asked again; the partition waits).",
		}, []string{"outcome"}),
		schemaWaiting: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "cachewarden_schema_registry_waiting_batches",
			Help: "Batches waiting for the schema registry to answer for a schema they need; the daemon is not ready while one does.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.schemaFetches, m.schemaWaiting, m.abandoned, m.leaseAge)
		reg.MustRegister(m.events, m.ops, m.batchMessages, m.batchOps, m.batchDuration, m.eventAge, m.coalesceSaved,
			m.applyDuration, m.applyRetries, m.mysqlDuration, m.memcachedRTT, m.recounts, m.poison, m.dlqMessages, m.dlqErrors,
			m.lag, m.commitDuration, m.commits, m.rebumpsPending, m.rebumps, m.rebumpsRecovered, m.rebumpJournalErrors, m.ready, m.memcachedUp, m.mysqlUp,
			m.groupJoined, m.assigned, m.generations, m.partitionErrors, m.stalled, m.handoffs, m.commitRetries, m.lost, m.unorderedSets)
	}
	return m
}

// ObserveMemcached records one memcached round trip's duration; it is a
// cacheops.RoundTripObserver.
func (m *Metrics) ObserveMemcached(d time.Duration) { m.memcachedRTT.Observe(d.Seconds()) }

// ObserveMySQL records one MySQL query's duration; query is "recount" or
// "load".
func (m *Metrics) ObserveMySQL(query string, d time.Duration, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	m.mysqlDuration.WithLabelValues(query, outcome).Observe(d.Seconds())
}

func (m *Metrics) setLag(topic string, partition int, lag int64) {
	m.lag.WithLabelValues(topic, strconv.Itoa(partition)).Set(float64(max(lag, 0)))
}

func (m *Metrics) setStalled(topic string, partition int, stalled bool) {
	boolGauge(m.stalled.WithLabelValues(topic, strconv.Itoa(partition)), stalled)
}

func (m *Metrics) forgetPartition(topic string, partition int) {
	m.lag.DeleteLabelValues(topic, strconv.Itoa(partition))
	m.stalled.DeleteLabelValues(topic, strconv.Itoa(partition))
}

func boolGauge(g prometheus.Gauge, v bool) {
	if v {
		g.Set(1)
	} else {
		g.Set(0)
	}
}
