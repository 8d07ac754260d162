package check

import (
	"cmp"
	"context"
	"database/sql"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/cachewarden/cachewarden/integration"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// exampleDB creates a fresh database holding the example schema (the
// tables the demo creates for configs/rules) and returns it and its DSN.
func exampleDB(t testing.TB) (*sql.DB, string) {
	t.Helper()
	db, dsn := testsvc.MySQL(t)
	if err := integration.NewSchema("", "").Create(context.Background(), db); err != nil {
		t.Fatal(err)
	}
	return db, dsn
}

// wantFinding is a finding expected at "file:line:col" with a severity
// (Error when ""), its message holding each of words.
type wantFinding struct {
	at    string
	sev   Severity
	words []string
}

// expectFindings compares got with want, one by one.
func expectFindings(t *testing.T, got []Finding, want []wantFinding) {
	t.Helper()
	if len(got) != len(want) {
		for _, f := range got {
			t.Log(f)
		}
		t.Fatalf("%d findings, want %d", len(got), len(want))
	}
	for i, w := range want {
		line := got[i].String()
		if !strings.HasPrefix(line, w.at+": "+string(cmp.Or(w.sev, Error))+": ") {
			t.Errorf("finding %d = %s\nwant it at %s, %s", i+1, line, w.at, cmp.Or(w.sev, Error))
		}
		for _, word := range w.words {
			if !strings.Contains(line, word) {
				t.Errorf("finding %d = %s\nwant it to mention %q", i+1, line, word)
			}
		}
	}
}

// TestExampleRulesPass checks the example config and rules against the
// schema the demo creates: no finding at all.
func TestExampleRulesPass(t *testing.T) {
	_, dsn := exampleDB(t)
	rep, err := Run(context.Background(), Options{Config: "../configs/cachewarden.yaml", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range rep.Findings {
		t.Errorf("%s", f)
	}
	if rep.Rules != 7 || rep.RuleFiles != 2 || rep.TestFiles != 4 || rep.TestsPassed == 0 || rep.TestsFailed != 0 {
		t.Errorf("counts: %+v", rep)
	}
	if len(rep.Schemas) != 1 {
		t.Errorf("schemas checked: %v, want the DSN's database", rep.Schemas)
	}
	if rep.Failed(true) {
		t.Error("the example rules fail the check")
	}
}

// TestMistakesReported checks rules with one schema mistake each against
// the example schema: each is reported at its place.
func TestMistakesReported(t *testing.T) {
	_, dsn := exampleDB(t)
	rep, err := Run(context.Background(), Options{Config: "testdata/mistakes/cachewarden.yaml", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	const f = "testdata/mistakes/rules/mistakes.yaml"
	expectFindings(t, rep.Findings, []wantFinding{
		// the key's {idd}, inside the quoted template
		{f + ":9:11", Error, []string{`rule "user"`, `key placeholder {idd}`, `no column "idd"`, `did you mean "id"`}},
		// actve, inside the when expression
		{f + ":14:12", Error, []string{`rule "user-interests"`, `when identifier actve`, `did you mean "active"`}},
		// post_idd, inside the recount query
		{f + ":27:53", Error, []string{`rule "post-comments"`, `recount does not prepare`, `post_idd`, `did you mean "post_id"`, `1054`}},
		{f + ":31:12", Error, []string{`rule "order"`, `table shop.orders not found`, `no table "orders"`}},
		{f + ":39:16", Warning, []string{`rule "author-comments"`, `recount reads the whole table comments`, `type ALL`, `index on comments (author_id)`}},
		{f + ":45:11", Warning, []string{`rule "post-by-title"`, `can render 818 bytes`, `varchar(200) up to 800`, `SHA-256`}},
		{f + ":45:11", Error, []string{`rule "post-by-title"`, `key placeholder {title}`, `collation utf8mb4_general_ci`, `case ('a' = 'A')`, `trailing spaces`,
			`bumps only the namespace`, `COLLATE utf8mb4_`, `collation: accept-folding`}},
		{f + ":52:16", Error, []string{`rule "approved-comments"`, `takes 2 parameter(s) on the server`, `1 column(s)`}},
		{f + ":57:11", Warning, []string{`rule "product-price"`, `{price}`, `decimal(10,2)`}},
		{f + ":62:11", Error, []string{`rule "by-status"`, `key placeholder {status}`, `collation utf8mb4_general_ci`}},
		{f + ":63:15", Warning, []string{`rule "by-status"`, `renders the evidence master's key "ns:status:master"`, `varchar(20) status "master"`}},
	})
	if rep.Errors != 7 || rep.Warnings != 4 || !rep.Failed(false) {
		t.Errorf("%d errors, %d warnings, failed %v", rep.Errors, rep.Warnings, rep.Failed(false))
	}
}

// TestDatabaseMap looks a rule's database up in the schema it is mapped
// to, even when a database of its own name exists elsewhere.
func TestDatabaseMap(t *testing.T) {
	db, dsn := exampleDB(t)
	var name string
	if err := db.QueryRow("SELECT DATABASE()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	// mysql exists on every server and has no users table with an id.
	for _, tc := range []struct {
		dbs  map[string]string
		fail bool
	}{
		{dbs: map[string]string{"shop": "mysql", "blog": name}, fail: true},
		{dbs: map[string]string{"shop": name, "blog": name}},
	} {
		rep, err := Run(context.Background(), Options{Config: "../configs/cachewarden.yaml", DSN: dsn, Databases: tc.dbs})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Failed(false) != tc.fail {
			t.Errorf("databases %v: failed %v, want %v; findings: %v", tc.dbs, rep.Failed(false), tc.fail, rep.Findings)
		}
	}
}

// TestUnreachableDatabase reports a database that does not answer as an
// error, after the checks that need none.
func TestUnreachableDatabase(t *testing.T) {
	rep, err := Run(context.Background(), Options{Config: "../configs/cachewarden.yaml",
		DSN: "cachewarden:secret@tcp(127.0.0.1:1)/app?timeout=2s"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Errors != 1 || len(rep.Findings) != 1 || rep.TestFiles != 4 {
		t.Fatalf("findings %v, counts %+v", rep.Findings, rep)
	}
	msg := rep.Findings[0].String()
	if !strings.Contains(msg, "127.0.0.1:1") || strings.Contains(msg, "secret") {
		t.Errorf("message %q: want the address, never the password", msg)
	}
}

// TestConfigDSN checks against the config's mysql.dsn, here taken from
// the environment as the example config does.
func TestConfigDSN(t *testing.T) {
	_, dsn := exampleDB(t)
	t.Setenv("CACHEWARDEN_MYSQL_DSN", dsn)
	rep, err := Run(context.Background(), Options{Config: "../configs/cachewarden.yaml", ConfigDSN: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Server == "" || len(rep.Schemas) != 1 || len(rep.Findings) != 0 {
		t.Errorf("report %+v", rep)
	}
}

// listen serves each connection to a local address with serve, until the
// test ends; it returns the address.
func listen(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go serve(c)
		}
	}()
	return ln.Addr().String()
}

// TestNotAMySQLServer points the check at addresses that are not MySQL
// servers: memcached (which waits for the client to speak), a server
// that accepts and never answers, and one that answers something else.
// Each is reported within DefaultConnectTimeout with its address and the
// likely cause, not as the whole check's deadline.
func TestNotAMySQLServer(t *testing.T) {
	silent := listen(t, func(net.Conn) {})
	ssh := listen(t, func(c net.Conn) { c.Write([]byte("SSH-2.0-OpenSSH_9.2\r\n")) })
	for _, tc := range []struct {
		name, addr string
		words      []string
	}{
		{"memcached", testsvc.Memcached(t), []string{"is this a MySQL server? got no MySQL handshake from", "within 5s", "memcached"}},
		{"silent", silent, []string{"is this a MySQL server? got no MySQL handshake from", "within 5s", "readTimeout="}},
		{"ssh", ssh, []string{"is this a MySQL server? the handshake with", "failed after 21 bytes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep, err := Run(context.Background(), Options{Config: "../configs/cachewarden.yaml", DSN: "cw:secret@tcp(" + tc.addr + ")/app"})
			if err != nil {
				t.Fatal(err)
			}
			if rep.Errors != 1 || len(rep.Findings) != 1 {
				t.Fatalf("findings %v", rep.Findings)
			}
			msg := rep.Findings[0].String()
			for _, w := range append(tc.words, tc.addr) {
				if !strings.Contains(msg, w) {
					t.Errorf("%s\nwant it to mention %q", msg, w)
				}
			}
			if strings.Contains(msg, "secret") || strings.Contains(msg, "deadline") {
				t.Errorf("%s\nwants no password and no deadline", msg)
			}
		})
	}
}

// TestMariaDBJSON: MariaDB's JSON type is a LONGTEXT with a CHECK
// (json_valid(col)); such columns get the findings of JSON columns, a
// plain LONGTEXT does not.
func TestMariaDBJSON(t *testing.T) {
	db, dsn := testsvc.MySQL(t)
	if _, err := db.Exec("CREATE TABLE documents (id INT PRIMARY KEY, body JSON, meta LONGTEXT, note LONGTEXT, " +
		"CONSTRAINT meta_json CHECK (json_valid(meta) AND id > 0))"); err != nil {
		t.Fatal(err)
	}
	var version string
	if err := db.QueryRow("SELECT VERSION()").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Skipf("%s: JSON is a type of its own", version)
	}
	rep, err := Run(context.Background(), Options{Config: "testdata/json/cachewarden.yaml", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	var got []Finding
	for _, fd := range rep.Findings {
		if !strings.Contains(fd.Message, "SHA-256") { // long keys are not the point here
			got = append(got, fd)
		}
	}
	const f = "testdata/json/rules/json.yaml"
	expectFindings(t, got, []wantFinding{
		{f + ":10:15", Error, []string{`rule "doc-bodies"`, `member placeholder {body}`, "longtext (MariaDB's JSON: CHECK (json_valid(body))) cannot be rendered into a key"}},
		{f + ":10:15", Error, []string{`rule "doc-bodies"`, `member placeholder {body}`, `collation utf8mb4_bin`, `MODIFY body longtext COLLATE`}},
		{f + ":15:11", Error, []string{`rule "doc-meta"`, `key placeholder {meta}`, "longtext (MariaDB's JSON: CHECK (json_valid(meta))) cannot be rendered into a key"}},
		{f + ":21:11", Warning, []string{`rule "doc-note"`, `when identifier body`, "longtext (MariaDB's JSON: CHECK (json_valid(body))): when compares the JSON text"}},
	})
}

// TestQueryMeanings checks load, recount and keys queries that prepare
// but do not return what the daemon and verify read of them, and right
// ones that must not be reported (a joined table's column, an IF that
// reads a flag, CONCAT for a member of several columns, args naming a
// column twice), against the example schema.
func TestQueryMeanings(t *testing.T) {
	_, dsn := exampleDB(t)
	rep, err := Run(context.Background(), Options{Config: "testdata/meanings/cachewarden.yaml", DSN: dsn})
	if err != nil {
		t.Fatal(err)
	}
	const f = "testdata/meanings/rules/meanings.yaml"
	expectFindings(t, rep.Findings, []wantFinding{
		{at: f + ":12:13", words: []string{`rule "category-statuses"`, `load selects column id of products as the member, but member "{status}" is column status`}},
		{at: f + ":21:13", words: []string{`rule "interests-two"`, `load returns 2 columns (interest, active)`, `first column alone`}},
		{at: f + ":30:13", words: []string{`rule "product-refs"`, `load selects column id of products alone, but member "p{id}"`}},
		{at: f + ":38:13", words: []string{`rule "product-pairs"`, `load's member CONCAT(category_id, ':') does not read id`}},
		{at: f + ":45:16", words: []string{`rule "comment-ids"`, `recount returns id, not a count`}},
		{at: f + ":52:16", words: []string{`rule "comment-two"`, `recount returns 2 columns (COUNT(*), MAX(id)), not one count`}},
		{at: f + ":59:16", words: []string{`rule "comment-groups"`, `recount has GROUP BY at its top`}},
		{at: f + ":68:13", words: []string{`rule "interests-keys"`, `keys returns 2 column(s) (user_id, interest)`, `in order: 1 (user_id)`}},
		{at: f + ":77:13", words: []string{`rule "comment-keys"`, `keys column 1 is author_id of comments, but placeholder 1 of key "c4:{post_id}" is {post_id}`}},
	})
}
