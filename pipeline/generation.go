package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// GenerationReader reads the current generations of tables
// (docs/formats.md, "Generations").
type GenerationReader interface {
	// Generations returns the generation at each of keys (generation
	// item keys, rules.GenerationKey), creating those that are missing
	// and replacing those that hold no generation. An error is a
	// memcached failure.
	Generations(ctx context.Context, keys []string) (map[string]uint64, error)
}

// generationAttempts bounds the reads of one missing generation whose
// add keeps losing to another writer while the winner's item keeps
// vanishing.
const generationAttempts = 3

// memcacheGenerations is the GenerationReader over a gomemcache client.
// It is safe for concurrent use.
type memcacheGenerations struct{ mc *memcache.Client }

// MemcacheGenerations returns the GenerationReader that reads through mc.
func MemcacheGenerations(mc *memcache.Client) GenerationReader { return memcacheGenerations{mc: mc} }

// Generations implements GenerationReader: one get of every key, then an
// add (a lost race reads the winner's) per missing key.
func (g memcacheGenerations) Generations(ctx context.Context, keys []string) (map[string]uint64, error) {
	items, err := g.mc.GetMulti(keys)
	if err != nil {
		return nil, fmt.Errorf("read generations: %w", err)
	}
	out := make(map[string]uint64, len(keys))
	for _, k := range keys {
		if it := items[k]; it != nil {
			if v, ok := itemformat.ParseGeneration(it.Value); ok {
				out[k] = v
				continue
			}
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		v, err := g.create(k, items[k] != nil)
		if err != nil {
			return nil, err
		}
		out[k] = v
	}
	return out, nil
}

// create makes the generation at key: add of a new generation when it is
// missing (a lost race reads the winner's), set over an item that holds
// no generation (a new generation invalidates everything either way).
func (g memcacheGenerations) create(key string, replace bool) (uint64, error) {
	for range generationAttempts {
		v := itemformat.NewGeneration(time.Now())
		it := &memcache.Item{Key: key, Value: strconv.AppendUint(nil, v, 10)}
		if replace {
			if err := g.mc.Set(it); err != nil {
				return 0, fmt.Errorf("replace generation %q: %w", key, err)
			}
			return v, nil
		}
		err := g.mc.Add(it)
		if err == nil {
			return v, nil
		}
		if !errors.Is(err, memcache.ErrNotStored) {
			return 0, fmt.Errorf("create generation %q: %w", key, err)
		}
		won, err := g.mc.Get(key)
		switch {
		case err == nil:
			if v, ok := itemformat.ParseGeneration(won.Value); ok {
				return v, nil
			}
			replace = true
		case !errors.Is(err, memcache.ErrCacheMiss):
			return 0, fmt.Errorf("read generation %q: %w", key, err)
		}
	}
	return 0, fmt.Errorf("generation %q: evicted %d times in a row", key, generationAttempts)
}

// stampCounters moves the counter ops among ops (count and recount ops of
// rules with a generation) to their key under their table's current
// generation (itemformat.CounterKey), read from memcached once for the
// whole slice, before any of them is checked against its fence or
// applied: so deltas go only to a counter of the current generation, and
// one of an earlier generation (which may lack a lost change) is never
// changed or read again. While memcached cannot be read the partition
// waits, retrying with backoff; it returns only ctx's error.
func (p *Pipeline) stampCounters(ctx context.Context, ops []rules.Op) error {
	if p.cfg.Generations == nil {
		return nil
	}
	var keys []string
	for i := range ops {
		op := &ops[i]
		if (op.Kind == rules.OpCount || op.Kind == rules.OpRecount) && op.Rule != nil && op.Rule.Generation != "" {
			if !slices.Contains(keys, op.Rule.Generation) {
				keys = append(keys, op.Rule.Generation)
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	var gens map[string]uint64
	if err := p.retryUntil(ctx, "cannot read the generations of the batch's counters; retrying, the partition waits", func() (err error) {
		gens, err = p.cfg.Generations.Generations(ctx, keys)
		return err
	}, "tables", len(keys)); err != nil {
		return err
	}
	for i := range ops {
		op := &ops[i]
		if (op.Kind == rules.OpCount || op.Kind == rules.OpRecount) && op.Rule != nil && op.Rule.Generation != "" {
			op.Key = itemformat.CounterKey(op.Key, gens[op.Rule.Generation])
		}
	}
	return nil
}
