package wiring

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/pipeline"
	"github.com/cachewarden/cachewarden/source/binlog"
)

// Source is what `cachewarden run` runs: the Kafka source's Daemon or the
// binary log's.
type Source interface {
	Run(ctx context.Context) error
	NotReady() []string
}

// NewSource returns the source the config's `source` names, over the
// stack's pipeline.
func (s *Stack) NewSource() (Source, error) {
	if s.Config.Source == config.SourceBinlog {
		return s.NewBinlogDaemon()
	}
	return s.NewDaemon(s.DaemonConfig())
}

// binlogSourceConns bounds the connections to the source server: the
// lease's, the checkpoint's and information_schema's queries.
const binlogSourceConns = 4

// NewBinlogDaemon returns the binary log source the config's binlog
// section describes, over the stack's pipeline; its connection to the
// source closes with the stack. It connects to nothing yet.
func (s *Stack) NewBinlogDaemon() (*binlog.Daemon, error) {
	b := s.Config.Binlog
	db, err := sql.Open("mysql", b.DSN)
	if err != nil {
		return nil, fmt.Errorf("binlog.dsn: %w", err)
	}
	db.SetMaxOpenConns(binlogSourceConns)
	db.SetConnMaxLifetime(time.Hour)
	s.closers = append(s.closers, db.Close)
	start, err := binlog.ParsePosition(b.Start)
	if err != nil {
		return nil, fmt.Errorf("binlog.start: %w", err)
	}
	purged := binlog.PurgedFail
	if b.Purged == config.PurgedCurrent {
		purged = binlog.PurgedCurrent
	}
	h, err := s.newHealth()
	if err != nil {
		return nil, err
	}
	return binlog.NewDaemon(binlog.DaemonConfig{
		Stream:     binlog.Config{DSN: b.DSN, ServerID: uint32(b.ServerID), Start: start},
		Lease:      binlog.LeaseConfig{Name: b.Name, Duration: b.Lease},
		Checkpoint: binlog.CheckpointConfig{Database: b.CheckpointDatabase, Table: b.CheckpointTable, Name: b.Name},
		MaxEvents:  s.Config.Batch.MaxEvents,
		Purged:     purged,
	}, binlog.Deps{Pipeline: s.Pipeline, Health: h, Source: db, Metrics: binlog.NewMetrics(s.Registry),
		Logger: s.Logger.With("component", "binlog")})
}

// newHealth returns the readiness checks of a source: memcached pinged
// with the meta probe (which writes a key) unless the stack writes with
// the text protocol or only observes, and MySQL when a rule queries it.
func (s *Stack) newHealth() (*pipeline.Health, error) {
	var ping pipeline.Pinger = s.Memcache
	if s.Config.Memcached.Protocol != config.ProtocolText && !s.observeOnly {
		ping = &metaPinger{Client: s.Memcache, probe: s.Applier.Probe}
	}
	return pipeline.NewHealth(pipeline.HealthConfig{Memcached: ping, MySQL: s.mysqlHealth(), Metrics: s.Metrics,
		Logger: s.Logger.With("component", "health")})
}
