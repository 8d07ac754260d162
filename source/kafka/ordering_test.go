package kafka

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// surrogateChange is a Debezium change of user_interests keyed by a
// surrogate id, as a connector keys it by primary key.
func surrogateChange(op string, id, user, interest int) kafka.Message {
	r := row("id", id, "user_id", user, "interest_id", interest)
	var m kafka.Message
	switch op {
	case "c":
		m = debezium("c", "shop", "user_interests", nil, r)
	case "d":
		m = debezium("d", "shop", "user_interests", r, nil)
	}
	m.Key = []byte(fmt.Sprintf(`{"id":%d}`, id))
	return m
}

// TestUnorderedSetsAreDeleted reproduces memberships whose changes travel
// on different partitions (a surrogate id keys the messages; a member is
// deleted and inserted again under a new id): the daemon reports the
// rule, and every set ends right or missing, never wrong.
func TestUnorderedSetsAreDeleted(t *testing.T) {
	topic := "cdc-order-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 6, topic)
	r := newRig(t, daemonRules, rigOptions{})
	const users, interests = 20, 6
	truth := make(map[int]map[int]bool)
	var msgs []kafka.Message
	id := 0
	for u := range users {
		r.set("interests:"+strconv.Itoa(u), "")
		truth[u] = make(map[int]bool)
		for i := range interests {
			first, second := id+1, id+2
			id += 2
			msgs = append(msgs, surrogateChange("c", first, u, i), surrogateChange("d", first, u, i), surrogateChange("c", second, u, i))
			truth[u][i] = true
			if i%3 == 0 {
				msgs = append(msgs, surrogateChange("d", second, u, i))
				truth[u][i] = false
			}
		}
	}
	produce(t, brokers, topic, msgs...)
	_, stop := r.daemon(brokers, group, topic)
	waitFor(t, 30*time.Second, func() string {
		if off := committed(t, brokers, group, topic, 0, 1, 2, 3, 4, 5); sum(off) < int64(len(msgs)) {
			return fmt.Sprintf("committed %v of %d messages", off, len(msgs))
		}
		return ""
	})
	must(t, stop())
	missing, present := 0, 0
	for u := range users {
		item := r.get("interests:" + strconv.Itoa(u))
		if item == "<missing>" {
			missing++
			continue
		}
		got := members(item)
		for i, in := range truth[u] {
			if got[strconv.Itoa(i)] != in {
				t.Errorf("user %d: interest %d member %v, want %v (set %q)", u, i, got[strconv.Itoa(i)], in, item)
			}
		}
		present++
	}
	t.Logf("%d sets missing, %d present", missing, present)
	if missing == 0 {
		t.Errorf("no set was deleted")
	}
	if got := testsvc.Metric(t, r.reg, "cachewarden_set_rule_unordered", "rule=user-interests", "topic="+topic); got != 1 {
		t.Errorf("unordered set rule gauge = %v, want 1", got)
	}
	if logs := r.logs.String(); !strings.Contains(logs, "key_columns_seen=id") || !strings.Contains(logs, "rule=user-interests") {
		t.Errorf("the error does not name the rule and the key columns seen")
	}
}

// TestOrderedSetsAppend keys the same changes by the set's own columns:
// nothing is reported and the sets are appended to.
func TestOrderedSetsAppend(t *testing.T) {
	topic := "cdc-order-" + testsvc.Unique()
	group := "cw-" + testsvc.Unique()
	brokers := testsvc.KafkaTopics(t, 6, topic)
	r := newRig(t, daemonRules, rigOptions{})
	r.set("interests:1", "")
	var msgs []kafka.Message
	for i := range 4 {
		m := surrogateChange("c", 10+i, 1, i)
		m.Key = []byte(fmt.Sprintf(`{"user_id":1,"interest_id":%d}`, i))
		msgs = append(msgs, m)
	}
	produce(t, brokers, topic, msgs...)
	_, stop := r.daemon(brokers, group, topic)
	defer stop()
	waitFor(t, 30*time.Second, func() string {
		if got := members(r.get("interests:1")); len(got) != 4 {
			return "interests:1 = " + r.get("interests:1")
		}
		return ""
	})
	if got := testsvc.Metric(t, r.reg, "cachewarden_set_rule_unordered", "rule=user-interests", "topic="+topic); got != 0 {
		t.Errorf("unordered set rule gauge = %v, want 0", got)
	}
}

func sum(m map[int]int64) int64 {
	var n int64
	for _, v := range m {
		n += max(v, 0)
	}
	return n
}
