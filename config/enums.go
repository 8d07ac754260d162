package config

import "github.com/cachewarden/cachewarden/counters"

// The settings that take one of a few words have a type each, whose
// values are declared here once: validation accepts exactly those (see
// oneOf) and the packages acting on a setting compare with these
// constants, never with literals. The CDC formats (kafka.format) are the
// decoders' vocabulary (Formats). counters.fencing is
// counters.FencingMode, the counters package's own type.

// MemcachedProtocol is memcached.protocol: how the daemon writes.
type MemcachedProtocol string

// The values of memcached.protocol.
const (
	// ProtocolMeta pipelines meta commands (memcached 1.6 and later).
	ProtocolMeta MemcachedProtocol = "meta"
	// ProtocolText sends one classic text command per round trip.
	ProtocolText MemcachedProtocol = "text"
)

// StartOffset is kafka.start_offset: where a partition the group never
// committed starts.
type StartOffset string

// The values of kafka.start_offset.
const (
	StartEarliest StartOffset = "earliest"
	StartLatest   StartOffset = "latest"
)

// OffsetReset is kafka.offset_reset: what happens when a committed offset
// is no longer in the partition's log.
type OffsetReset string

// The values of kafka.offset_reset.
const (
	ResetFail     OffsetReset = "fail"
	ResetEarliest OffsetReset = "earliest"
	ResetLatest   OffsetReset = "latest"
)

// Balancer is kafka.balancer: the partition assignor.
type Balancer string

// The values of kafka.balancer.
const (
	BalancerCooperativeSticky Balancer = "cooperative-sticky"
	BalancerSticky            Balancer = "sticky"
	BalancerRange             Balancer = "range"
	BalancerRoundRobin        Balancer = "roundrobin"
)

// UnorderedSets is kafka.unordered_sets: what happens to set changes
// that may arrive out of order.
type UnorderedSets string

// The values of kafka.unordered_sets.
const (
	UnorderedSetsDelete UnorderedSets = "delete"
	UnorderedSetsAppend UnorderedSets = "append"
)

// SASLMechanism is kafka.sasl.mechanism; "" is no SASL.
type SASLMechanism string

// The values of kafka.sasl.mechanism.
const (
	SASLPlain       SASLMechanism = "plain"
	SASLScramSHA256 SASLMechanism = "scram-sha-256"
	SASLScramSHA512 SASLMechanism = "scram-sha-512"
	SASLOAuthBearer SASLMechanism = "oauthbearer"
)

// LogFormat is log.format.
type LogFormat string

// The values of log.format.
const (
	LogText LogFormat = "text"
	LogJSON LogFormat = "json"
)

// SourceKind is `source`: where change events come from.
type SourceKind string

// The values of source.
const (
	// SourceKafka consumes CDC topics (the kafka section).
	SourceKafka SourceKind = "kafka"
	// SourceBinlog reads a MySQL or MariaDB server's binary log as a
	// replica (the binlog section); no Kafka is needed.
	SourceBinlog SourceKind = "binlog"
)

// BinlogPurged is binlog.purged: what happens when the checkpoint's
// position is no longer in the source's binary log.
type BinlogPurged string

// The values of binlog.purged.
const (
	PurgedFail    BinlogPurged = "fail"
	PurgedCurrent BinlogPurged = "current"
)

// The accepted values of each enumerated setting, in the order messages
// list them.
var (
	MemcachedProtocols   = []MemcachedProtocol{ProtocolMeta, ProtocolText}
	StartOffsets         = []StartOffset{StartEarliest, StartLatest}
	OffsetResets         = []OffsetReset{ResetFail, ResetEarliest, ResetLatest}
	Balancers            = []Balancer{BalancerCooperativeSticky, BalancerSticky, BalancerRange, BalancerRoundRobin}
	UnorderedSetPolicies = []UnorderedSets{UnorderedSetsDelete, UnorderedSetsAppend}
	SASLMechanisms       = []SASLMechanism{SASLPlain, SASLScramSHA256, SASLScramSHA512, SASLOAuthBearer}
	LogFormats           = []LogFormat{LogText, LogJSON}
	FencingModes         = []counters.FencingMode{counters.FencingAuto, counters.FencingOff, counters.FencingRequired}
	SourceKinds          = []SourceKind{SourceKafka, SourceBinlog}
	BinlogPurgeds        = []BinlogPurged{PurgedFail, PurgedCurrent}
)
