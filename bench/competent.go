package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/segmentio/kafka-go"
)

// DefaultCompetentWorkers is how many goroutines the competent baseline
// issues memcached commands from.
const DefaultCompetentWorkers = 48

// competentCommitEvery is how often the competent baseline commits.
const competentCommitEvery = time.Second

// competentIdle is how long the competent baseline's topic must be quiet
// before it commits what is applied without waiting for the next second.
const competentIdle = 100 * time.Millisecond

// competentEnvelope is the part of a Debezium change event the competent
// baseline reads: typed, so that encoding/json skips everything else.
type competentEnvelope struct {
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
	Op     string          `json:"op"`
	Source struct {
		DB    string `json:"db"`
		Table string `json:"table"`
	} `json:"source"`
}

// competentRow holds the columns of the benchmark's three tables that its
// rules read.
type competentRow struct {
	ID         *json.Number `json:"id"`
	UserID     *json.Number `json:"user_id"`
	InterestID *json.Number `json:"interest_id"`
	PostID     *json.Number `json:"post_id"`
	Active     *json.Number `json:"active"`
	Approved   *json.Number `json:"approved"`
}

// PlanCompetent is the competent baseline's decoding: encoding/json into
// typed structs that name only the fields the benchmark's rules read. It
// returns the same operation as PlanNaive (TestBaselinesMatchPlanner).
func PlanCompetent(value []byte) (op NaiveOp, ok bool, err error) {
	var env competentEnvelope
	if err := json.Unmarshal(value, &env); err != nil {
		return NaiveOp{}, false, fmt.Errorf("bench: decode event: %w", err)
	}
	if env.Source.DB != "bench" {
		return NaiveOp{}, false, nil
	}
	image := env.After
	if env.Op == "d" || isJSONNull(image) {
		image = env.Before
	}
	if isJSONNull(image) {
		return NaiveOp{}, false, nil
	}
	var row competentRow
	if err := json.Unmarshal(image, &row); err != nil {
		return NaiveOp{}, false, fmt.Errorf("bench: decode row: %w", err)
	}
	switch env.Source.Table {
	case "users":
		id, err := number(row.ID, "id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		return NaiveOp{Kind: NaiveBump, Key: KeyPrefix + "ns:user:" + id}, true, nil
	case "user_interests":
		if !numberIsOne(row.Active) {
			return NaiveOp{}, false, nil
		}
		user, err := number(row.UserID, "user_id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		member, err := number(row.InterestID, "interest_id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		sign := "+"
		if env.Op == "d" {
			sign = "-"
		}
		return NaiveOp{Kind: NaiveAppend, Key: KeyPrefix + "interests:" + user, Token: sign + member + " "}, true, nil
	case "comments":
		if !numberIsOne(row.Approved) {
			return NaiveOp{}, false, nil
		}
		post, err := number(row.PostID, "post_id")
		if err != nil {
			return NaiveOp{}, false, err
		}
		kind := NaiveIncr
		if env.Op == "d" {
			kind = NaiveDecr
		}
		return NaiveOp{Kind: kind, Key: KeyPrefix + "comments:" + post}, true, nil
	}
	return NaiveOp{}, false, nil
}

func isJSONNull(b json.RawMessage) bool { return len(b) == 0 || string(b) == "null" }

func number(n *json.Number, name string) (string, error) {
	if n == nil {
		return "", fmt.Errorf("bench: event: column %q missing", name)
	}
	if _, err := strconv.ParseInt(string(*n), 10, 64); err != nil {
		return "", fmt.Errorf("bench: event: column %q: %w", name, err)
	}
	return string(*n), nil
}

func numberIsOne(n *json.Number) bool { return n != nil && *n == "1" }

// CompetentConfig configures RunCompetent.
type CompetentConfig struct {
	Brokers   []string
	Topic     string
	Group     string
	Memcached string
	// Workers is the number of goroutines issuing memcached commands;
	// default DefaultCompetentWorkers.
	Workers int
	Log     *slog.Logger
}

// competentMsg is one fetched message on its way through a worker.
type competentMsg struct {
	msg  kafka.Message
	op   NaiveOp
	has  bool
	done atomic.Bool
}

// competentTracker keeps, per partition, the fetched messages in offset
// order, so that only offsets whose messages (and every earlier one) are
// applied get committed.
type competentTracker struct {
	mu      sync.Mutex
	pending map[int][]*competentMsg
	// lastFetch is when the fetch loop last received a message.
	lastFetch time.Time
}

func (t *competentTracker) add(m *competentMsg) {
	t.mu.Lock()
	t.pending[m.msg.Partition] = append(t.pending[m.msg.Partition], m)
	t.lastFetch = time.Now()
	t.mu.Unlock()
}

// applied removes the applied prefix of every partition's messages and
// returns the last message of each prefix.
func (t *competentTracker) applied() []kafka.Message {
	t.mu.Lock()
	defer t.mu.Unlock()
	var last []kafka.Message
	for p, msgs := range t.pending {
		n := 0
		for n < len(msgs) && msgs[n].done.Load() {
			n++
		}
		if n > 0 {
			last = append(last, msgs[n-1].msg)
			clear(msgs[:n])
			t.pending[p] = msgs[n:]
		}
	}
	return last
}

// quiet reports whether the fetch loop has received nothing for
// competentIdle while messages wait to be committed, every one applied.
func (t *competentTracker) quiet() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.lastFetch) < competentIdle {
		return false
	}
	n := 0
	for _, msgs := range t.pending {
		for _, m := range msgs {
			if !m.done.Load() {
				return false
			}
			n++
		}
	}
	return n > 0
}

// RunCompetent is the consumer an experienced engineer writes in a day
// with kafka-go and gomemcache: a kafka-go group Reader; encoding/json
// into typed structs; Workers goroutines issuing one gomemcache command
// per event, each event going to the worker its memcached key hashes to,
// so that changes of one key are applied in order; offsets committed
// every second (and when the topic has been quiet for 100 ms), up to the
// last message of each partition that is applied with every message
// before it. It runs until ctx ends and returns nil then.
func RunCompetent(ctx context.Context, cfg CompetentConfig) error {
	if cfg.Workers <= 0 {
		cfg.Workers = DefaultCompetentWorkers
	}
	r, mc := baselineClients(cfg.Brokers, cfg.Topic, cfg.Group, cfg.Memcached, cfg.Workers)
	defer r.Close()
	defer mc.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tracker := &competentTracker{pending: map[int][]*competentMsg{}}
	queues := make([]chan *competentMsg, cfg.Workers)
	var wg sync.WaitGroup
	for i := range queues {
		queues[i] = make(chan *competentMsg, 256)
		q := queues[i]
		wg.Go(func() {
			for m := range q {
				competentApply(ctx, mc, m, cfg.Log)
				m.done.Store(true)
			}
		})
	}
	defer func() {
		for _, q := range queues {
			close(q)
		}
		wg.Wait()
	}()

	commitErr := make(chan error, 1)
	go func() {
		tick := time.NewTicker(competentIdle)
		defer tick.Stop()
		lastCommit := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if time.Since(lastCommit) < competentCommitEvery && !tracker.quiet() {
				continue
			}
			last := tracker.applied()
			lastCommit = time.Now()
			if len(last) == 0 {
				continue
			}
			if err := r.CommitMessages(ctx, last...); err != nil && ctx.Err() == nil {
				commitErr <- fmt.Errorf("bench: competent commit: %w", err)
				cancel()
				return
			}
		}
	}()

	seed := maphash.MakeSeed()
	for {
		msg, err := r.FetchMessage(ctx)
		if err != nil {
			select {
			case err := <-commitErr:
				return err
			default:
			}
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("bench: competent fetch: %w", err)
		}
		m := &competentMsg{msg: msg}
		m.op, m.has, err = PlanCompetent(msg.Value)
		if err != nil {
			cfg.Log.Warn("competent: skipping event", "offset", msg.Offset, "error", err.Error())
		}
		tracker.add(m)
		if !m.has {
			m.done.Store(true)
			continue
		}
		w := maphash.String(seed, m.op.Key) % uint64(len(queues))
		select {
		case queues[w] <- m:
		case <-ctx.Done():
			return nil
		}
	}
}

// competentApply applies m's op, retrying a few times as the naive
// baseline does.
func competentApply(ctx context.Context, mc *memcache.Client, m *competentMsg, log *slog.Logger) {
	for try := 1; ; try++ {
		err := m.op.Apply(mc)
		if err == nil || ctx.Err() != nil {
			return
		}
		if try == 3 {
			log.Warn("competent: giving up on event", "offset", m.msg.Offset, "error", err.Error())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
