package check

import (
	"context"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// collationTable is the table of testdata/collation's rules.
const collationTable = `CREATE TABLE tags (
	id BIGINT PRIMARY KEY,
	user_id BIGINT NOT NULL,
	tag VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL,
	exact VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL,
	padded VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
	latin VARCHAR(32) CHARACTER SET latin1 COLLATE latin1_swedish_ci NOT NULL,
	strict_tag VARCHAR(32) CHARACTER SET utf8mb4 COLLATE utf8mb4_uca1400_nopad_as_cs NOT NULL,
	active TINYINT(1) NOT NULL,
	KEY (tag), KEY (exact), KEY (user_id)
)`

// TestCollations checks rules whose key, member and args columns have
// folding and exact collations against the real server: each folding
// comparison is an error at the field that names the column, with the
// fix; exact comparisons (a column's collation, the query's COLLATE, a
// CAST AS BINARY) and accepted folding are not reported.
func TestCollations(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	if _, err := db.Exec(collationTable); err != nil {
		t.Fatal(err)
	}
	var padded bool
	if err := db.QueryRow("SELECT _utf8mb4'a' = _utf8mb4'a ' COLLATE utf8mb4_bin").Scan(&padded); err != nil {
		t.Fatal(err)
	}
	if !padded {
		t.Skip("this server's utf8mb4_bin is NO PAD; the fixture expects MariaDB's PAD SPACE")
	}
	rep, err := Run(context.Background(), Options{Config: "testdata/collation/cachewarden.yaml", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	const f = "testdata/collation/rules/collation.yaml"
	want := []struct {
		at    string
		words []string
		not   []string
	}{
		{f + ":10:12", []string{`rule "tag-members"`, `key placeholder {tag}`, `column tags.tag has collation utf8mb4_general_ci`,
			`case ('a' = 'A'), accents ('e' = 'é') and trailing spaces ('a' = 'a ', PAD SPACE):`, `a change of a row holding "t1" moves only the key built from "t1"`,
			`in load, compare tag = ? COLLATE utf8mb4_nopad_bin`, `ALTER TABLE tags MODIFY tag varchar(32) COLLATE utf8mb4_nopad_bin`, "`collation: accept-folding`"}, nil},
		{f + ":18:12", []string{`rule "tag-bin"`, `load compares tag under COLLATE utf8mb4_bin`, `trailing spaces ('a' = 'a ', PAD SPACE)`, `"a" and "a "`}, []string{`case`}},
		{f + ":29:13", []string{`rule "tag-keys-fold"`, `keys: its DISTINCT`, `tag under collation utf8mb4_general_ci`, `never checks`, `select tag COLLATE utf8mb4_nopad_bin`}, nil},
		{f + ":51:11", []string{`rule "padded-column"`, `column tags.padded has collation utf8mb4_bin`, `differ in trailing spaces`, `bumps only the namespace`}, []string{`case`, `in load`}},
		{f + ":62:11", []string{`rule "tag-ns"`, `key placeholder {tag}`, `bumps only the namespace`}, []string{`in load`}},
		{f + ":70:13", []string{`rule "user-tag-count"`, `args entry "latin"`, `latin1_swedish_ci`, `in recount, compare latin = ? COLLATE latin1_nopad_bin`, `recount bound to "t1" also finds the rows holding "T1"`}, nil},
		{f + ":77:15", []string{`rule "user-tags"`, `member placeholder {tag}`, `misses the member "t1"`}, []string{`in load`}},
		{f + ":91:11", []string{`rule "strict-column"`, `utf8mb4_uca1400_nopad_as_cs`, `differ in composition ('é' = 'e' + U+0301):`,
			`"caf\u00e9" and "cafe\u0301"`, `COLLATE utf8mb4_nopad_bin`}, []string{`case`, `trailing`, `ß`}},
		{f + ":100:13", []string{`rule "tag-keys-bin"`, `keys: its DISTINCT, GROUP BY or UNION compares tag under COLLATE utf8mb4_bin, which folds trailing spaces`}, []string{`case`}},
	}
	for i, w := range want {
		if i >= len(rep.Findings) {
			t.Errorf("no finding %d, want one at %s", i+1, w.at)
			continue
		}
		line := rep.Findings[i].String()
		if !strings.HasPrefix(line, w.at+": error: ") {
			t.Errorf("finding %d = %s\nwant an error at %s", i+1, line, w.at)
		}
		for _, word := range w.words {
			if !strings.Contains(line, word) {
				t.Errorf("finding %d = %s\nwant it to mention %q", i+1, line, word)
			}
		}
		for _, word := range w.not {
			if strings.Contains(line, word) {
				t.Errorf("finding %d = %s\nwant it not to mention %q", i+1, line, word)
			}
		}
	}
	if len(rep.Findings) != len(want) {
		for _, f := range rep.Findings {
			t.Log(f)
		}
		t.Errorf("%d findings, want %d", len(rep.Findings), len(want))
	}
}

// BenchmarkFolding measures what run's check of the collations adds to
// its start: check.Folding over the example rules against the example
// schema on the test server, a connection, the tables' columns and the
// comparisons included.
func BenchmarkFolding(b *testing.B) {
	_, dsn := exampleDB(b)
	b.Setenv("CACHEWARDEN_MYSQL_DSN", dsn)
	cfg, err := config.Load("../configs/cachewarden.yaml")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		fs, err := Folding(context.Background(), dsn, cfg.RuleSet, nil)
		if err != nil || len(fs) != 0 {
			b.Fatalf("findings %v, err %v", fs, err)
		}
	}
}
