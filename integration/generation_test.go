package integration

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/client"
)

// TestLostChangesInvalidateSetsAndCounters: changes the daemon cannot
// apply exactly (a poison removal from a set, a poison delete under a
// counter, a TRUNCATE) leave no set or counter of their tables valid:
// read through the client after the real daemon moved past them, sets and
// counters agree with MySQL (docs/formats.md, "Generations"), and the
// losses are counted as covered.
func TestLostChangesInvalidateSetsAndCounters(t *testing.T) {
	s := newScenario(t, ScenarioOptions{Rules: []string{testRules}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg, _ := loadConfig(t, s.ConfigFile(""))
	d := startDaemon(t, s, cfg)
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Round(ctx, 15); err != nil {
		t.Fatal(err)
	}
	db := s.MySQL.DB()
	var user int64
	var interest string
	if err := db.QueryRowContext(ctx, "SELECT user_id, interest FROM user_interests WHERE active = 1 ORDER BY user_id, interest LIMIT 1").Scan(&user, &interest); err != nil {
		t.Fatal(err)
	}
	var post, comment int64
	if err := db.QueryRowContext(ctx, "SELECT post_id, id FROM comments WHERE approved = 1 AND post_id IS NOT NULL ORDER BY id LIMIT 1").Scan(&post, &comment); err != nil {
		t.Fatal(err)
	}
	userRow, postRow := client.Row{"user_id": user}, client.Row{"post_id": post}
	// Both are cached now, as an application reads them.
	members, err := s.Client.Members(ctx, "user-interests", userRow)
	if err != nil || !slices.Contains(members, interest) {
		t.Fatalf("Members(user %d) = %q, %v; want %q among them", user, members, err, interest)
	}
	before, err := s.Client.Count(ctx, "post-comments", postRow)
	if err != nil || before == 0 {
		t.Fatalf("Count(post %d) = %d, %v", post, before, err)
	}

	// The rows change in MySQL, but the change events the daemon gets are
	// poison: it can plan neither.
	if _, err := db.ExecContext(ctx, "UPDATE user_interests SET active = 0 WHERE user_id = ? AND interest = ?", user, interest); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "DELETE FROM comments WHERE id = ?", comment); err != nil {
		t.Fatal(err)
	}
	interests, comments := s.topic(s.Schema.Interests), s.topic(s.Schema.Comments)
	if err := s.Publisher.PublishRaw(ctx,
		OutMessage{Topic: interests, Key: []byte(fmt.Sprintf(`{"user_id":%d}`, user)), Value: []byte(`{"before":{"user_id":` + fmt.Sprint(user) + `,"interest":"cut sh`)},
		OutMessage{Topic: comments, Key: []byte(fmt.Sprintf(`{"id":%d}`, comment)), Value: []byte(`not JSON at all`)},
	); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	members, err = s.Client.Members(ctx, "user-interests", userRow)
	if err != nil || slices.Contains(members, interest) {
		t.Errorf("after a lost removal Members(user %d) = %q, %v; %q was removed in MySQL", user, members, err, interest)
	}
	if n, err := s.Client.Count(ctx, "post-comments", postRow); err != nil || n != before-1 {
		t.Errorf("after a lost delete Count(post %d) = %d, %v; want %d", post, n, err, before-1)
	}
	lost := lostCounts(t, d)
	if lost["poison/fallback"] != 2 || lost["poison/none"] != 0 {
		t.Errorf("cachewarden_invalidations_lost_total: %v; want 2 poison messages covered", lost)
	}

	// A TRUNCATE empties every set of its table at once.
	var other int64
	if err := db.QueryRowContext(ctx, "SELECT user_id FROM user_interests WHERE active = 1 AND user_id <> ? ORDER BY user_id LIMIT 1", user).Scan(&other); err != nil {
		t.Fatal(err)
	}
	otherRow := client.Row{"user_id": other}
	if m, err := s.Client.Members(ctx, "user-interests", otherRow); err != nil || len(m) == 0 {
		t.Fatalf("Members(user %d) = %q, %v; want some", other, m, err)
	}
	if _, err := db.ExecContext(ctx, "TRUNCATE TABLE user_interests"); err != nil {
		t.Fatal(err)
	}
	truncate := fmt.Sprintf(`{"before":null,"after":null,"source":{"db":%q,"table":"user_interests"},"op":"t","ts_ms":1}`, s.Schema.Interests.Database)
	if err := s.Publisher.PublishRaw(ctx, OutMessage{Topic: interests, Key: []byte(`{}`), Value: []byte(truncate)}); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitCaughtUp(ctx); err != nil {
		t.Fatal(err)
	}
	for _, row := range []client.Row{userRow, otherRow} {
		if m, err := s.Client.Members(ctx, "user-interests", row); err != nil || len(m) != 0 {
			t.Errorf("after TRUNCATE Members(%v) = %q, %v; want none", row, m, err)
		}
	}
	check(t, ctx, s)
}

// lostCounts returns cachewarden_invalidations_lost_total by
// "reason/covered".
func lostCounts(t *testing.T, d *Daemon) map[string]float64 {
	t.Helper()
	families, err := d.Stack.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "cachewarden_invalidations_lost_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			var reason, covered string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "reason":
					reason = l.GetValue()
				case "covered":
					covered = l.GetValue()
				}
			}
			out[reason+"/"+covered] += m.GetCounter().GetValue()
		}
	}
	return out
}
