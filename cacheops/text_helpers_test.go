package cacheops

import (
	"context"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/cachewarden/cachewarden/internal/metaproto"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules"
)

// The text Applier's single requests, for tests that act between its steps:
// they drive the Applier's own steps over the text transport.

// gets reads key as the Applier's inspect step does.
func (w *Applier) gets(key string) (*memcache.Item, error) {
	var rep metaproto.Reply
	w.tr.(*textTransport).do(context.Background(), &metaproto.Cmd{Verb: metaproto.VerbGet, Key: key}, &rep)
	switch rep.Status {
	case metaproto.VA:
		return &memcache.Item{Key: key, Value: rep.Value, Flags: rep.Flags, CasID: rep.CAS}, nil
	case metaproto.EN:
		return nil, memcache.ErrCacheMiss
	}
	return nil, metaproto.ReplyError(&rep)
}

// compactItem rewrites the set it (as gets returned it) compactly when the
// dropped tokens make up at least ratio of them (0: whenever it shrinks),
// with the Applier's compaction step: compacted is false when the set was
// clean or changed since the gets.
func (w *Applier) compactItem(op *rules.Op, it *memcache.Item, ratio float64) (compacted bool, err error) {
	data, ok := compaction(it.Value, ratio)
	if !ok {
		return false, nil
	}
	p := &opState{op: op, step: stepCompactCAS, data: string(data), cas: it.CasID, flags: it.Flags, outcome: OutcomeAppended}
	w.round(context.Background(), &applyScratch{}, []*opState{p})
	if p.step == stepDone {
		return false, p.result.Err
	}
	return p.outcome == OutcomeCompacted, nil
}

// expiration is the exptime the Applier stores for ttl.
func (w *Applier) expiration(ttl time.Duration) int32 {
	return itemformat.Expiration(ttl, w.cfg.Now())
}
