package config

import (
	"fmt"
	"log/slog"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// redacted replaces a secret wherever the config is printed or logged.
const redacted = "xxxxx"

// RedactDSN returns dsn with its password replaced by "xxxxx", for logs and
// error messages. A DSN the driver cannot parse is redacted from its first
// ':' up to its last '@' (which covers "user:password@…" shapes).
func RedactDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	if c, err := mysql.ParseDSN(dsn); err == nil {
		if c.Passwd == "" {
			return c.FormatDSN()
		}
		c.Passwd = redacted
		return c.FormatDSN()
	}
	at := strings.LastIndexByte(dsn, '@')
	if at < 0 {
		return dsn
	}
	colon := strings.IndexByte(dsn[:at], ':')
	if colon < 0 {
		return dsn
	}
	return dsn[:colon+1] + redacted + dsn[at:]
}

// redactPassword returns redacted for a password that is set, "" for
// none.
func redactPassword(pw string) string {
	if pw == "" {
		return ""
	}
	return redacted
}

// String describes the section with the DSN's password redacted.
func (m MySQL) String() string {
	return fmt.Sprintf("{DSN:%s MaxOpenConns:%d QueryTimeout:%s}", RedactDSN(m.DSN), m.MaxOpenConns, m.QueryTimeout)
}

// GoString is String, so that %#v redacts too.
func (m MySQL) GoString() string { return "config.MySQL" + m.String() }

// LogValue logs the section with the DSN's password redacted.
func (m MySQL) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("dsn", RedactDSN(m.DSN)),
		slog.Int("max_open_conns", m.MaxOpenConns),
		slog.Duration("query_timeout", m.QueryTimeout),
	)
}

// String describes the section with the password redacted.
func (s SASL) String() string {
	pw := redactPassword(s.Password)
	return fmt.Sprintf("{Mechanism:%s Username:%s Password:%s TokenFile:%s}", s.Mechanism, s.Username, pw, s.TokenFile)
}

// GoString is String, so that %#v redacts too.
func (s SASL) GoString() string { return "config.SASL" + s.String() }

// LogValue logs the section with the password redacted.
func (s SASL) LogValue() slog.Value {
	pw := redactPassword(s.Password)
	return slog.GroupValue(
		slog.String("mechanism", string(s.Mechanism)),
		slog.String("username", s.Username),
		slog.String("password", pw),
	)
}

// String describes the section with the password redacted.
func (r SchemaRegistry) String() string {
	pw := redactPassword(r.Password)
	return fmt.Sprintf("{URLs:%v Username:%s Password:%s TLS:%+v Timeout:%s}", r.URLs, r.Username, pw, r.TLS, r.Timeout)
}

// GoString is String, so that %#v redacts too.
func (r SchemaRegistry) GoString() string { return "config.SchemaRegistry" + r.String() }

// LogValue logs the section with the password redacted.
func (r SchemaRegistry) LogValue() slog.Value {
	pw := redactPassword(r.Password)
	return slog.GroupValue(
		slog.Any("urls", r.URLs),
		slog.String("username", r.Username),
		slog.String("password", pw),
		slog.Bool("tls", r.TLS.Enabled),
		slog.Duration("timeout", r.Timeout),
	)
}

// LogValue logs the settings an operator checks at start-up; secrets are
// redacted.
func (c *Config) LogValue() slog.Value {
	return slog.GroupValue(
		slog.String("file", c.File),
		slog.Any("brokers", c.Kafka.Brokers),
		slog.String("group", c.Kafka.Group),
		slog.Any("topics", c.Kafka.Topics),
		slog.String("format", c.Kafka.Format),
		slog.String("dlq_topic", c.Kafka.DLQTopic),
		slog.Bool("tls", c.Kafka.TLS.Enabled),
		slog.Any("sasl", c.Kafka.SASL),
		slog.Any("schema_registry", c.Kafka.SchemaRegistry),
		slog.Any("memcached", c.Memcached.Servers),
		slog.Any("mysql", c.MySQL),
		slog.Any("rules", c.Rules),
		slog.Int("batch_max_events", c.Batch.MaxEvents),
		slog.Duration("batch_max_wait", c.Batch.MaxWait),
		slog.String("http_listen", c.HTTP.Listen),
	)
}

// String describes the whole config with secrets redacted.
func (c *Config) String() string {
	return fmt.Sprintf("{File:%s Kafka:%+v Memcached:%+v MySQL:%s Rules:%v Batch:%+v HTTP:%+v Log:%+v}",
		c.File, c.Kafka, c.Memcached, c.MySQL, c.Rules, c.Batch, c.HTTP, c.Log)
}
