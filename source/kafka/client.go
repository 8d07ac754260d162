package kafka

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
)

// KafkaConn says how to reach the Kafka brokers. The zero TLS and SASL
// mean plaintext without authentication.
//
// Every Kafka client of the daemon, replay and the dead-letter queue is
// built from it with franz-go's kgo (docs/operations.md, "Kafka client",
// says why kgo rather than kafka-go).
type KafkaConn struct {
	// Brokers are bootstrap addresses (host:port); required.
	Brokers []string
	// ClientID names the daemon to the brokers; default DefaultClientID.
	ClientID string
	// TLS, when non-nil, encrypts connections.
	TLS *tls.Config
	// SASL, when non-nil, authenticates connections (PLAIN, SCRAM-SHA-256,
	// SCRAM-SHA-512 or OAUTHBEARER; see KafkaConnFromConfig).
	SASL sasl.Mechanism
	// SASLMechanism and SASLUser name the mechanism and the user in
	// logs and /readyz when authentication fails ("" when unknown).
	SASLMechanism, SASLUser string
	// DialTimeout bounds connecting to a broker; default 10s.
	DialTimeout time.Duration
	// CheckCRCs makes consumers verify the CRC32C of every fetched
	// record batch (config kafka.check_crcs); off by default.
	CheckCRCs bool
	// MaxDecompressedBatchBytes bounds what one fetched record batch may
	// decompress to (config kafka.max_decompressed_batch_bytes); default
	// DefaultMaxDecompressedBatchBytes. A batch over it
	// is poison (OversizedBatch).
	MaxDecompressedBatchBytes int
}

// Defaults of KafkaConn and RegistryConfig.
const (
	// DefaultClientID names the daemon to the brokers.
	DefaultClientID = "cachewarden"
	// DefaultMaxDecompressedBatchBytes bounds what one fetched record
	// batch may decompress to (kafka.max_decompressed_batch_bytes): 16
	// MiB, 16 times Kafka's default max.message.bytes. The Kafka client
	// decompresses gzip and lz4 into a buffer that doubles as it grows:
	// a bomb costs up to three times the bound (48 MiB), and 32 MiB took
	// the daemon's peak RSS to 167-179 MB (docs/operations.md,
	// "Compression bombs").
	DefaultMaxDecompressedBatchBytes = 16 << 20
	// DefaultSchemaRegistryTimeout bounds one request to the schema
	// registry.
	DefaultSchemaRegistryTimeout = 5 * time.Second
)

func (c KafkaConn) clientID() string {
	if c.ClientID == "" {
		return DefaultClientID
	}
	return c.ClientID
}

func (c KafkaConn) maxDecompressedBatchBytes() int {
	if c.MaxDecompressedBatchBytes <= 0 {
		return DefaultMaxDecompressedBatchBytes
	}
	return c.MaxDecompressedBatchBytes
}

func (c KafkaConn) dialTimeout() time.Duration {
	if c.DialTimeout <= 0 {
		return 10 * time.Second
	}
	return c.DialTimeout
}

// Kafka fetch settings shared by the daemon and replay.
const (
	// fetchMaxWait is how long one fetch waits on the broker for new
	// records when its partitions have none. A partition resumed (or
	// assigned) meanwhile is not fetched before that fetch returns: with
	// 1s, a partition paused behind a slow batch and resumed while the
	// fetch in flight held only drained partitions waited up to a second
	// with records ready, which cut benchmark rates by half to two
	// thirds (docs/benchmarks.md, "Where the time goes"). An idle daemon
	// sends 10 fetch requests a second per broker.
	fetchMaxWait = 100 * time.Millisecond
	// fetchMaxBytes bounds one fetch response, fetchMaxPartitionBytes
	// one partition's share of it. The client reads every response into
	// a new buffer of its own, so larger responses cost memory (a 16 MiB
	// response raised the daemon's peak RSS past 200 MB) and page faults.
	// A partition's share is a quarter of the response, so that one
	// response carries records of several partitions and their batchers
	// work side by side: with one partition filling a whole response,
	// each fetch fed one batcher while the others waited
	// (docs/benchmarks.md, "Where the time goes"). Responses of 2 MiB
	// instead of 4 MiB lowered the benchmark's peak RSS by 20 to 28 MB
	// (110-130 MB against 132-151 MB) at events/s within the runs' spread
	// (docs/benchmarks.md, "The ratio goals").
	fetchMaxBytes          = 2 << 20
	fetchMaxPartitionBytes = 512 << 10
)

// clientOpts returns the connection options of a client with log as its
// logger. Consumers read with isolation read_committed: records of
// aborted transactions and transaction markers never reach decoding.
func (c KafkaConn) clientOpts(log *slog.Logger) []kgo.Opt {
	dialer := &net.Dialer{Timeout: c.dialTimeout()}
	opts := []kgo.Opt{
		kgo.SeedBrokers(c.Brokers...),
		kgo.ClientID(c.clientID()),
		kgo.WithLogger(kgoLogger{log: log}),
		kgo.Dialer(dialer.DialContext),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.FetchMaxWait(fetchMaxWait),
		kgo.FetchMaxBytes(fetchMaxBytes),
		kgo.FetchMaxPartitionBytes(fetchMaxPartitionBytes),
		kgo.MaxDecompressBatchBytes(c.maxDecompressedBatchBytes()),
		kgo.WithHooks(&failedBatchSizes{}),
	}
	if !c.CheckCRCs {
		opts = append(opts, kgo.DisableFetchCRCValidation())
	}
	if c.TLS != nil {
		opts = append(opts, kgo.DialTLSConfig(c.TLS.Clone()))
	}
	if c.SASL != nil {
		mech := c.SASLMechanism
		if mech == "" {
			mech = c.SASL.Name()
		}
		opts = append(opts, kgo.SASL(c.SASL), kgo.WithHooks(&kafkaAuth{mechanism: mech, user: c.SASLUser, log: log}))
	}
	return opts
}

// NewClient returns a kgo client with the connection options (the ones
// the daemon, replay and the DLQ use) and extra.
func (c KafkaConn) NewClient(log *slog.Logger, extra ...kgo.Opt) (*kgo.Client, error) {
	if len(c.Brokers) == 0 {
		return nil, fmt.Errorf("kafka: no Kafka brokers")
	}
	cl, err := kgo.NewClient(append(c.clientOpts(log), extra...)...)
	if err != nil {
		return nil, fmt.Errorf("kafka: kafka client: %w", err)
	}
	return cl, nil
}

// kgoLogger passes the Kafka client's warnings and errors to slog; its
// info and debug lines (every join, fetch session and metadata refresh)
// are left out.
type kgoLogger struct{ log *slog.Logger }

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lvl := slog.LevelWarn
	switch level {
	case kgo.LogLevelError:
		lvl = slog.LevelError
	case kgo.LogLevelWarn:
	default:
		lvl = slog.LevelDebug
	}
	l.log.Log(context.Background(), lvl, msg, append(keyvals, "component", "kafka")...)
}
