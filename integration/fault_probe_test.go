package integration

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

func TestFaultProbeRate(t *testing.T) {
	db, _ := testsvc.MySQLBinlog(t)
	ctx := context.Background()
	schema := NewSchema("", "")
	if err := schema.Create(ctx, db); err != nil {
		t.Fatal(err)
	}
	w, err := NewWorkload(ctx, db, schema, WorkloadOptions{KeyMoves: true, Users: 200, Posts: 400, Products: 200}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if _, err := w.Initial(ctx); err != nil {
		t.Fatal(err)
	}
	t.Logf("initial %v", time.Since(start))
	start = time.Now()
	n, changes := 0, 0
	for n < 2000 {
		txs, err := w.Round(ctx, 500)
		if err != nil {
			t.Fatal(err)
		}
		n += len(txs)
		for _, tx := range txs {
			changes += len(tx.Changes)
		}
		t.Logf("round %d txs", len(txs))
	}
	d := time.Since(start)
	t.Logf("%d txs %d changes in %v: %.0f changes/s", n, changes, d, float64(changes)/d.Seconds())
}
