package consumer

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/rules"
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
	events        *prometheus.CounterVec
	ops           *prometheus.CounterVec
	batchMessages prometheus.Histogram
	batchOps      prometheus.Histogram
	batchDuration prometheus.Histogram
	eventAge      *runHistogram
	// fetchToApply is the daemon's own latency (Pipeline.Process).
	fetchToApply    *runHistogram
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
	rebumpsEarly    *prometheus.CounterVec
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
	// rulesReloads and rulesInfo: the rules (Stack.ReloadRules).
	rulesReloads *prometheus.CounterVec
	rulesInfo    *prometheus.GaugeVec
	// sourcePositions: the position items of readers on replicas.
	sourcePositions *prometheus.CounterVec
}

// latencyBuckets span 0.5ms to ~16s.
var latencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 16)

// fetchToApplyBuckets span 0.5 ms to 30 s (seconds), finer than
// latencyBuckets where a daemon keeping up lies, with bounds at the round
// figures latency goals are written in (10, 25, 50, 100 ms).
var fetchToApplyBuckets = []float64{
	0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
	0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30,
}

// NewMetrics creates the metrics and registers them with reg (which must
// not hold them already). A nil reg leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	b := metricMaker{reg}
	m.makeBatchMetrics(b)
	m.makeGroupMetrics(b)
	m.makeRebumpMetrics(b)
	return m
}

// makeBatchMetrics makes the metrics of the batch pipeline: events, ops,
// batches, applying, poison and the DLQ, lost invalidations, ordering and
// the schema registry.
func (m *Metrics) makeBatchMetrics(b metricMaker) {
	m.events = b.counterVec("cachewarden_events_total", "Change events read, by topic, CDC format and outcome (planned, unmatched, skipped, poison).", "topic", "format", "outcome")
	m.ops = b.counterVec("cachewarden_ops_total", "Coalesced cache ops applied, by kind and outcome (failed: given up after a permanent error).", "kind", "outcome")
	m.batchMessages = b.histogram("cachewarden_batch_messages", prometheus.ExponentialBuckets(1, 4, 9), "Messages per batch.")
	m.batchOps = b.histogram("cachewarden_batch_ops", prometheus.ExponentialBuckets(1, 4, 9), "Cache ops per batch after coalescing.")
	m.batchDuration = b.histogram("cachewarden_batch_duration_seconds", latencyBuckets, "Time to decode, plan, coalesce and apply one batch, retries and DLQ writes included.")
	m.eventAge = made(b, newRunHistogram("cachewarden_event_age_seconds", "Age of each applied row change when its batch was applied: now minus the source timestamp (Debezium ts_ms of the source, Maxwell ts, Canal es). The staleness readers see; it includes the connector's and Kafka's delay and any clock difference with the database.", prometheus.ExponentialBuckets(0.001, 2, 22)))
	m.fetchToApply = made(b, newRunHistogram("cachewarden_fetch_to_apply_seconds", "Time from the fetch of each record (when the Kafka client handed it to the daemon) until its batch was applied to memcached: the daemon's own latency, queueing behind earlier batches of the partition included, the connector's and the broker's delay not.", fetchToApplyBuckets))
	m.coalesceSaved = b.counter("cachewarden_coalesce_saved_ops_total", "Planned ops that coalescing merged away (memcached operations saved).")
	m.applyDuration = b.histogramVec("cachewarden_apply_duration_seconds", latencyBuckets, "Time of one apply call, by applier (cacheops: bumps and sets in memcached; counters: memcached incr/decr and MySQL recounts).", "applier")
	m.applyRetries = b.counter("cachewarden_apply_retries_total", "Apply attempts repeated after a transient memcached or MySQL error.")
	m.memcachedRTT = b.histogram("cachewarden_memcached_round_trip_duration_seconds", prometheus.ExponentialBuckets(0.00005, 2, 18), "Time of one memcached round trip: one command with memcached.protocol text, one pipelined exchange of many commands with meta.")
	m.mysqlDuration = b.histogramVec("cachewarden_mysql_query_duration_seconds", latencyBuckets, "Time of one MySQL query, by query kind (recount, load) and outcome (ok, error).", "query", "outcome")
	m.recounts = b.counterVec("cachewarden_recounts_total", "Counter recounts requested, by reason (planned: an update without before image; reassigned: deltas of the first batch after a partition assignment; replay).", "reason")
	m.poison = b.counterVec("cachewarden_poison_messages_total", "Messages that could not be decoded or planned, by topic.", "topic")
	m.dlqMessages = b.counterVec("cachewarden_dlq_messages_total", "Poison messages written to the dead-letter topic, by original topic.", "topic")
	m.dlqErrors = b.counter("cachewarden_dlq_write_errors_total", "Failed attempts to write poison messages to the dead-letter topic (retried).")
	m.lost = b.counterVec("cachewarden_invalidations_lost_total", "Changes whose exact invalidation could not be delivered, by reason (poison: undecodable or unplannable message, an unknown operation type or more rows than a message may hold among them; op_failed: a cache op failed permanently; retention: records removed before they were read; offset_reset: consumption restarted elsewhere in the log) and by covered (fallback: every rule of the tables concerned was covered, bump rules by their table's fallback namespace, set and count rules by their table's generation, bumped instead; none: a bump rule of those tables has no fallback namespace, so keys built under it may serve stale data until they expire).", "reason", "covered")
	m.unorderedSets = b.gaugeVec("cachewarden_set_rule_unordered", "1 for a set rule whose changes of one member may arrive out of order on a topic (several partitions, and a message key not made of the set's key and member columns); see kafka.unordered_sets.", "rule", "topic")
	m.schemaFetches = b.counterVec("cachewarden_schema_registry_requests_total", "Schemas of Avro messages asked of the schema registry (once per schema id), by outcome: found, not_found (its messages are poison), error (asked again; the partition waits).", "outcome")
	m.rulesReloads = b.counterVec("cachewarden_rules_reload_total", "Reloads of the rule files (SIGHUP), by result: ok (the new rules apply to the batches planned after), error (the rules loaded before stay; the log says why).", "result")
	m.rulesInfo = b.gaugeVec("cachewarden_rules_info", "1, labelled with the SHA-256 of the rule files the daemon plans with (what `cat FILE... | sha256sum` prints for the config's rule files, in load order).", "digest")
	m.sourcePositions = b.counterVec("cachewarden_source_positions_total", "Batches with ops by what they did to the source position items readers on replicas wait for (docs/formats.md, \"Source positions\"), per source server: written (moved forward), current (already at or after the batch's), none (the batch's changes carry no server_id or position: readers get none for them).", "outcome")
	m.schemaWaiting = b.gauge("cachewarden_schema_registry_waiting_batches", "Batches waiting for the schema registry to answer for a schema they need; the daemon is not ready while one does.")
}

// makeGroupMetrics makes the metrics of the consumer group member: lag,
// commits, readiness, assignments, stalls, handoffs and the membership
// lease.
func (m *Metrics) makeGroupMetrics(b metricMaker) {
	m.lag = b.gaugeVec("cachewarden_consumer_lag", "Messages behind the partition's high watermark after the last applied batch.", "topic", "partition")
	m.commitDuration = b.histogram("cachewarden_commit_duration_seconds", latencyBuckets, "Time of one offset commit.")
	m.commits = b.counterVec("cachewarden_commits_total", "Offset commits, by outcome (ok, error).", "outcome")
	m.ready = b.gauge("cachewarden_ready", "1 when memcached (and MySQL, when a rule queries it) answers, the consumer group is joined, no partition is stalled and no batch waits for the schema registry (/readyz).")
	m.memcachedUp = b.gauge("cachewarden_memcached_up", "1 when every memcached server answered the last health check.")
	m.mysqlUp = b.gaugeVec("cachewarden_mysql_up", "1 when MySQL (addr: host:port of mysql.dsn) answered the last health check, 0 when not; exported only when some rule runs load or recount queries, which make the daemon not ready while it is 0.", "addr")
	m.groupJoined = b.gauge("cachewarden_group_joined", "1 while the daemon is a member of a consumer group generation.")
	m.assigned = b.gauge("cachewarden_assigned_partitions", "Partitions assigned in the current generation.")
	m.generations = b.counter("cachewarden_group_generations_total", "Consumer group generations joined (rebalances).")
	m.partitionErrors = b.counter("cachewarden_partition_errors_total", "Partitions stopped by a fetch or commit error the client does not retry (they stay stalled until assigned again).")
	m.stalled = b.gaugeVec("cachewarden_partition_stalled", "1 for an assigned partition that stopped on a failure, or applied no batch for kafka.stall_timeout while messages waited; the daemon is not ready while one is.", "topic", "partition")
	m.commitRetries = b.counter("cachewarden_commit_retries_total", "Offset commits of a partition that failed and were tried again (the group coordinator moving or rebalancing, or unreachable).")
	m.handoffs = b.counterVec("cachewarden_partition_handoffs_total", "Partitions released on a rebalance or shutdown, by outcome: clean (exactly the applied messages committed, the next owner recounts nothing), abandoned (a batch was abandoned half applied; the next owner recounts its first batch) or lost (held under a membership that may have expired, or the group's commit was past it: nothing committed, the next owner recounts).", "outcome")
	m.abandoned = b.counter("cachewarden_batches_abandoned_total", "Batches abandoned before a write because the group membership may have expired (no heartbeat acknowledged within three quarters of kafka.session_timeout, or the member joined again): nothing more of them was sent and nothing committed. Any increase means the process stalled or lost the coordinator for most of a session timeout.")
	m.leaseAge = b.gauge("cachewarden_group_heartbeat_age_seconds", "Time since the last group heartbeat the coordinator acknowledged was sent; writes stop when it reaches three quarters of kafka.session_timeout.")
}

// makeRebumpMetrics makes the metrics of the delayed second bumps and
// their journal.
func (m *Metrics) makeRebumpMetrics(b metricMaker) {
	m.rebumpsPending = b.gauge("cachewarden_rebumps_pending", "Delayed second bumps (rebump_after) waiting in memory.")
	m.rebumps = b.counterVec("cachewarden_rebumps_total", "Delayed second bumps applied, by outcome (ok, error, dropped).", "outcome")
	m.rebumpsEarly = b.counterVec("cachewarden_rebumps_early_total", "Delayed second bumps taken before their due time to keep the pending bumps bounded, by reason (journal_full: the journal item reached memcached's item size limit; max_pending: the Rebumper's bound on pending bumps). They are also counted in cachewarden_rebumps_total.", "reason")
	m.rebumpsRecovered = b.counter("cachewarden_rebumps_recovered_total", "Delayed second bumps found recorded in memcached that this daemon had not scheduled (left by a killed or stopped daemon), scheduled at their due time.")
	m.rebumpJournalErrors = b.counterVec("cachewarden_rebump_journal_errors_total", "Failed writes and reads of the delayed bump journal in memcached, by op (record, remove, read).", "op")
}

// metricMaker makes metrics and registers each with reg, unless reg is
// nil.
type metricMaker struct{ reg prometheus.Registerer }

// made registers c with b's registry, unless it is nil, and returns it.
func made[C prometheus.Collector](b metricMaker, c C) C {
	if b.reg != nil {
		b.reg.MustRegister(c)
	}
	return c
}

func (b metricMaker) counter(name, help string) prometheus.Counter {
	return made(b, prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help}))
}

func (b metricMaker) counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return made(b, prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels))
}

func (b metricMaker) gauge(name, help string) prometheus.Gauge {
	return made(b, prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help}))
}

func (b metricMaker) gaugeVec(name, help string, labels ...string) *prometheus.GaugeVec {
	return made(b, prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels))
}

func (b metricMaker) histogram(name string, buckets []float64, help string) prometheus.Histogram {
	return made(b, prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}))
}

func (b metricMaker) histogramVec(name string, buckets []float64, help string, labels ...string) *prometheus.HistogramVec {
	return made(b, prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels))
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

// outcomeCounts counts applied ops by kind and outcome, the labels of
// cachewarden_ops_total, in an array: a batch counts thousands of ops and
// adding to an array costs no hashing. Kinds and outcomes are small
// numbers (rules.OpKind, cacheops.Outcome, both below 16; a test checks
// it).
type outcomeCounts [16][16]int

func (c *outcomeCounts) add(k rules.OpKind, o cacheops.Outcome) { c[k&15][o&15]++ }

// flush adds the counts to ops (labels kind, outcome) and resets them.
func (c *outcomeCounts) flush(ops *prometheus.CounterVec) {
	for k := range c {
		for o, n := range c[k] {
			if n != 0 {
				ops.WithLabelValues(rules.OpKind(k).String(), cacheops.Outcome(o).String()).Add(float64(n))
			}
		}
	}
	*c = outcomeCounts{}
}

// setRules records the digest of the rules in use ("" records nothing).
func (m *Metrics) setRules(digest string) {
	if digest == "" {
		return
	}
	m.rulesInfo.Reset()
	m.rulesInfo.WithLabelValues(digest).Set(1)
}
