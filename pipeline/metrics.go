package pipeline

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cachewarden/cachewarden/cacheops"
	"github.com/cachewarden/cachewarden/internal/promx"
	"github.com/cachewarden/cachewarden/rules"
)

// Metrics are the pipeline's Prometheus metrics (a source registers its
// own beside them). Create them with NewMetrics
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
	fetchToApply  *runHistogram
	coalesceSaved prometheus.Counter
	applyDuration *prometheus.HistogramVec
	applyRetries  prometheus.Counter
	mysqlDuration *prometheus.HistogramVec
	memcachedRTT  prometheus.Histogram
	recounts      *prometheus.CounterVec
	poison        *prometheus.CounterVec
	// dlqMessages and dlqErrors: the PoisonSink (the dead-letter topic).
	dlqMessages    *prometheus.CounterVec
	dlqErrors      prometheus.Counter
	rebumpsPending prometheus.Gauge
	rebumps        *prometheus.CounterVec
	rebumpsEarly   *prometheus.CounterVec
	ready          prometheus.Gauge
	memcachedUp    prometheus.Gauge
	mysqlUp        *prometheus.GaugeVec
	lost           *prometheus.CounterVec
	unorderedSets  *prometheus.GaugeVec
	// rebumpsRecovered and rebumpJournalErrors: the rebump journal.
	rebumpsRecovered    prometheus.Counter
	rebumpJournalErrors *prometheus.CounterVec
	// schemaWaiting: batches waiting for the schemas of their messages.
	schemaWaiting prometheus.Gauge
	// rulesReloads and rulesInfo: the rules (Stack.ReloadRules).
	rulesReloads *prometheus.CounterVec
	rulesInfo    *prometheus.GaugeVec
	// sourcePositions: the position items of readers on replicas.
	sourcePositions *prometheus.CounterVec
}

// fetchToApplyBuckets span 0.5 ms to 30 s (seconds), finer than
// promx.LatencyBuckets where a daemon keeping up lies, with bounds at the round
// figures latency goals are written in (10, 25, 50, 100 ms).
var fetchToApplyBuckets = []float64{
	0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
	0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30,
}

// NewMetrics creates the metrics and registers them with reg (which must
// not hold them already). A nil reg leaves them unregistered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{}
	b := promx.Maker{Reg: reg}
	m.makeBatchMetrics(b)
	m.makeHealthMetrics(b)
	m.makeRebumpMetrics(b)
	return m
}

// makeBatchMetrics makes the metrics of the batch pipeline: events, ops,
// batches, applying, poison and the DLQ, lost invalidations, ordering and
// the schema registry.
func (m *Metrics) makeBatchMetrics(b promx.Maker) {
	m.events = b.CounterVec("cachewarden_events_total", "Change events read, by topic, CDC format and outcome (planned, unmatched, skipped, poison).", "topic", "format", "outcome")
	m.ops = b.CounterVec("cachewarden_ops_total", "Coalesced cache ops applied, by kind and outcome (failed: given up after a permanent error).", "kind", "outcome")
	m.batchMessages = b.Histogram("cachewarden_batch_messages", prometheus.ExponentialBuckets(1, 4, 9), "Messages per batch.")
	m.batchOps = b.Histogram("cachewarden_batch_ops", prometheus.ExponentialBuckets(1, 4, 9), "Cache ops per batch after coalescing.")
	m.batchDuration = b.Histogram("cachewarden_batch_duration_seconds", promx.LatencyBuckets, "Time to decode, plan, coalesce and apply one batch, retries and DLQ writes included.")
	m.eventAge = promx.Made(b, newRunHistogram("cachewarden_event_age_seconds", "Age of each applied row change when its batch was applied: now minus the source timestamp (Debezium ts_ms of the source, Maxwell ts, Canal es). The staleness readers see; it includes the connector's and Kafka's delay and any clock difference with the database.", prometheus.ExponentialBuckets(0.001, 2, 22)))
	m.fetchToApply = promx.Made(b, newRunHistogram("cachewarden_fetch_to_apply_seconds", "Time from the fetch of each record (when the Kafka client handed it to the daemon) until its batch was applied to memcached: the daemon's own latency, queueing behind earlier batches of the partition included, the connector's and the broker's delay not.", fetchToApplyBuckets))
	m.coalesceSaved = b.Counter("cachewarden_coalesce_saved_ops_total", "Planned ops that coalescing merged away (memcached operations saved).")
	m.applyDuration = b.HistogramVec("cachewarden_apply_duration_seconds", promx.LatencyBuckets, "Time of one apply call, by applier (cacheops: bumps and sets in memcached; counters: memcached incr/decr and MySQL recounts).", "applier")
	m.applyRetries = b.Counter("cachewarden_apply_retries_total", "Apply attempts repeated after a transient memcached or MySQL error.")
	m.memcachedRTT = b.Histogram("cachewarden_memcached_round_trip_duration_seconds", prometheus.ExponentialBuckets(0.00005, 2, 18), "Time of one memcached round trip: one command with memcached.protocol text, one pipelined exchange of many commands with meta.")
	m.mysqlDuration = b.HistogramVec("cachewarden_mysql_query_duration_seconds", promx.LatencyBuckets, "Time of one MySQL query, by query kind (recount, load) and outcome (ok, error).", "query", "outcome")
	m.recounts = b.CounterVec("cachewarden_recounts_total", "Counter recounts requested, by reason (planned: an update without before image; reassigned: deltas of the first batch after a partition assignment; replay).", "reason")
	m.poison = b.CounterVec("cachewarden_poison_messages_total", "Messages that could not be decoded or planned, by topic.", "topic")
	m.dlqMessages = b.CounterVec("cachewarden_dlq_messages_total", "Poison messages written to the dead-letter topic, by original topic.", "topic")
	m.dlqErrors = b.Counter("cachewarden_dlq_write_errors_total", "Failed attempts to write poison messages to the dead-letter topic (retried).")
	m.lost = b.CounterVec("cachewarden_invalidations_lost_total", "Changes whose exact invalidation could not be delivered, by reason (poison: undecodable or unplannable message, an unknown operation type or more rows than a message may hold among them; op_failed: a cache op failed permanently; retention: records removed before they were read; offset_reset: consumption restarted elsewhere in the log) and by covered (fallback: every rule of the tables concerned was covered, bump rules by their table's fallback namespace, set and count rules by their table's generation, bumped instead; none: a bump rule of those tables has no fallback namespace, so keys built under it may serve stale data until they expire).", "reason", "covered")
	m.unorderedSets = b.GaugeVec("cachewarden_set_rule_unordered", "1 for a set rule whose changes of one member may arrive out of order on a topic (several partitions, and a message key not made of the set's key and member columns); see kafka.unordered_sets.", "rule", "topic")
	m.rulesReloads = b.CounterVec("cachewarden_rules_reload_total", "Reloads of the rule files (SIGHUP), by result: ok (the new rules apply to the batches planned after), error (the rules loaded before stay; the log says why).", "result")
	m.rulesInfo = b.GaugeVec("cachewarden_rules_info", "1, labelled with the SHA-256 of the rule files the daemon plans with (what `cat FILE... | sha256sum` prints for the config's rule files, in load order).", "digest")
	m.sourcePositions = b.CounterVec("cachewarden_source_positions_total", "Batches with ops by what they did to the source position items readers on replicas wait for (docs/formats.md, \"Source positions\"), per source server: written (moved forward), current (already at or after the batch's), none (the batch's changes carry no server_id or position: readers get none for them).", "outcome")
	m.schemaWaiting = b.Gauge("cachewarden_schema_registry_waiting_batches", "Batches waiting for the schema registry to answer for a schema they need; the daemon is not ready while one does.")
}

// makeHealthMetrics makes the metrics of readiness and of the health
// checks (Health).
func (m *Metrics) makeHealthMetrics(b promx.Maker) {
	m.ready = b.Gauge("cachewarden_ready", "1 when the daemon is ready (/readyz): memcached (and MySQL, when a rule queries it) answers and the source is read (for Kafka: the consumer group is joined, no partition is stalled and no batch waits for the schema registry).")
	m.memcachedUp = b.Gauge("cachewarden_memcached_up", "1 when every memcached server answered the last health check.")
	m.mysqlUp = b.GaugeVec("cachewarden_mysql_up", "1 when MySQL (addr: host:port of mysql.dsn) answered the last health check, 0 when not; exported only when some rule runs load or recount queries, which make the daemon not ready while it is 0.", "addr")
}

// makeRebumpMetrics makes the metrics of the delayed second bumps and
// their journal.
func (m *Metrics) makeRebumpMetrics(b promx.Maker) {
	m.rebumpsPending = b.Gauge("cachewarden_rebumps_pending", "Delayed second bumps (rebump_after) waiting in memory.")
	m.rebumps = b.CounterVec("cachewarden_rebumps_total", "Delayed second bumps applied, by outcome (ok, error, dropped).", "outcome")
	m.rebumpsEarly = b.CounterVec("cachewarden_rebumps_early_total", "Delayed second bumps taken before their due time to keep the pending bumps bounded, by reason (journal_full: the journal item reached memcached's item size limit; max_pending: the Rebumper's bound on pending bumps). They are also counted in cachewarden_rebumps_total.", "reason")
	m.rebumpsRecovered = b.Counter("cachewarden_rebumps_recovered_total", "Delayed second bumps found recorded in memcached that this daemon had not scheduled (left by a killed or stopped daemon), scheduled at their due time.")
	m.rebumpJournalErrors = b.CounterVec("cachewarden_rebump_journal_errors_total", "Failed writes and reads of the delayed bump journal in memcached, by op (record, remove, read).", "op")
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

// SetReady sets cachewarden_ready: the source calls it after each of its
// readiness checks.
func (m *Metrics) SetReady(ready bool) { promx.SetBool(m.ready, ready) }

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

// CountReload counts a reload of the rules by result, "ok" or "error"
// (cachewarden_rules_reload_total).
func (m *Metrics) CountReload(result string) { m.rulesReloads.WithLabelValues(result).Inc() }

// SetRules records the digest of the rules in use ("" records nothing).
func (m *Metrics) SetRules(digest string) {
	if digest == "" {
		return
	}
	m.rulesInfo.Reset()
	m.rulesInfo.WithLabelValues(digest).Set(1)
}
