package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"
)

// NaiveOpKind is the memcached command the naive consumer issues.
type NaiveOpKind string

// The naive consumer's commands.
const (
	NaiveBump   NaiveOpKind = "bump"   // incr by 1; on a miss, add the current unix ms
	NaiveAppend NaiveOpKind = "append" // append a "+member " / "-member " token
	NaiveIncr   NaiveOpKind = "incr"   // counter +1
	NaiveDecr   NaiveOpKind = "decr"   // counter -1
)

// NaiveOp is the one memcached operation the naive consumer applies for an
// event of the benchmark workload.
type NaiveOp struct {
	Kind NaiveOpKind
	Key  string
	// Token is the set token ("+7 " or "-7 ") of NaiveAppend.
	Token string
}

// PlanNaive decodes a Debezium message value the straightforward way
// (encoding/json into a map) and returns the operation the benchmark rules
// (bench/testdata/rules.yaml) ask for; ok is false for events no rule
// matches. It knows only the benchmark's three tables: it is the baseline
// that cachewarden is compared with, not a general consumer.
func PlanNaive(value []byte) (op NaiveOp, ok bool, err error) {
	var msg map[string]any
	if err := json.Unmarshal(value, &msg); err != nil {
		return NaiveOp{}, false, fmt.Errorf("bench: decode event: %w", err)
	}
	source, _ := msg["source"].(map[string]any)
	before, _ := msg["before"].(map[string]any)
	after, _ := msg["after"].(map[string]any)
	opCode, _ := msg["op"].(string)
	if source["db"] != "bench" {
		return NaiveOp{}, false, nil
	}
	switch source["table"] {
	case "users":
		row := after
		if row == nil {
			row = before
		}
		id, err := column(row, "id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		return NaiveOp{Kind: NaiveBump, Key: KeyPrefix + "ns:user:" + id}, true, nil
	case "user_interests":
		row, sign := after, "+"
		if opCode == "d" {
			row, sign = before, "-"
		}
		if row == nil || !isOne(row["active"]) {
			return NaiveOp{}, false, nil
		}
		user, err := column(row, "user_id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		member, err := column(row, "interest_id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		return NaiveOp{Kind: NaiveAppend, Key: KeyPrefix + "interests:" + user, Token: sign + member + " "}, true, nil
	case "comments":
		row, kind := after, NaiveIncr
		if opCode == "d" {
			row, kind = before, NaiveDecr
		}
		if row == nil || !isOne(row["approved"]) {
			return NaiveOp{}, false, nil
		}
		post, err := column(row, "post_id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		return NaiveOp{Kind: kind, Key: KeyPrefix + "comments:" + post}, true, nil
	}
	return NaiveOp{}, false, nil
}

// column renders a numeric column of a decoded row as decimal digits.
func column(row map[string]any, name string) (string, error) {
	f, ok := row[name].(float64)
	if !ok {
		return "", fmt.Errorf("bench: event: column %q missing or not a number", name)
	}
	return strconv.FormatFloat(f, 'f', -1, 64), nil
}

func isOne(v any) bool {
	f, ok := v.(float64)
	return ok && f == 1
}

// Apply runs op against mc with one memcached command (two for a bump of
// a missing namespace: incr, then add).
func (op NaiveOp) Apply(mc *memcache.Client) error {
	var err error
	switch op.Kind {
	case NaiveBump:
		_, err = mc.Increment(op.Key, 1)
		if errors.Is(err, memcache.ErrCacheMiss) {
			err = mc.Add(&memcache.Item{Key: op.Key, Value: strconv.AppendInt(nil, time.Now().UnixMilli(), 10)})
			if errors.Is(err, memcache.ErrNotStored) {
				_, err = mc.Increment(op.Key, 1) // lost a race with another writer
			}
		}
	case NaiveAppend:
		err = mc.Append(&memcache.Item{Key: op.Key, Value: []byte(op.Token)})
		if errors.Is(err, memcache.ErrNotStored) {
			err = nil // a missing set stays missing
		}
	case NaiveIncr:
		_, err = mc.Increment(op.Key, 1)
	case NaiveDecr:
		_, err = mc.Decrement(op.Key, 1)
	default:
		return fmt.Errorf("bench: unknown naive op %q", op.Kind)
	}
	if errors.Is(err, memcache.ErrCacheMiss) {
		err = nil // a missing counter stays missing
	}
	if err != nil {
		return fmt.Errorf("bench: %s %q: %w", op.Kind, op.Key, err)
	}
	return nil
}

// BaselineConfig configures RunBaseline.
type BaselineConfig struct {
	Brokers   []string
	Topic     string
	Group     string
	Memcached string
	Log       *slog.Logger
}

// RunBaseline is the naive consumer: a kafka-go group Reader, one
// gomemcache command per event and a synchronous offset commit after every
// message. It runs until ctx ends (the harness stops it once the group's
// committed offsets reach the end of the topic) and returns nil then.
func RunBaseline(ctx context.Context, cfg BaselineConfig) error {
	// kafka-go's defaults otherwise: CommitInterval 0 makes
	// CommitMessages synchronous.
	r, mc := baselineClients(cfg.Brokers, cfg.Topic, cfg.Group, cfg.Memcached, 0)
	defer r.Close()
	defer mc.Close()
	for {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("bench: baseline fetch: %w", err)
		}
		op, ok, err := PlanNaive(m.Value)
		if err != nil {
			cfg.Log.Warn("baseline: skipping event", "offset", m.Offset, "error", err.Error())
		} else if ok {
			// A few tries, then log and move on: the naive way.
			for try := 1; ; try++ {
				if err = op.Apply(mc); err == nil || ctx.Err() != nil {
					break
				}
				if try == 3 {
					cfg.Log.Warn("baseline: giving up on event", "offset", m.Offset, "error", err.Error())
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("bench: baseline commit: %w", err)
		}
	}
}

// baselineClients returns the baselines' clients: a kafka-go group Reader
// of topic from its first offset, otherwise with kafka-go's defaults, and
// a gomemcache client keeping idle connections (0: gomemcache's default).
func baselineClients(brokers []string, topic, group, memcached string, idle int) (*kafka.Reader, *memcache.Client) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:     brokers,
		GroupID:     group,
		Topic:       topic,
		StartOffset: kafka.FirstOffset,
	})
	mc := memcache.New(memcached)
	if idle > 0 {
		mc.MaxIdleConns = idle
	}
	return r, mc
}
