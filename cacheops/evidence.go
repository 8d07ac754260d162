package cacheops

import (
	"fmt"

	"github.com/cachewarden/cachewarden/rules"
)

// evidenceAttempts bounds the read/compare-and-swap rounds that mark one
// master in one Apply; each lost round means another daemon marked it
// meanwhile.
const evidenceAttempts = 5

// evidenceTarget gathers the bits one Apply sets on one master item.
type evidenceTarget struct {
	rule *rules.Rule
	key  string
	bits []int
	// ops are the indexes of the bumps that set them.
	ops []int
}

// evidenceTargets returns, per master item, the bits of the bumps among
// ops that succeeded and whose rule has evidence, in order of first op.
func evidenceTargets(ops []rules.Op, results []Result) []*evidenceTarget {
	var out []*evidenceTarget
	byKey := map[string]*evidenceTarget{}
	for i := range ops {
		op := &ops[i]
		if op.Kind != rules.OpBump || op.Rule == nil || op.Rule.Evidence == nil || results[i].Err != nil {
			continue
		}
		ev := op.Rule.Evidence
		if op.EvidenceBit < 0 || op.EvidenceBit >= ev.Bits {
			results[i] = failedResult(fmt.Errorf("cacheops: bump %q: evidence bit %d of %d: %w", op.Key, op.EvidenceBit, ev.Bits, ErrInvalidOp))
			continue
		}
		t := byKey[ev.MasterKey]
		if t == nil {
			t = &evidenceTarget{rule: op.Rule, key: ev.MasterKey}
			byKey[ev.MasterKey] = t
			out = append(out, t)
		}
		t.bits = append(t.bits, op.EvidenceBit)
		t.ops = append(t.ops, i)
	}
	return out
}

// fail fails the target's bumps with err: their namespaces were bumped,
// but readers whose bit was clear would not see it; applying them again is
// safe.
func (t *evidenceTarget) fail(results []Result, err error) {
	err = fmt.Errorf("cacheops: mark evidence at %q: %w", t.key, err)
	for _, i := range t.ops {
		results[i] = failedResult(err)
	}
}
