// Package consumer turns CDC messages from Kafka into cache operations.
//
// It holds the batch pipeline that decodes (package cdc), plans,
// coalesces and applies them (Pipeline, Coalescer), and the daemon that consumes topics as a member of a Kafka
// consumer group, commits offsets only after a batch is applied, sends
// poison messages to a dead-letter topic (DLQ) and applies delayed second
// bumps (Rebumper). NewStack builds all of it from a config file, for the
// run, replay and demo commands alike.
package consumer

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
)

// KafkaConn says how to reach the Kafka brokers. The zero TLS and SASL
// mean plaintext without authentication.
type KafkaConn struct {
	// Brokers are bootstrap addresses (host:port); required.
	Brokers []string
	// ClientID names the daemon to the brokers; default "cachewarden".
	ClientID string
	// TLS, when non-nil, encrypts connections.
	TLS *tls.Config
	// SASL, when non-nil, authenticates connections.
	SASL sasl.Mechanism
	// DialTimeout bounds connecting to a broker; default 10s.
	DialTimeout time.Duration
}

func (c KafkaConn) clientID() string {
	if c.ClientID == "" {
		return "cachewarden"
	}
	return c.ClientID
}

func (c KafkaConn) dialTimeout() time.Duration {
	if c.DialTimeout <= 0 {
		return 10 * time.Second
	}
	return c.DialTimeout
}

// Dialer returns a dialer with the connection settings, for readers and
// connections of other commands (replay). Its connections read the socket
// through a 256 KiB buffer (see kafkaReadBuffer).
func (c KafkaConn) Dialer() *kafka.Dialer {
	return &kafka.Dialer{
		ClientID:      c.clientID(),
		Timeout:       c.dialTimeout(),
		DialFunc:      dialBuffered(),
		TLS:           c.TLS,
		SASLMechanism: c.SASL,
	}
}

// Transport returns a transport with the connection settings, for
// writers and clients of other commands.
func (c KafkaConn) Transport() *kafka.Transport {
	return &kafka.Transport{
		ClientID:    c.clientID(),
		DialTimeout: c.dialTimeout(),
		TLS:         c.TLS,
		SASL:        c.SASL,
	}
}

// Daemon defaults.
const (
	DefaultMaxEvents       = 2000
	DefaultMaxWait         = 10 * time.Millisecond
	DefaultReadyInterval   = 2 * time.Second
	DefaultShutdownTimeout = 10 * time.Second
	// firstBatchWait is how long the first batch after an assignment
	// stays open at least (see Config.MaxWait).
	firstBatchWait = 2 * time.Second
)

// Config is the daemon's Kafka and batching configuration.
type Config struct {
	Kafka KafkaConn
	// Group is the consumer group ID; required.
	Group string
	// Topics are the topics to consume; required.
	Topics []string
	// MaxEvents is the most messages in one batch; default 2000.
	MaxEvents int
	// MaxWait is how long a batch stays open after its first message;
	// default 10ms. The first batch after a partition is assigned stays
	// open until it reaches MaxEvents, reaches the end of the partition,
	// or 2s (at least MaxWait) pass: it must cover every message the
	// previous owner may have applied without committing, whose counter
	// deltas it turns into recounts. This assumes every member of the
	// group uses the same MaxEvents.
	MaxWait time.Duration
	// StartOffset is where a partition without a committed offset starts:
	// kafka.FirstOffset (default) or kafka.LastOffset.
	StartOffset int64
	// ReadyInterval is the period of the memcached health check; default
	// 2s.
	ReadyInterval time.Duration
	// ShutdownTimeout bounds applying the pending delayed bumps at
	// shutdown; default 10s.
	ShutdownTimeout time.Duration
	// Group protocol timing; zero means the client's defaults (heartbeat
	// 3s, session timeout 30s, rebalance timeout 30s, join backoff 5s).
	HeartbeatInterval, SessionTimeout, RebalanceTimeout, JoinGroupBackoff time.Duration
}

// Pinger checks that memcached answers; *memcache.Client is one. Close
// drops its idle connections (the client stays usable): after a failed
// ping the daemon closes them all at once, since after a memcached restart
// every pooled connection is dead and each would otherwise cost a failed
// request (and a retry backoff) of its own.
type Pinger interface {
	Ping() error
	Close() error
}

// Deps are the daemon's collaborators.
type Deps struct {
	// Pipeline applies batches; required. Its Rebumper, if any, is run by
	// the daemon and flushed at shutdown.
	Pipeline *Pipeline
	// Memcached is checked for readiness; required.
	Memcached Pinger
	// Logger receives the daemon's records; nil discards.
	Logger *slog.Logger
}

// Daemon consumes CDC topics as a member of a Kafka consumer group and
// keeps memcached in step with them (DESIGN §6): every assigned partition
// is read in order by its own goroutine, in batches that are planned,
// coalesced and applied, and whose offsets are committed only after every
// op succeeded. Create it with New and start it with Run.
type Daemon struct {
	cfg    Config
	p      *Pipeline
	health Pinger
	m      *Metrics
	log    *slog.Logger

	running     atomic.Bool
	joined      atomic.Bool
	memcachedUp atomic.Bool
}

// New checks cfg and deps and returns a Daemon. It does not connect to
// anything.
func New(cfg Config, deps Deps) (*Daemon, error) {
	if len(cfg.Kafka.Brokers) == 0 {
		return nil, errors.New("consumer: no Kafka brokers")
	}
	if cfg.Group == "" {
		return nil, errors.New("consumer: no consumer group")
	}
	if len(cfg.Topics) == 0 {
		return nil, errors.New("consumer: no topics")
	}
	if deps.Pipeline == nil || deps.Memcached == nil {
		return nil, errors.New("consumer: a Pipeline and a memcached Pinger are required")
	}
	if cfg.MaxEvents <= 0 {
		cfg.MaxEvents = DefaultMaxEvents
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = DefaultMaxWait
	}
	if cfg.StartOffset == 0 {
		cfg.StartOffset = kafka.FirstOffset
	}
	if cfg.ReadyInterval <= 0 {
		cfg.ReadyInterval = DefaultReadyInterval
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = DefaultShutdownTimeout
	}
	log := deps.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Daemon{cfg: cfg, p: deps.Pipeline, health: deps.Memcached, m: deps.Pipeline.Metrics(), log: log}, nil
}

// Ready reports whether the daemon is doing its job: memcached answered
// the last health check and the daemon is a member of the group. It is
// safe to call from any goroutine (the /readyz handler does).
func (d *Daemon) Ready() bool {
	return d.memcachedUp.Load() && d.joined.Load()
}

// Run consumes until ctx ends, then shuts down gracefully and returns nil:
// it stops fetching, abandons the batch in hand without committing it
// (its messages are delivered again, to this or another member), leaves
// the group, and applies the pending delayed bumps. Errors joining the
// group or reading partitions are logged and retried; Run returns an
// error only when it cannot start. Run may be called once.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("consumer: Run called twice")
	}
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                d.cfg.Group,
		Brokers:           d.cfg.Kafka.Brokers,
		Dialer:            d.cfg.Kafka.Dialer(),
		Topics:            d.cfg.Topics,
		StartOffset:       d.cfg.StartOffset,
		HeartbeatInterval: d.cfg.HeartbeatInterval,
		SessionTimeout:    d.cfg.SessionTimeout,
		RebalanceTimeout:  d.cfg.RebalanceTimeout,
		JoinGroupBackoff:  d.cfg.JoinGroupBackoff,
		// RetentionTime left at zero: committed offsets are kept as long
		// as the brokers' offsets.retention.minutes says.
		ErrorLogger: kafkaLogger(d.log, "consumer group"),
	})
	if err != nil {
		return fmt.Errorf("consumer: group %s: %w", d.cfg.Group, err)
	}
	d.log.Info("consumer starting", "group", d.cfg.Group, "topics", d.cfg.Topics, "brokers", d.cfg.Kafka.Brokers,
		"max_events", d.cfg.MaxEvents, "max_wait", d.cfg.MaxWait)

	// Background work outlives ctx until the partitions have stopped.
	bg, stopBackground := context.WithCancel(context.WithoutCancel(ctx))
	defer stopBackground()
	healthDone := make(chan struct{})
	go func() {
		defer close(healthDone)
		d.healthLoop(bg)
	}()
	rebump := d.p.cfg.Rebump
	rebumpDone := make(chan struct{})
	go func() {
		defer close(rebumpDone)
		if rebump != nil {
			rebump.Run(bg)
		}
	}()

	var lastErr string
	for {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				break
			}
			d.setJoined(false)
			// The group retries by itself, after JoinGroupBackoff.
			if msg := err.Error(); msg != lastErr {
				d.log.Warn("consumer group: cannot join; retrying", "group", d.cfg.Group, "error", msg)
				lastErr = msg
			}
			continue
		}
		lastErr = ""
		d.startGeneration(ctx, gen)
	}

	d.log.Info("consumer stopping: leaving the group")
	d.setJoined(false)
	group.Close() // ends the generation, waits for its partitions, leaves the group
	d.m.assigned.Set(0)

	stopBackground()
	<-rebumpDone
	<-healthDone
	if rebump != nil {
		flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.ShutdownTimeout)
		rebump.Flush(flushCtx)
		cancel()
	}
	d.log.Info("consumer stopped")
	return nil
}

// startGeneration starts one goroutine per assigned partition; each lives
// until the generation ends (a rebalance) or ctx does.
func (d *Daemon) startGeneration(ctx context.Context, gen *kafka.Generation) {
	d.setJoined(true)
	d.m.generations.Inc()
	n := 0
	assigned := make(map[string][]int, len(gen.Assignments))
	for topic, parts := range gen.Assignments {
		for _, pa := range parts {
			assigned[topic] = append(assigned[topic], pa.ID)
			n++
		}
	}
	d.m.assigned.Set(float64(n))
	d.log.Info("joined consumer group generation", "group", gen.GroupID, "generation", gen.ID,
		"member", gen.MemberID, "partitions", assigned)
	for topic, parts := range gen.Assignments {
		for _, pa := range parts {
			gen.Start(func(genCtx context.Context) {
				pctx, cancel := context.WithCancel(ctx)
				defer cancel()
				stop := context.AfterFunc(genCtx, cancel)
				defer stop()
				d.consumePartition(pctx, gen, topic, pa)
			})
		}
	}
}

func (d *Daemon) setJoined(v bool) {
	d.joined.Store(v)
	boolGauge(d.m.groupJoined, v)
	d.updateReady()
}

func (d *Daemon) updateReady() {
	boolGauge(d.m.ready, d.Ready())
}

// healthLoop pings memcached every ReadyInterval until ctx ends.
func (d *Daemon) healthLoop(ctx context.Context) {
	t := time.NewTicker(d.cfg.ReadyInterval)
	defer t.Stop()
	for first := true; ; first = false {
		err := d.health.Ping()
		up := err == nil
		if !up {
			d.health.Close()
		}
		if was := d.memcachedUp.Swap(up); was != up || first {
			if up {
				d.log.Info("memcached reachable")
			} else {
				d.log.Warn("memcached unreachable; not ready", "error", err.Error())
			}
		}
		boolGauge(d.m.memcachedUp, up)
		d.updateReady()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// kafkaLogger adapts slog to the Kafka client's error logger.
func kafkaLogger(log *slog.Logger, component string) kafka.Logger {
	return kafka.LoggerFunc(func(format string, args ...any) {
		log.Warn(fmt.Sprintf(format, args...), "component", component)
	})
}
