package wiring

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/cachewarden/cachewarden/config"
)

// TestSASLMechanisms reads a partition through brokers that require SASL,
// with each mechanism kafka.sasl accepts for a username and password, and
// checks that a wrong password is refused.
func TestSASLMechanisms(t *testing.T) {
	for _, tc := range []struct{ mechanism, kfakeName string }{
		{"plain", "PLAIN"},
		{"scram-sha-256", "SCRAM-SHA-256"},
		{"scram-sha-512", "SCRAM-SHA-512"},
	} {
		t.Run(tc.mechanism, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "sasl"),
				kfake.EnableSASL(), kfake.Superuser(tc.kfakeName, "cw", "s3cret"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			conn, err := KafkaConnFromConfig(config.Kafka{Brokers: c.ListenAddrs(),
				SASL: config.SASL{Mechanism: config.SASLMechanism(tc.mechanism), Username: "cw", Password: "s3cret"}})
			if err != nil {
				t.Fatal(err)
			}
			log := slog.New(slog.DiscardHandler)
			prod, err := conn.NewClient(log, kgo.DefaultProduceTopic("sasl"))
			if err != nil {
				t.Fatal(err)
			}
			defer prod.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := prod.ProduceSync(ctx, &kgo.Record{Value: []byte("v0")}).FirstErr(); err != nil {
				t.Fatalf("produce with %s: %v", tc.mechanism, err)
			}
			reader, err := conn.NewClient(log, kgo.ConsumeTopics("sasl"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer reader.Close()
			fetches := reader.PollRecords(ctx, 1)
			if err := fetches.Err(); err != nil || fetches.NumRecords() != 1 || string(fetches.Records()[0].Value) != "v0" {
				t.Fatalf("read with %s: %v", tc.mechanism, err)
			}

			bad, err := KafkaConnFromConfig(config.Kafka{Brokers: c.ListenAddrs(),
				SASL: config.SASL{Mechanism: config.SASLMechanism(tc.mechanism), Username: "cw", Password: "wrong"}})
			if err != nil {
				t.Fatal(err)
			}
			cl, err := bad.NewClient(log, kgo.DefaultProduceTopic("sasl"), kgo.RecordDeliveryTimeout(2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("x")}).FirstErr(); err == nil || errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil {
				t.Fatalf("produce with a wrong password: %v, want an authentication error", err)
			}
		})
	}
}

// TestOAuthBearerTokenFile checks that the OAUTHBEARER mechanism sends
// the token the file holds at each authentication (a rotated token is
// picked up) and fails clearly when the file is gone or has no end.
func TestOAuthBearerTokenFile(t *testing.T) {
	path := t.TempDir() + "/token"
	conn, err := KafkaConnFromConfig(config.Kafka{Brokers: []string{"127.0.0.1:1"},
		SASL: config.SASL{Mechanism: "oauthbearer", TokenFile: path}})
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"first.jwt.token", "rotated.jwt.token"} {
		if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, msg, err := conn.SASL.Authenticate(context.Background(), "broker:9092")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(msg), "auth=Bearer "+token+"\x01") {
			t.Errorf("client message %q does not carry %q", msg, token)
		}
	}
	os.Remove(path)
	if _, _, err := conn.SASL.Authenticate(context.Background(), "broker:9092"); err == nil || !strings.Contains(err.Error(), "kafka.sasl.token_file") {
		t.Errorf("missing token file: %v", err)
	}
	endless, err := KafkaConnFromConfig(config.Kafka{Brokers: []string{"127.0.0.1:1"},
		SASL: config.SASL{Mechanism: "oauthbearer", TokenFile: "/dev/zero"}})
	if err != nil {
		t.Fatal(err)
	}
	want := "kafka.sasl.token_file: /dev/zero: more than 65536 bytes, the limit"
	if _, _, err := endless.SASL.Authenticate(context.Background(), "broker:9092"); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("token file without end: %v, want %q", err, want)
	}
}
