package counters

import (
	"bytes"
	"context"
	"database/sql"
	"log/slog"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
	"github.com/cachewarden/cachewarden/rules"
)

func TestBindArgs(t *testing.T) {
	tests := []struct {
		name string
		in   rules.Value
		want any
	}{
		{"small int", rules.Value{Kind: rules.KindInt, Text: "42"}, int64(42)},
		{"negative int", rules.Value{Kind: rules.KindInt, Text: "-7"}, int64(-7)},
		{"min int64", rules.Value{Kind: rules.KindInt, Text: "-9223372036854775808"}, int64(math.MinInt64)},
		{"2^63 is uint64", rules.Value{Kind: rules.KindInt, Text: "9223372036854775808"}, uint64(1 << 63)},
		{"max uint64", rules.Value{Kind: rules.KindInt, Text: "18446744073709551615"}, uint64(math.MaxUint64)},
		{"beyond uint64 stays digits", rules.Value{Kind: rules.KindInt, Text: "18446744073709551616"}, "18446744073709551616"},
		{"below int64 stays digits", rules.Value{Kind: rules.KindInt, Text: "-9223372036854775809"}, "-9223372036854775809"},
		{"float literal", rules.Value{Kind: rules.KindFloat, Text: "0.10000000000000000001"}, "0.10000000000000000001"},
		{"string", rules.Value{Kind: rules.KindString, Text: "it's"}, "it's"},
		{"bool true", rules.Value{Kind: rules.KindBool, Text: "1"}, int64(1)},
		{"bool false", rules.Value{Kind: rules.KindBool, Text: "0"}, int64(0)},
		{"null", rules.Value{}, nil},
		{"json", rules.Value{Kind: rules.KindJSON, Text: `{"a":[1]}`}, `{"a":[1]}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := bindArgs([]rules.Value{tc.in})
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got[0], tc.want) {
				t.Fatalf("bindArgs(%+v) = %#v, want %#v", tc.in, got[0], tc.want)
			}
		})
	}
	for _, bad := range []rules.Value{{Kind: rules.KindBool, Text: "true"}, {Kind: 99, Text: "1"}} {
		if _, err := bindArgs([]rules.Value{bad}); err == nil {
			t.Errorf("bindArgs(%+v) succeeded, want an error", bad)
		}
	}
}

// newCommentsDB creates blog-like tables in a fresh database and returns a
// MySQL over it and the database's DSN.
func newCommentsDB(t *testing.T) (*MySQL, *sql.DB, string) {
	t.Helper()
	db, dsn := testsvc.MySQL(t)
	for _, stmt := range []string{
		`CREATE TABLE comments (id BIGINT UNSIGNED PRIMARY KEY AUTO_INCREMENT, post_id BIGINT UNSIGNED NOT NULL,
			author VARCHAR(200) NOT NULL DEFAULT '', approved TINYINT NOT NULL DEFAULT 1, KEY (post_id))`,
		`CREATE TABLE interests (user_id BIGINT UNSIGNED NOT NULL, interest VARCHAR(100) NULL, score INT NOT NULL DEFAULT 0)`,
	} {
		if _, err := db.Exec(stmt); err != nil {
			t.Fatal(err)
		}
	}
	m := NewMySQL(db, DBConfig{MaxOpenConns: 4}, slog.New(slog.DiscardHandler))
	return m, db, dsn
}

func addComments(t testing.TB, db *sql.DB, postID any, author string, n int) {
	t.Helper()
	for range n {
		if _, err := db.Exec("INSERT INTO comments (post_id, author) VALUES (?, ?)", postID, author); err != nil {
			t.Fatal(err)
		}
	}
}

func intValue(s string) rules.Value    { return rules.Value{Kind: rules.KindInt, Text: s} }
func stringValue(s string) rules.Value { return rules.Value{Kind: rules.KindString, Text: s} }

func TestMySQLCount(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	ctx := context.Background()
	const big = "18446744073709551615" // max BIGINT UNSIGNED: does not fit int64
	addComments(t, db, 9, "ann", 3)
	addComments(t, db, uint64(math.MaxUint64), "bob", 2)
	addComments(t, db, uint64(math.MaxUint64-1), "bob", 5)

	n, err := m.Count(ctx, "SELECT COUNT(*) FROM comments WHERE post_id = ? AND approved = ?",
		[]rules.Value{intValue("9"), {Kind: rules.KindBool, Text: "1"}})
	if err != nil || n != 3 {
		t.Fatalf("Count post 9 = %d, %v; want 3", n, err)
	}
	n, err = m.Count(ctx, "SELECT COUNT(*) FROM comments WHERE post_id = ?", []rules.Value{intValue(big)})
	if err != nil || n != 2 {
		t.Fatalf("Count post 2^64-1 = %d, %v; want 2 (the id must bind exactly)", n, err)
	}
	n, err = m.Count(ctx, "SELECT COUNT(*) FROM comments WHERE post_id = ?", []rules.Value{intValue("18446744073709551614")})
	if err != nil || n != 5 {
		t.Fatalf("Count post 2^64-2 = %d, %v; want 5", n, err)
	}
	// A SUM comes back as DECIMAL text: still an integer.
	n, err = m.Count(ctx, "SELECT COALESCE(SUM(approved), 0) FROM comments WHERE post_id = ?", []rules.Value{intValue("9")})
	if err != nil || n != 3 {
		t.Fatalf("Count SUM = %d, %v; want 3", n, err)
	}

	for _, bad := range []struct{ name, query string }{
		{"two columns", "SELECT COUNT(*), 1 FROM comments WHERE post_id = ?"},
		{"no row", "SELECT id FROM comments WHERE post_id = ? AND 1 = 0"},
		{"many rows", "SELECT 1 FROM comments WHERE post_id = ?"},
		{"null", "SELECT SUM(approved) FROM comments WHERE post_id = ? AND 1 = 0"},
		{"not an integer", "SELECT AVG(approved) / 3 FROM comments WHERE post_id = ?"},
		{"syntax", "SELEC COUNT(*) FROM comments WHERE post_id = ?"},
	} {
		if n, err := m.Count(ctx, bad.query, []rules.Value{intValue("9")}); err == nil {
			t.Errorf("%s: Count = %d, want an error", bad.name, n)
		}
	}
}

func TestMySQLCountBindsHostileString(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	hostile := `o'brien "x" \'; DROP TABLE comments; --`
	addComments(t, db, 1, hostile, 4)
	addComments(t, db, 1, "o", 1)
	n, err := m.Count(context.Background(), "SELECT COUNT(*) FROM comments WHERE author = ?", []rules.Value{stringValue(hostile)})
	if err != nil || n != 4 {
		t.Fatalf("Count = %d, %v; want 4", n, err)
	}
	var total int
	if err := db.QueryRow("SELECT COUNT(*) FROM comments").Scan(&total); err != nil || total != 5 {
		t.Fatalf("comments table after hostile argument: %d rows, %v; want 5", total, err)
	}
}

func TestMySQLLoadMembers(t *testing.T) {
	m, db, _ := newCommentsDB(t)
	for _, r := range []struct {
		user     uint64
		interest any
	}{{7, "go"}, {7, "sql; --"}, {7, nil}, {7, "a b"}, {8, "other"}} {
		if _, err := db.Exec("INSERT INTO interests (user_id, interest, score) VALUES (?, ?, 1)", r.user, r.interest); err != nil {
			t.Fatal(err)
		}
	}
	got, err := m.LoadMembers(context.Background(),
		"SELECT interest, score FROM interests WHERE user_id = ? ORDER BY interest", []rules.Value{intValue("7")})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a b", "go", "sql; --"}; !reflect.DeepEqual(got, want) {
		t.Fatalf("LoadMembers = %q, want %q", got, want)
	}
	got, err = m.LoadMembers(context.Background(), "SELECT user_id FROM interests WHERE user_id = ?", []rules.Value{intValue("99")})
	if err != nil || len(got) != 0 {
		t.Fatalf("LoadMembers of nobody = %q, %v; want none", got, err)
	}
	got, err = m.LoadMembers(context.Background(), "SELECT DISTINCT user_id FROM interests WHERE user_id > ? ORDER BY 1", []rules.Value{intValue("0")})
	if want := []string{"7", "8"}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("LoadMembers of ints = %q, %v; want %q", got, err, want)
	}
}

func TestOpenMySQLNeverLogsPassword(t *testing.T) {
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	const secret = "s3cr3t-Pa55"
	// Port 1 on loopback is closed: queries fail fast.
	m, err := OpenMySQL("app:"+secret+"@tcp(127.0.0.1:1)/shop", DBConfig{QueryTimeout: 2 * time.Second}, logger)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Ping(context.Background()); err == nil {
		t.Fatal("Ping of a closed port succeeded")
	} else if strings.Contains(err.Error(), secret) {
		t.Fatalf("error reveals the password: %v", err)
	}
	if _, err := m.Count(context.Background(), "SELECT 1", nil); err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("Count on a closed port: %v", err)
	}
	if !strings.Contains(buf.String(), "127.0.0.1:1") {
		t.Fatalf("log does not name the address: %s", buf.String())
	}
	if strings.Contains(buf.String(), secret) {
		t.Fatalf("log reveals the password: %s", buf.String())
	}
	_, err = OpenMySQL("app:"+secret+"@tcp(127.0.0.1:1/shop", DBConfig{}, logger)
	if err == nil || strings.Contains(err.Error(), secret) {
		t.Fatalf("OpenMySQL(bad DSN) error = %v; want an error without the password", err)
	}
}

func TestMySQLPoolLimits(t *testing.T) {
	db, _ := testsvc.MySQL(t)
	m := NewMySQL(db, DBConfig{MaxOpenConns: 3, QueryTimeout: 200 * time.Millisecond}, nil)
	if got := m.DB().Stats().MaxOpenConnections; got != 3 {
		t.Fatalf("MaxOpenConnections = %d, want 3", got)
	}
	// SLEEP(2) returns 1 when interrupted; the driver must give up first.
	if n, err := m.Count(context.Background(), "SELECT SLEEP(2)", nil); err == nil {
		t.Fatalf("Count past the query timeout = %d, want an error", n)
	}
	if err := m.Ping(context.Background()); err != nil {
		t.Fatal(err)
	}
	d := NewMySQL(db, DBConfig{}, nil)
	if got := d.DB().Stats().MaxOpenConnections; got != DefaultMaxOpenConns {
		t.Fatalf("default MaxOpenConnections = %d, want %d", got, DefaultMaxOpenConns)
	}
}

// FuzzBindArgs checks that binding never changes a value: numbers bind as
// the exact integer their digits spell, everything else as its own text.
func FuzzBindArgs(f *testing.F) {
	for _, s := range []string{"0", "-1", "9223372036854775807", "9223372036854775808", "18446744073709551615",
		"18446744073709551616", "-9223372036854775809", "+5", "1e3", "0x10", "1", "'; DROP TABLE t; --", ""} {
		f.Add(uint8(rules.KindInt), s)
		f.Add(uint8(rules.KindString), s)
		f.Add(uint8(rules.KindBool), s)
	}
	f.Fuzz(func(t *testing.T, kind uint8, text string) {
		v := rules.Value{Kind: rules.Kind(kind % 7), Text: text}
		out, err := bindArgs([]rules.Value{v})
		if err != nil {
			if v.Kind == rules.KindBool || v.Kind > rules.KindJSON {
				return
			}
			t.Fatalf("bindArgs(%+v): %v", v, err)
		}
		switch b := out[0].(type) {
		case nil:
			if v.Kind != rules.KindNull {
				t.Fatalf("bindArgs(%+v) = nil", v)
			}
		case int64:
			want, perr := strconv.ParseInt(text, 10, 64)
			if v.Kind == rules.KindBool {
				perr = nil
			} else if v.Kind != rules.KindInt {
				t.Fatalf("bindArgs(%+v) = int64 %d", v, b)
			}
			if perr != nil || want != b {
				t.Fatalf("bindArgs(%+v) = %d", v, b)
			}
		case uint64:
			want, perr := strconv.ParseUint(text, 10, 64)
			if v.Kind != rules.KindInt || perr != nil || want != b {
				t.Fatalf("bindArgs(%+v) = uint64 %d", v, b)
			}
		case string:
			if b != text {
				t.Fatalf("bindArgs(%+v) = %q", v, b)
			}
			if v.Kind == rules.KindInt {
				if _, err := strconv.ParseUint(text, 10, 64); err == nil {
					t.Fatalf("bindArgs(%+v): a uint64 bound as text", v)
				}
			}
		default:
			t.Fatalf("bindArgs(%+v) = %T", v, b)
		}
	})
}
