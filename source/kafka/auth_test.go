package kafka

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// TestKafkaAuthFailure runs the daemon against brokers that refuse its
// SASL password: the failure is logged once (however often the client
// retries), naming the mechanism and the user but not the password, and
// /readyz says why the daemon is not ready.
func TestKafkaAuthFailure(t *testing.T) {
	for _, tc := range []struct{ mechanism, kfakeName string }{
		{"plain", "PLAIN"},
		{"scram-sha-256", "SCRAM-SHA-256"},
	} {
		t.Run(tc.mechanism, func(t *testing.T) {
			c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "auth"),
				kfake.EnableSASL(), kfake.Superuser(tc.kfakeName, "cw", "s3cret"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			const password = "wrong-Pa55word"
			conn := saslConn(c.ListenAddrs(), tc.mechanism, "cw", password)
			r := newRig(t, daemonRules, rigOptions{})
			d, stop := r.daemonWith(conn.Brokers, "auth-"+tc.mechanism, func(c *Config) { c.Kafka = conn }, "auth")
			var reasons []string
			waitFor(t, 30*time.Second, func() string {
				reasons = d.NotReady()
				for _, s := range reasons {
					if strings.Contains(s, "authentication") {
						return ""
					}
				}
				return "no authentication failure in /readyz: " + strings.Join(reasons, "; ")
			})
			// Let the client retry a few more times.
			time.Sleep(3 * time.Second)
			reasons = d.NotReady()
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			t.Logf("/readyz: %s", strings.Join(reasons, "; "))
			var got string
			for _, s := range reasons {
				if strings.Contains(s, "authentication") {
					got = s
				}
			}
			if !strings.Contains(got, tc.mechanism) || !strings.Contains(got, `"cw"`) {
				t.Errorf("/readyz reason %q does not name the mechanism %s and the user cw", got, tc.mechanism)
			}
			logs := r.logs.String()
			if n := strings.Count(logs, "kafka: authentication failed"); n != 1 {
				t.Errorf("authentication failure logged %d times, want once:\n%s", n, logs)
			}
			if strings.Contains(logs, password) || strings.Contains(got, password) {
				t.Errorf("the password shows in the log or /readyz")
			}
			for _, line := range strings.Split(logs, "\n") {
				if strings.Contains(line, "authentication failed") {
					t.Logf("log: %s", line)
				}
			}
		})
	}
}

// TestReplayAuthFailure resolves a replay's ranges through brokers that
// refuse the password: the error says so, instead of a bare EOF.
func TestReplayAuthFailure(t *testing.T) {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "auth"),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "cw", "s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const password = "wrong-Pa55word"
	conn := saslConn(c.ListenAddrs(), "scram-sha-512", "cw", password)
	log, _ := testLogger(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = ResolveReplayRanges(ctx, conn, []string{"auth"}, ReplayBound{Earliest: true}, ReplayBound{}, log)
	t.Logf("replay: %v", err)
	if err == nil || !strings.Contains(err.Error(), "SASL scram-sha-512 authentication as user \"cw\" failed") || strings.Contains(err.Error(), password) {
		t.Errorf("replay through brokers refusing the password: %v; want the mechanism and the user named, not the password", err)
	}
}

// TestSchemaRegistryAuthFailure asks a registry that refuses the
// credentials for a schema: the refusal is logged once over the retries,
// naming the user (never the password), and reported for /readyz until
// the registry answers again.
func TestSchemaRegistryAuthFailure(t *testing.T) {
	accept := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		select {
		case <-accept:
			w.Header().Set("Content-Type", "application/vnd.schemaregistry.v1+json")
			w.WriteHeader(http.StatusNotFound)
			w.Write([]byte(`{"error_code":40403,"message":"Schema not found"}`))
		default:
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			w.Write([]byte(`{"error_code":401,"message":"Unauthorized"}`))
		}
	}))
	defer srv.Close()
	log, logs := testLogger(t)
	const password = "wrong-Pa55word"
	reg, err := NewSchemaRegistry(RegistryConfig{URLs: []string{srv.URL}, Username: "reader", Password: password}, nil, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for range 5 {
		if err := reg.Fetch(ctx, []uint32{7}); err == nil {
			t.Fatal("Fetch succeeded against a registry refusing the credentials")
		}
	}
	got := reg.AuthFailure()
	t.Logf("/readyz: schema registry: %s", got)
	if !strings.Contains(got, "authentication failed") || !strings.Contains(got, `"reader"`) || !strings.Contains(got, "401") {
		t.Errorf("AuthFailure %q: want the failure, the user and the status", got)
	}
	if n := strings.Count(logs.String(), "refused the credentials"); n != 1 {
		t.Errorf("refusal logged %d times over 5 attempts, want once:\n%s", n, logs)
	}
	if strings.Contains(logs.String(), password) || strings.Contains(got, password) {
		t.Errorf("the password shows in the log or /readyz")
	}
	close(accept)
	if err := reg.Fetch(ctx, []uint32{7}); err != nil {
		t.Fatalf("Fetch once the registry answers: %v", err)
	}
	if f := reg.AuthFailure(); f != "" {
		t.Errorf("AuthFailure %q after the registry answered", f)
	}
}

// saslConn reaches brokers as user with password by mechanism ("plain",
// "scram-sha-256" or "scram-sha-512"), as the config's kafka.sasl does.
func saslConn(brokers []string, mechanism, user, password string) KafkaConn {
	conn := KafkaConn{Brokers: brokers, SASLMechanism: mechanism, SASLUser: user}
	switch mechanism {
	case "plain":
		conn.SASL = plain.Auth{User: user, Pass: password}.AsMechanism()
	case "scram-sha-256":
		conn.SASL = scram.Auth{User: user, Pass: password}.AsSha256Mechanism()
	case "scram-sha-512":
		conn.SASL = scram.Auth{User: user, Pass: password}.AsSha512Mechanism()
	}
	return conn
}
