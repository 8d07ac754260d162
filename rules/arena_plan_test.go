package rules_test

import (
	"testing"
	"unsafe"

	"github.com/cachewarden/cachewarden/rules"
)

// TestPlanAllocations: planning an event allocates nothing most of the
// time: the ops' keys, members and args go to shared blocks.
func TestPlanAllocations(t *testing.T) {
	rs, ev := benchSetup(t)
	dst := make([]rules.Op, 0, 16)
	var keys []string
	allocs := testing.AllocsPerRun(2000, func() {
		ops, _, err := rs.Plan(dst[:0], ev)
		if err != nil || len(ops) != 3 {
			t.Fatalf("ops = %d, err = %v", len(ops), err)
		}
		if len(keys) < 3 {
			for _, op := range ops {
				keys = append(keys, op.Key)
			}
		}
	})
	if allocs > 0.1 {
		t.Errorf("%.2f allocations per Plan, want at most 0.1", allocs)
	}
	if keys[0] != "shop:ns:order:9223372036854775807" || keys[1] != "shop:orders:1234567:paid" || keys[2] != "shop:orders:1234567:shipped" {
		t.Errorf("keys of the first plan changed: %q", keys)
	}
}

// TestPlanArgsOwnMemory: an op's Args share no memory with the event's
// rows, so that a kept op does not hold a message's memory.
func TestPlanArgsOwnMemory(t *testing.T) {
	rs, ev := benchSetup(t)
	ops, _, err := rs.Plan(nil, ev)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, op := range ops {
		for _, a := range op.Args {
			n++
			for _, row := range []rules.Row{ev.Before, ev.After} {
				for _, c := range row {
					if c.Value.Text != "" && unsafe.StringData(c.Value.Text) == unsafe.StringData(a.Text) {
						t.Errorf("op %s arg %q shares the memory of column %q", op.Key, a.Text, c.Name)
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no op with args")
	}
}
