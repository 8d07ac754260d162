package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/retry"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// Source positions for readers on replicas (docs/formats.md, "Source
// positions"): before a batch's ops are sent, the newest source position
// of its row changes is merged into the position item of each source
// server, so a reader that sees one of the batch's bumps and reads the
// item afterwards gets a position at or after the change.

// PositionWriter moves position items forward.
type PositionWriter interface {
	// Advance merges pos into the position item of the source server
	// serverID (itemformat.MergePositions), never moving it back.
	// written is false when the item already held a position at or
	// after pos. An error is a memcached failure.
	Advance(ctx context.Context, serverID uint32, pos itemformat.SourcePosition) (written bool, err error)
}

// positionAttempts bounds the cas races of one Advance (other partitions
// of the same source writing the item at the same moment); after each
// lost race it waits a random time up to positionJitter times the
// attempts so far, so racing writers spread out. When they are spent the
// pipeline retries with its backoff.
const (
	positionAttempts = 16
	positionJitter   = 200 * time.Microsecond
)

// memcachePositions is the PositionWriter over a gomemcache client. It is
// safe for concurrent use.
type memcachePositions struct{ mc *memcache.Client }

// MemcachePositions returns the PositionWriter that writes through mc.
func MemcachePositions(mc *memcache.Client) PositionWriter { return memcachePositions{mc: mc} }

// Advance implements PositionWriter: a get with the cas id, then cas of
// the merged position (add when missing), again when another writer
// came first. An item that does not parse is replaced by pos.
func (w memcachePositions) Advance(ctx context.Context, serverID uint32, pos itemformat.SourcePosition) (bool, error) {
	key := itemformat.PositionKey(serverID)
	for attempt := range positionAttempts {
		if attempt > 0 {
			if err := retry.Sleep(ctx, rand.N(time.Duration(attempt)*positionJitter)); err != nil {
				return false, err
			}
		}
		it, err := w.mc.Get(key)
		switch {
		case errors.Is(err, memcache.ErrCacheMiss):
			err = w.mc.Add(&memcache.Item{Key: key, Value: pos.Encode()})
			if errors.Is(err, memcache.ErrNotStored) {
				continue // another writer added it: merge into theirs
			}
			if err != nil {
				return false, fmt.Errorf("add position %q: %w", key, err)
			}
			return true, nil
		case err != nil:
			return false, fmt.Errorf("read position %q: %w", key, err)
		}
		merged := pos
		if stored, derr := itemformat.DecodePosition(it.Value); derr == nil {
			merged = itemformat.MergePositions(stored, pos)
			if merged.Equal(stored) {
				return false, nil
			}
		}
		it.Value = merged.Encode()
		err = w.mc.CompareAndSwap(it)
		if errors.Is(err, memcache.ErrCASConflict) || errors.Is(err, memcache.ErrNotStored) {
			continue
		}
		if err != nil {
			return false, fmt.Errorf("store position %q: %w", key, err)
		}
		return true, nil
	}
	return false, fmt.Errorf("position %q: changed by other writers %d times in a row", key, positionAttempts)
}

// serverPosition is the newest position of a batch's row changes from
// one source server.
type serverPosition struct {
	serverID uint32
	pos      itemformat.SourcePosition
}

// includePosition adds an event's source position to the batch's.
// Events without a server_id, or with neither a GTID nor a binary log
// position, add nothing.
func (b *Batch) includePosition(src rules.Position) {
	if src.ServerID == 0 || (src.GTID == "" && src.BinlogFile == "") {
		return
	}
	for i := range b.positions {
		if b.positions[i].serverID == src.ServerID {
			b.positions[i].pos.Include(src)
			return
		}
	}
	b.positions = append(b.positions, serverPosition{serverID: src.ServerID})
	b.positions[len(b.positions)-1].pos.Include(src)
}

// writePositions advances the position items of the batch's source
// servers before any of its ops is sent; nothing for a batch without
// ops. While memcached cannot be written the partition waits, retrying
// with backoff; it returns only ctx's error.
func (p *Pipeline) writePositions(ctx context.Context, b *Batch) error {
	if p.cfg.Positions == nil || len(b.Ops) == 0 {
		return nil
	}
	if len(b.positions) == 0 {
		p.m.sourcePositions.WithLabelValues("none").Inc()
		return nil
	}
	for i := range b.positions {
		sp := &b.positions[i]
		if !sp.pos.Known() {
			continue
		}
		err := p.retryUntil(ctx, "cannot write the source position before the batch's ops; retrying, the partition waits", func() error {
			written, err := p.cfg.Positions.Advance(ctx, sp.serverID, sp.pos)
			switch {
			case err != nil:
			case written:
				p.m.sourcePositions.WithLabelValues("written").Inc()
			default:
				p.m.sourcePositions.WithLabelValues("current").Inc()
			}
			return err
		}, "server_id", sp.serverID, "position", string(sp.pos.Encode()))
		if err != nil {
			return err
		}
	}
	return nil
}
