package config

import (
	"math"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/cachewarden/cachewarden/source/binlog"
)

// Binlog is the `binlog` section: the binary log source
// (docs/operations.md, "Binary log source"), read when source is binlog.
type Binlog struct {
	// DSN names the source server and the replication user
	// ("user:pass@tcp(db1:3306)/"): REPLICATION SLAVE, REPLICATION CLIENT
	// (MariaDB: BINLOG MONITOR), SELECT, and on the checkpoint database
	// CREATE, INSERT, UPDATE. Required.
	DSN string `yaml:"dsn"`
	// ServerID is the server id the daemon reads as; it must differ from
	// the server's and from every other replica's. Required.
	ServerID int `yaml:"server_id"`
	// Name is shared by the instances of which one is active: the lease
	// lock and the checkpoint row; default "cachewarden".
	Name string `yaml:"name"`
	// CheckpointDatabase holds the checkpoint table, on the source
	// server; default "cachewarden". CheckpointTable names the table;
	// default binlog.DefaultCheckpointTable.
	CheckpointDatabase string `yaml:"checkpoint_database"`
	CheckpointTable    string `yaml:"checkpoint_table"`
	// Lease is how long a frozen or cut-off active keeps the lease before
	// a standby takes over; default binlog.DefaultLeaseDuration.
	Lease time.Duration `yaml:"lease"`
	// Purged is what happens when the checkpoint's position was purged
	// from the source's log: "fail" (default: stop, not ready) or
	// "current" (bump every table's fallback and read on from the current
	// position).
	Purged BinlogPurged `yaml:"purged"`
	// Start is where reading starts when no checkpoint exists: "" (the
	// server's current position), "gtid:SET" or "file:NAME:POS".
	Start string `yaml:"start,omitempty"`
}

// Defaults of the binlog section the binlog package does not declare.
const (
	DefaultBinlogName               = "cachewarden"
	DefaultBinlogCheckpointDatabase = "cachewarden"
)

// MaxBinlogLease bounds binlog.lease.
const MaxBinlogLease = 10 * time.Minute

func (d *decoder) validateBinlog(b *Binlog) {
	const p = "binlog."
	if b.DSN == "" && d.Readable(p+"dsn") {
		d.required(p+"dsn", "name the source server: user:password@tcp(host:3306)/")
	} else if _, err := mysql.ParseDSN(b.DSN); err != nil {
		d.wrong(p+"dsn", "%v", err)
	}
	if b.ServerID == 0 && d.Readable(p+"server_id") {
		d.required(p+"server_id", "a server id from 1 to 4294967295 that no other replica of the server uses")
	} else if b.ServerID < 0 || b.ServerID > math.MaxUint32 {
		d.wrong(p+"server_id", "%d is outside 1..4294967295", b.ServerID)
	}
	if d.orDefault(p+"name", func() { b.Name = DefaultBinlogName }) && (b.Name == "" || len(binlog.LockPrefix)+len(b.Name) > 64) {
		d.wrong(p+"name", "%q must be 1 to %d bytes (the lease lock %q + name is at most 64)", b.Name, 64-len(binlog.LockPrefix), binlog.LockPrefix)
	}
	if d.orDefault(p+"checkpoint_database", func() { b.CheckpointDatabase = DefaultBinlogCheckpointDatabase }) && b.CheckpointDatabase == "" {
		d.wrong(p+"checkpoint_database", "name the database that holds the checkpoint table")
	}
	if d.orDefault(p+"checkpoint_table", func() { b.CheckpointTable = binlog.DefaultCheckpointTable }) && b.CheckpointTable == "" {
		d.wrong(p+"checkpoint_table", "name the checkpoint table")
	}
	d.positiveDuration(&b.Lease, p+"lease", binlog.DefaultLeaseDuration, MaxBinlogLease)
	if d.Set(p+"lease") && b.Lease > 0 && b.Lease < binlog.MinLeaseDuration {
		d.wrong(p+"lease", "%s is below the minimum %s", b.Lease, binlog.MinLeaseDuration)
	}
	oneOf(d, p+"purged", &b.Purged, PurgedFail, BinlogPurgeds)
	if _, err := binlog.ParsePosition(b.Start); err != nil {
		d.wrong(p+"start", "%v", err)
	}
}

// DeploymentName names what the instances of one deployment share, and so
// the memcached pool they write (the rebump journal's and the observer's
// key): kafka.group, or binlog.name with source binlog.
func (c *Config) DeploymentName() string {
	if c.Source == SourceBinlog {
		return c.Binlog.Name
	}
	return c.Kafka.Group
}
