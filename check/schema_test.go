package check

import (
	"context"
	"database/sql"
	"testing"

	"github.com/cachewarden/cachewarden/integration"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// exampleDB creates a fresh database holding the example schema (the
// tables the demo creates for configs/rules) and returns it and its DSN.
func exampleDB(t *testing.T) (*sql.DB, string) {
	t.Helper()
	db, dsn := testsvc.MySQL(t)
	if err := integration.NewSchema("", "").Create(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db, dsn
}

func TestExampleRulesPass(t *testing.T) {
	_, dsn := exampleDB(t)
	rep, err := Run(context.Background(), Options{Config: "../configs/cachewarden.yaml", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		t.Errorf("%s", f)
	}
}
