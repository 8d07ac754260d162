package integration

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// TestDLQOldRecords publishes poison messages whose records are hours old
// (a consumer catching up on a backlog reads such records): each reaches
// the dead-letter topic, stamped when written, with its original time in
// the cachewarden.timestamp header, and the partitions move on to their
// end. The Kafka client times a produce out from the record's timestamp:
// a dead letter that kept the original one was never written, and its
// partition waited for good.
func TestDLQOldRecords(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Rules: []string{testRules}})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dlq := s.Opts.TopicPrefix + ".dlq"
	cfg, _ := loadConfig(t, s.ConfigFile(dlq))
	d := startDaemon(t, s, cfg)
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Round(ctx, 10); err != nil {
		t.Fatal(err)
	}
	users, comments := s.topic(s.Schema.Users), s.topic(s.Schema.Comments)
	old := time.Now().Add(-5 * time.Hour).Truncate(time.Millisecond)
	poison := []OutMessage{
		{Topic: users, Key: []byte(`{"id":1}`), Value: []byte(`{"before":null,"after":{"id":1,"name":"cut short`), Time: old},
		{Topic: users, Key: []byte(`{"id":2}`), Value: []byte(`not JSON`), Time: old.Add(time.Minute)},
		{Topic: comments, Key: []byte(`{"id":3}`), Value: []byte(`{"op":`), Time: old.Add(2 * time.Hour)},
	}
	if err := s.Publisher.PublishRaw(ctx, poison...); err != nil {
		t.Fatal(err)
	}
	published := time.Now()
	// Changes behind the poison messages are applied: the partitions
	// moved on (a DLQ write times out after 30s at most).
	if _, _, err := s.Publish(ctx, 10); err != nil {
		t.Fatal(err)
	}
	caughtUp, cancelCaughtUp := context.WithTimeout(ctx, 90*time.Second)
	defer cancelCaughtUp()
	if err := s.WaitCaughtUp(caughtUp); err != nil {
		t.Fatalf("partitions did not reach their end behind poison messages 5 hours old: %v", err)
	}
	for i, got := range deadLetters(ctx, t, s, dlq, poison) {
		p := poison[i]
		if got == nil {
			continue
		}
		if want := strconv.FormatInt(p.Time.UnixMilli(), 10); got.Headers["cachewarden.timestamp"] != want {
			t.Errorf("poison message %d: cachewarden.timestamp %q, want %s (headers %v)", i, got.Headers["cachewarden.timestamp"], want, got.Headers)
		}
		if got.Time.Before(published.Add(-time.Minute)) {
			t.Errorf("poison message %d: dead letter stamped %v, want when it was written (after %v)", i, got.Time, published)
		}
	}
	if !d.Daemon.Ready() {
		t.Errorf("daemon not ready after the poison messages: %v", d.Daemon.NotReady())
	}
	c, err := d.Counts()
	if err != nil {
		t.Fatal(err)
	}
	if c.DLQ != float64(len(poison)) {
		t.Errorf("metrics: %.0f dead letters, want %d", c.DLQ, len(poison))
	}
	check(t, ctx, s)
}

// deadLetters reads the dead-letter topic dlq and returns, for each of
// poison, the dead letter holding its value (nil, reported as an error,
// when there is none). The topic must hold as many messages as poison.
func deadLetters(ctx context.Context, t *testing.T, s *Scenario, dlq string, poison []OutMessage) []*Message {
	t.Helper()
	dead, err := s.Broker.ReadAll(ctx, dlq)
	if err != nil {
		t.Fatal(err)
	}
	if len(dead) != len(poison) {
		t.Fatalf("dead-letter topic holds %d messages, want %d", len(dead), len(poison))
	}
	out := make([]*Message, len(poison))
	for i, p := range poison {
		for j := range dead {
			if string(dead[j].Value) == string(p.Value) {
				out[i] = &dead[j]
			}
		}
		if out[i] == nil {
			t.Errorf("poison message %d (%s) is not in the dead-letter topic", i, p.Value)
		}
	}
	return out
}
