package integration

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

// WorkloadOptions shape a workload. Zero fields take the defaults named.
type WorkloadOptions struct {
	// Seed makes the sequence of changes reproducible; 0 picks one at
	// random (Workload.Seed reports it).
	Seed uint64
	// Users, Posts and Products size the initial data (defaults 12, 8
	// and 10).
	Users, Posts, Products int
	// KeyMoves allows updates that move a row from one set or counter key
	// to another without changing its primary key (a comment to another
	// post, a product to another category). Formats without before images
	// cannot follow those (Format.HasBefore): leave KeyMoves off for them.
	// Primary-key changes (an interest moving to another user) are always
	// made; every format can follow them.
	KeyMoves bool
	// IDBase is added to every id the workload hands out (users, products,
	// categories, posts, comments), so that runs sharing one memcached and
	// the same rule files do not share keys. It must stay below 2·10^9
	// (category ids are INT). 0 picks a random multiple of 1000.
	IDBase int64
}

func (o WorkloadOptions) withDefaults() WorkloadOptions {
	if o.Users <= 0 {
		o.Users = 12
	}
	if o.Posts <= 0 {
		o.Posts = 8
	}
	if o.Products <= 0 {
		o.Products = 10
	}
	if o.Seed == 0 {
		o.Seed = rand.Uint64()
	}
	if o.IDBase == 0 {
		o.IDBase = 1000 * (1 + rand.Int64N(1_999_999))
	}
	return o
}

// Tx is one committed transaction of the workload.
type Tx struct {
	// Desc says what the transaction did, for people.
	Desc    string
	Changes []Change
	// GTID is the transaction's MariaDB GTID (@@last_gtid, "0-1-42")
	// when the server logs GTIDs, else "": the binary log source's
	// checkpoint covers it once the transaction is applied.
	GTID string
}

// Workload applies a random but valid stream of changes to the schema's
// tables and reports each committed transaction as the row changes a CDC
// connector would publish: inserts, updates that move rows between keys,
// flips of the columns rules' predicates test, edits of other columns, and
// deletes.
//
// Source positions: when the server's binary log is on, every change of a
// transaction carries the file and position SHOW MASTER STATUS reports
// after its commit; otherwise a made-up file "mysql-bin.000001" and a
// position that grows with every transaction. Positions are monotonic
// either way, on one server (MoveTo starts another's). Every change
// carries the server's @@server_id.
//
// Round never changes one post's comment count twice: a counter recount
// reads the database's present state, and when that is ahead of the stream
// by a later change to the same counter, that change counts twice once its
// event is applied. Callers let the daemon catch up between rounds, so the
// cache can be compared with the database exactly.
//
// A Workload is not safe for concurrent use.
type Workload struct {
	db     *sql.DB
	schema *Schema
	opts   WorkloadOptions
	rng    *rand.Rand
	log    *slog.Logger

	binlog   bool
	mariadb  bool
	serverID uint32
	fakePos  int64
	tx       int64
	nextID   map[*Table]int64
	// rows is the model of every table's rows: primary key text ->
	// column -> value (int64, string or nil).
	rows map[*Table]map[string]map[string]any
}

// interestWords are interests; several need escaping as set members.
var interestWords = []string{"chess", "go", "rock climbing", "100% organic", "naïve art", "c++", "jazz", "ski touring"}

var productStatuses = []string{"draft", "published", "published", "retired"}

// NewWorkload prepares a workload on db, whose current database must
// hold the schema's tables (see Schema.Create).
func NewWorkload(ctx context.Context, db *sql.DB, schema *Schema, opts WorkloadOptions, log *slog.Logger) (*Workload, error) {
	opts = opts.withDefaults()
	w := &Workload{
		db: db, schema: schema, opts: opts, log: log,
		rng:     rand.New(rand.NewPCG(opts.Seed, opts.Seed^0x9e3779b97f4a7c15)),
		fakePos: 4,
		nextID:  map[*Table]int64{},
		rows:    map[*Table]map[string]map[string]any{},
	}
	for _, t := range schema.Tables() {
		w.rows[t] = map[string]map[string]any{}
		w.nextID[t] = 1
	}
	if err := w.readServer(ctx); err != nil {
		return nil, err
	}
	return w, nil
}

// readServer reads whether w.db's server has its binary log on, and its
// server_id.
func (w *Workload) readServer(ctx context.Context) error {
	var name, value string
	err := w.db.QueryRowContext(ctx, "SHOW VARIABLES LIKE 'log_bin'").Scan(&name, &value)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("integration: read log_bin: %w", err)
	}
	w.binlog = strings.EqualFold(value, "ON")
	var version string
	if err := w.db.QueryRowContext(ctx, "SELECT @@server_id, VERSION()").Scan(&w.serverID, &version); err != nil {
		return fmt.Errorf("integration: read server_id: %w", err)
	}
	w.mariadb = strings.Contains(version, "MariaDB")
	return nil
}

// MoveTo continues the workload on db, another server's database that
// holds the same rows (see CopyTables): a failover. Changes then carry
// that server's binary log positions and server_id.
func (w *Workload) MoveTo(ctx context.Context, db *sql.DB) error {
	w.db = db
	return w.readServer(ctx)
}

// ServerID returns the server_id of the workload's server.
func (w *Workload) ServerID() uint32 { return w.serverID }

// Seed returns the seed of the workload's random choices.
func (w *Workload) Seed() uint64 { return w.opts.Seed }

// BinlogPositions reports whether positions come from the server's binary
// log (true) or are made up (false).
func (w *Workload) BinlogPositions() bool { return w.binlog }

// IDBase returns the offset of every id the workload hands out.
func (w *Workload) IDBase() int64 { return w.opts.IDBase }

// stmt is one row change to make.
type stmt struct {
	t  *Table
	op rules.Operation
	// pk identifies the existing row (update, delete).
	pk map[string]any
	// values: insert, every column; update, the changed ones (primary key
	// columns included when the key changes).
	values map[string]any
}

func pkText(t *Table, values map[string]any) string {
	parts := make([]string, len(t.PK))
	for i, c := range t.PK {
		parts[i] = fmt.Sprint(values[c])
	}
	return strings.Join(parts, "\x00")
}

func pkOf(t *Table, row map[string]any) map[string]any {
	pk := make(map[string]any, len(t.PK))
	for _, c := range t.PK {
		pk[c] = row[c]
	}
	return pk
}

// newID hands out the next id of a table with an "id" key.
func (w *Workload) newID(t *Table) int64 {
	id := w.nextID[t]
	w.nextID[t]++
	return w.opts.IDBase + id
}

// pick returns a random row of t (nil when t is empty), in a reproducible
// way.
func (w *Workload) pick(t *Table) map[string]any {
	m := w.rows[t]
	if len(m) == 0 {
		return nil
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return m[keys[w.rng.IntN(len(keys))]]
}

func flag(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func (w *Workload) chance(percent int) bool { return w.rng.IntN(100) < percent }

// Initial inserts the initial rows in one transaction and returns them as
// snapshot reads (operation read, one snapshot position, the last row
// marked), as a connector's initial snapshot reports rows that existed
// before streaming began.
func (w *Workload) Initial(ctx context.Context) ([]Change, error) {
	var stmts []stmt
	add := func(s stmt) {
		w.commitModel([]stmt{s})
		stmts = append(stmts, s)
	}
	for i := 0; i < w.opts.Users; i++ {
		add(w.newUser())
	}
	for i := 0; i < w.opts.Users*2; i++ {
		if s, ok := w.newInterest(); ok {
			add(s)
		}
	}
	for i := 0; i < w.opts.Products; i++ {
		add(w.newProduct())
	}
	for i := 0; i < w.opts.Posts; i++ {
		add(w.newPost())
	}
	for i := 0; i < w.opts.Posts*3; i++ {
		add(w.newComment(w.post()))
	}
	tx, err := w.exec(ctx, "initial rows", stmts)
	if err != nil {
		return nil, err
	}
	out := tx.Changes
	for i := range out {
		ev := &out[i].Event
		ev.Operation = rules.Read
		ev.Before = nil
		out[i].SnapshotLast = i == len(out)-1
	}
	return out, nil
}

// Round runs up to n transactions (fewer when no post's comment count may
// change any more in this round) and returns them in commit order.
func (w *Workload) Round(ctx context.Context, n int) ([]Tx, error) {
	touched := map[int64]bool{} // posts whose comment count may have changed
	var out []Tx
	for attempts := 0; len(out) < n && attempts < n*20; attempts++ {
		desc, stmts, posts := w.step()
		if stmts == nil {
			continue
		}
		clash := false
		for _, p := range posts {
			clash = clash || touched[p]
		}
		if clash {
			continue
		}
		tx, err := w.exec(ctx, desc, stmts)
		if err != nil {
			return out, err
		}
		w.commitModel(stmts)
		for _, p := range posts {
			touched[p] = true
		}
		out = append(out, tx)
	}
	return out, nil
}

// post returns a random post id.
func (w *Workload) post() int64 { return w.opts.IDBase + 1 + w.rng.Int64N(int64(w.opts.Posts)) }

// category returns a random product category id.
func (w *Workload) category() int64 { return w.opts.IDBase + 1 + w.rng.Int64N(4) }

// author returns the id of a user of the initial data (who may have been
// deleted since).
func (w *Workload) author() int64 { return w.opts.IDBase + 1 + w.rng.Int64N(int64(w.opts.Users)) }

// postOf returns a comment's post, or false when it has none (NULL).
func postOf(c map[string]any) (int64, bool) {
	p, ok := c["post_id"].(int64)
	return p, ok
}

// step picks one transaction's statements. posts lists the posts whose
// comment count it may change.
func (w *Workload) step() (desc string, stmts []stmt, posts []int64) {
	r := w.rng.IntN(100)
	switch {
	case r < 16:
		return w.userStep(r)
	case r < 38:
		return w.interestStep(r)
	case r < 54:
		return w.productStep(r)
	case r < 60:
		return w.postStep(r)
	}
	return w.commentStep(r)
}

// one is a transaction of one statement.
func one(st stmt) []stmt { return []stmt{st} }

// userStep is step for r in [0, 16): a user is created, edited, logs in or
// is deleted.
func (w *Workload) userStep(r int) (desc string, stmts []stmt, posts []int64) {
	s := w.schema
	u := w.pick(s.Users)
	switch {
	case r < 3 || u == nil:
		st := w.newUser()
		return fmt.Sprintf("new user %d", st.values["id"]), one(st), nil
	case r < 9:
		name := fmt.Sprintf("user %d v%d", u["id"], w.rng.IntN(1000))
		vals := map[string]any{"name": name}
		if w.chance(50) {
			vals["email"] = fmt.Sprintf("u%d.%d@example.com", u["id"], w.rng.IntN(1000))
		}
		if w.chance(30) {
			vals["avatar_url"] = fmt.Sprintf("https://img.example.com/%d.png", w.rng.IntN(1000))
		}
		return fmt.Sprintf("user %d edits the profile", u["id"]), one(stmt{t: s.Users, op: rules.Update, pk: pkOf(s.Users, u), values: vals}), nil
	case r < 14:
		at := time.Unix(1714557600+w.rng.Int64N(1e7), 0).UTC().Format(time.DateTime)
		return fmt.Sprintf("user %d logs in (last_seen_at only)", u["id"]),
			one(stmt{t: s.Users, op: rules.Update, pk: pkOf(s.Users, u), values: map[string]any{"last_seen_at": at}}), nil
	default:
		if len(w.rows[s.Users]) < 4 {
			return "", nil, nil
		}
		return fmt.Sprintf("delete user %d", u["id"]), one(stmt{t: s.Users, op: rules.Delete, pk: pkOf(s.Users, u)}), nil
	}
}

// interestStep is step for r in [16, 38): an interest is taken up,
// flipped, moved to another user, renamed or dropped.
func (w *Workload) interestStep(r int) (desc string, stmts []stmt, posts []int64) {
	s := w.schema
	in := w.pick(s.Interests)
	switch {
	case r < 23 || in == nil:
		st, ok := w.newInterest()
		if !ok {
			return "", nil, nil
		}
		return fmt.Sprintf("user %d takes up %q (active %d)", st.values["user_id"], st.values["interest"], st.values["active"]), one(st), nil
	case r < 30:
		active := in["active"].(int64)
		return fmt.Sprintf("user %d interest %q active %d -> %d", in["user_id"], in["interest"], active, 1-active),
			one(stmt{t: s.Interests, op: rules.Update, pk: pkOf(s.Interests, in), values: map[string]any{"active": 1 - active}}), nil
	case r < 33:
		u := w.pick(s.Users)
		if u == nil {
			return "", nil, nil
		}
		to := u["id"].(int64)
		if to == in["user_id"] || w.rows[s.Interests][pkText(s.Interests, map[string]any{"user_id": to, "interest": in["interest"]})] != nil {
			return "", nil, nil
		}
		return fmt.Sprintf("interest %q moves from user %d to user %d (primary key change)", in["interest"], in["user_id"], to),
			one(stmt{t: s.Interests, op: rules.Update, pk: pkOf(s.Interests, in), values: map[string]any{"user_id": to}}), nil
	case r < 35:
		word := interestWords[w.rng.IntN(len(interestWords))]
		if w.rows[s.Interests][pkText(s.Interests, map[string]any{"user_id": in["user_id"], "interest": word})] != nil {
			return "", nil, nil
		}
		return fmt.Sprintf("user %d renames interest %q to %q (primary key change)", in["user_id"], in["interest"], word),
			one(stmt{t: s.Interests, op: rules.Update, pk: pkOf(s.Interests, in), values: map[string]any{"interest": word}}), nil
	default:
		return fmt.Sprintf("user %d drops interest %q", in["user_id"], in["interest"]),
			one(stmt{t: s.Interests, op: rules.Delete, pk: pkOf(s.Interests, in)}), nil
	}
}

// productStep is step for r in [38, 54): a product is created, changes
// status, price or category, or is deleted.
func (w *Workload) productStep(r int) (desc string, stmts []stmt, posts []int64) {
	s := w.schema
	p := w.pick(s.Products)
	switch {
	case r < 41 || p == nil:
		st := w.newProduct()
		return fmt.Sprintf("new product %d in category %d (%s)", st.values["id"], st.values["category_id"], st.values["status"]), one(st), nil
	case r < 46:
		status := productStatuses[w.rng.IntN(len(productStatuses))]
		if status == p["status"] {
			return "", nil, nil
		}
		return fmt.Sprintf("product %d status %s -> %s", p["id"], p["status"], status),
			one(stmt{t: s.Products, op: rules.Update, pk: pkOf(s.Products, p), values: map[string]any{"status": status}}), nil
	case r < 49:
		price := fmt.Sprintf("%d.%02d", 1+w.rng.IntN(200), w.rng.IntN(100))
		return fmt.Sprintf("product %d price %s -> %s", p["id"], p["price"], price),
			one(stmt{t: s.Products, op: rules.Update, pk: pkOf(s.Products, p), values: map[string]any{"price": price}}), nil
	case r < 52:
		cat := w.category()
		if !w.opts.KeyMoves || cat == p["category_id"] {
			return "", nil, nil
		}
		return fmt.Sprintf("product %d moves from category %d to %d", p["id"], p["category_id"], cat),
			one(stmt{t: s.Products, op: rules.Update, pk: pkOf(s.Products, p), values: map[string]any{"category_id": cat}}), nil
	default:
		return fmt.Sprintf("delete product %d", p["id"]), one(stmt{t: s.Products, op: rules.Delete, pk: pkOf(s.Products, p)}), nil
	}
}

// postStep is step for r in [54, 60): a post is edited or (un)published.
func (w *Workload) postStep(r int) (desc string, stmts []stmt, posts []int64) {
	s := w.schema
	p := w.pick(s.Posts)
	if p == nil {
		return "", nil, nil
	}
	switch {
	case r < 58:
		return fmt.Sprintf("edit post %d", p["id"]), one(stmt{t: s.Posts, op: rules.Update, pk: pkOf(s.Posts, p),
			values: map[string]any{"title": fmt.Sprintf("Post %d, take %d", p["id"], w.rng.IntN(100))}}), nil
	default:
		pub := p["published"].(int64)
		return fmt.Sprintf("post %d published %d -> %d", p["id"], pub, 1-pub),
			one(stmt{t: s.Posts, op: rules.Update, pk: pkOf(s.Posts, p), values: map[string]any{"published": 1 - pub}}), nil
	}
}

// commentStep is step for r in [60, 100): comments are written (some
// several in one transaction), (un)approved, moved, edited or deleted.
func (w *Workload) commentStep(r int) (desc string, stmts []stmt, posts []int64) {
	s := w.schema
	c := w.pick(s.Comments)
	switch {
	case r < 72 || c == nil:
		post := w.post()
		if w.chance(10) {
			st := w.newComment(0)
			return fmt.Sprintf("comment %d on no post yet", st.values["id"]), one(st), nil
		}
		st := w.newComment(post)
		return fmt.Sprintf("comment %d on post %d (approved %d)", st.values["id"], post, st.values["approved"]), one(st), []int64{post}
	case r < 76:
		n := 2 + w.rng.IntN(2)
		seen := map[int64]bool{}
		var what []string
		for tries := 0; len(stmts) < n && tries < 10; tries++ {
			p := w.post()
			if seen[p] {
				continue
			}
			seen[p] = true
			st := w.newComment(p)
			stmts = append(stmts, st)
			posts = append(posts, p)
			what = append(what, fmt.Sprintf("%d on post %d", st.values["id"], p))
		}
		return "comments " + strings.Join(what, ", ") + " in one transaction", stmts, posts
	case r < 86:
		approved := c["approved"].(int64)
		verb := "approve"
		if approved == 1 {
			verb = "unapprove"
		}
		p, _ := postOf(c)
		return fmt.Sprintf("%s comment %d (post %v)", verb, c["id"], c["post_id"]),
			one(stmt{t: s.Comments, op: rules.Update, pk: pkOf(s.Comments, c), values: map[string]any{"approved": 1 - approved}}), []int64{p}
	case r < 92:
		from, hasPost := postOf(c)
		to := w.post()
		if !w.opts.KeyMoves || (hasPost && to == from) {
			return "", nil, nil
		}
		return fmt.Sprintf("move comment %d from post %v to post %d", c["id"], c["post_id"], to),
			one(stmt{t: s.Comments, op: rules.Update, pk: pkOf(s.Comments, c), values: map[string]any{"post_id": to}}), []int64{from, to}
	case r < 95:
		p, _ := postOf(c)
		return fmt.Sprintf("edit comment %d", c["id"]), one(stmt{t: s.Comments, op: rules.Update, pk: pkOf(s.Comments, c),
			values: map[string]any{"body": fmt.Sprintf("edited %d", w.rng.IntN(1e6))}}), []int64{p}
	default:
		p, _ := postOf(c)
		return fmt.Sprintf("delete comment %d (post %v)", c["id"], c["post_id"]), one(stmt{t: s.Comments, op: rules.Delete, pk: pkOf(s.Comments, c)}), []int64{p}
	}
}

// The new* helpers choose fresh rows; a row enters the model once its
// transaction commits (commitModel).

func (w *Workload) newUser() stmt {
	id := w.newID(w.schema.Users)
	var avatar any
	if w.chance(50) {
		avatar = fmt.Sprintf("https://img.example.com/%d.png", id)
	}
	return stmt{t: w.schema.Users, op: rules.Insert, values: map[string]any{
		"id": id, "name": fmt.Sprintf("user %d", id), "email": fmt.Sprintf("u%d@example.com", id),
		"avatar_url": avatar, "last_seen_at": nil,
	}}
}

func (w *Workload) newInterest() (stmt, bool) {
	u := w.pick(w.schema.Users)
	if u == nil {
		return stmt{}, false
	}
	vals := map[string]any{"user_id": u["id"], "interest": interestWords[w.rng.IntN(len(interestWords))], "active": flag(!w.chance(25))}
	if w.rows[w.schema.Interests][pkText(w.schema.Interests, vals)] != nil {
		return stmt{}, false
	}
	return stmt{t: w.schema.Interests, op: rules.Insert, values: vals}, true
}

func (w *Workload) newProduct() stmt {
	id := w.newID(w.schema.Products)
	return stmt{t: w.schema.Products, op: rules.Insert, values: map[string]any{
		"id": id, "category_id": w.category(), "name": fmt.Sprintf("Product %d", id),
		"price": fmt.Sprintf("%d.%02d", 1+w.rng.IntN(200), w.rng.IntN(100)), "status": productStatuses[w.rng.IntN(len(productStatuses))],
	}}
}

func (w *Workload) newPost() stmt {
	id := w.newID(w.schema.Posts)
	return stmt{t: w.schema.Posts, op: rules.Insert, values: map[string]any{
		"id": id, "author_id": w.author(), "title": fmt.Sprintf("Post %d", id),
		"body": "Lorem ipsum", "published": flag(w.chance(70)),
	}}
}

// newComment returns a comment on post; post 0 means none (NULL).
func (w *Workload) newComment(post int64) stmt {
	id := w.newID(w.schema.Comments)
	var p any
	if post != 0 {
		p = post
	}
	return stmt{t: w.schema.Comments, op: rules.Insert, values: map[string]any{
		"id": id, "post_id": p, "author_id": w.author(),
		"body": fmt.Sprintf("comment %d", id), "approved": flag(w.chance(65)),
	}}
}

// commitModel records committed statements in the in-memory model.
func (w *Workload) commitModel(stmts []stmt) {
	for _, s := range stmts {
		rows := w.rows[s.t]
		switch s.op {
		case rules.Insert:
			row := make(map[string]any, len(s.values))
			for k, v := range s.values {
				row[k] = v
			}
			rows[pkText(s.t, row)] = row
		case rules.Update:
			old := pkText(s.t, s.pk)
			row := rows[old]
			delete(rows, old)
			for k, v := range s.values {
				row[k] = v
			}
			rows[pkText(s.t, row)] = row
		case rules.Delete:
			delete(rows, pkText(s.t, s.pk))
		}
	}
}

// exec runs stmts in one transaction and returns the changes with their
// before and after images as the database holds them.
func (w *Workload) exec(ctx context.Context, desc string, stmts []stmt) (Tx, error) {
	// One connection: @@last_gtid is the session's.
	conn, err := w.db.Conn(ctx)
	if err != nil {
		return Tx{}, fmt.Errorf("integration: connect: %w", err)
	}
	defer conn.Close()
	sqlTx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return Tx{}, fmt.Errorf("integration: begin: %w", err)
	}
	defer sqlTx.Rollback()
	changes := make([]Change, 0, len(stmts))
	for _, s := range stmts {
		c := Change{Table: s.t, Event: rules.Event{Database: s.t.Database, Table: s.t.Name, Operation: s.op}}
		after := s.pk
		switch s.op {
		case rules.Insert:
			after = pkOf(s.t, s.values)
		case rules.Update:
			after = make(map[string]any, len(s.pk))
			for k, v := range s.pk {
				after[k] = v
			}
			for k, v := range s.values {
				if _, ok := after[k]; ok {
					after[k] = v
				}
			}
		}
		if s.op != rules.Insert {
			if c.Event.Before, err = readRow(ctx, sqlTx, s.t, s.pk, true); err != nil {
				return Tx{}, err
			}
			if c.Event.Before == nil {
				return Tx{}, fmt.Errorf("integration: %s: %s row %v does not exist", desc, s.t.Name, s.pk)
			}
		}
		if err := execStmt(ctx, sqlTx, s); err != nil {
			return Tx{}, fmt.Errorf("integration: %s: %w", desc, err)
		}
		if s.op != rules.Delete {
			if c.Event.After, err = readRow(ctx, sqlTx, s.t, after, false); err != nil {
				return Tx{}, err
			}
		}
		changes = append(changes, c)
	}
	if err := sqlTx.Commit(); err != nil {
		return Tx{}, fmt.Errorf("integration: %s: commit: %w", desc, err)
	}
	file, pos, err := w.position(ctx, len(stmts))
	if err != nil {
		return Tx{}, err
	}
	var gtid string
	if w.binlog && w.mariadb {
		if err := conn.QueryRowContext(ctx, "SELECT @@last_gtid").Scan(&gtid); err != nil {
			return Tx{}, fmt.Errorf("integration: %s: read @@last_gtid: %w", desc, err)
		}
	}
	w.tx++
	now := time.Now().UnixMilli()
	for i := range changes {
		c := &changes[i]
		c.Tx, c.Row, c.Last = w.tx, i, i == len(changes)-1
		c.Event.Source = rules.Position{BinlogFile: file, BinlogPos: pos, TsMs: now, ServerID: w.serverID}
	}
	return Tx{Desc: desc, Changes: changes, GTID: gtid}, nil
}

// position returns the binary log position after the last commit.
func (w *Workload) position(ctx context.Context, rows int) (string, int64, error) {
	if !w.binlog {
		w.fakePos += 120 + 80*int64(rows)
		return "mysql-bin.000001", w.fakePos, nil
	}
	rs, err := w.db.QueryContext(ctx, "SHOW MASTER STATUS")
	if err != nil {
		return "", 0, fmt.Errorf("integration: SHOW MASTER STATUS: %w", err)
	}
	defer rs.Close()
	cols, err := rs.Columns()
	if err != nil {
		return "", 0, fmt.Errorf("integration: SHOW MASTER STATUS: %w", err)
	}
	if !rs.Next() || len(cols) < 2 {
		return "", 0, fmt.Errorf("integration: SHOW MASTER STATUS returned no position although log_bin is on")
	}
	raw := make([]sql.RawBytes, len(cols))
	dest := make([]any, len(cols))
	for i := range dest {
		dest[i] = &raw[i]
	}
	if err := rs.Scan(dest...); err != nil {
		return "", 0, fmt.Errorf("integration: SHOW MASTER STATUS: %w", err)
	}
	pos, err := strconv.ParseInt(string(raw[1]), 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("integration: SHOW MASTER STATUS position %q: %w", raw[1], err)
	}
	return string(raw[0]), pos, nil
}

func whereKey(t *Table, pk map[string]any) (string, []any) {
	conds := make([]string, len(t.PK))
	args := make([]any, len(t.PK))
	for i, c := range t.PK {
		conds[i] = "`" + c + "` = ?"
		args[i] = pk[c]
	}
	return strings.Join(conds, " AND "), args
}

func execStmt(ctx context.Context, tx *sql.Tx, s stmt) error {
	t := s.t
	switch s.op {
	case rules.Insert:
		names := make([]string, len(t.Columns))
		args := make([]any, len(t.Columns))
		for i, c := range t.Columns {
			names[i] = c.Name
			args[i] = s.values[c.Name]
		}
		q := "INSERT INTO `" + t.Name + "` (" + quoteNames(names) + ") VALUES (?" + strings.Repeat(", ?", len(names)-1) + ")"
		_, err := tx.ExecContext(ctx, q, args...)
		return err
	case rules.Update:
		var sets []string
		var args []any
		for _, c := range t.Columns { // table order keeps statements stable
			if v, ok := s.values[c.Name]; ok {
				sets = append(sets, "`"+c.Name+"` = ?")
				args = append(args, v)
			}
		}
		where, wargs := whereKey(t, s.pk)
		_, err := tx.ExecContext(ctx, "UPDATE `"+t.Name+"` SET "+strings.Join(sets, ", ")+" WHERE "+where, append(args, wargs...)...)
		return err
	case rules.Delete:
		where, args := whereKey(t, s.pk)
		_, err := tx.ExecContext(ctx, "DELETE FROM `"+t.Name+"` WHERE "+where, args...)
		return err
	}
	return fmt.Errorf("unsupported operation %s", s.op)
}

// readRow reads one row by primary key as an event row image (nil when
// absent).
func readRow(ctx context.Context, tx *sql.Tx, t *Table, pk map[string]any, forUpdate bool) (rules.Row, error) {
	names := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		names[i] = c.Name
	}
	where, args := whereKey(t, pk)
	q := "SELECT " + quoteNames(names) + " FROM `" + t.Name + "` WHERE " + where
	if forUpdate {
		q += " FOR UPDATE"
	}
	raw := make([]sql.RawBytes, len(names))
	dest := make([]any, len(names))
	for i := range raw {
		dest[i] = &raw[i]
	}
	rows, err := tx.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("integration: read %s row %v: %w", t.Name, pk, err)
	}
	defer rows.Close()
	if !rows.Next() {
		return nil, rows.Err()
	}
	if err := rows.Scan(dest...); err != nil {
		return nil, fmt.Errorf("integration: read %s row %v: %w", t.Name, pk, err)
	}
	row := make(rules.Row, len(names))
	for i, c := range t.Columns {
		row[i] = rules.Column{Name: c.Name}
		if raw[i] != nil {
			row[i].Value = rules.Value{Kind: c.Kind, Text: string(raw[i])}
			if c.SQLType == "datetime" {
				// With parseTime the driver renders DATETIME as RFC 3339;
				// events carry MySQL's own "YYYY-MM-DD hh:mm:ss".
				if ts, err := time.Parse(time.RFC3339Nano, row[i].Value.Text); err == nil {
					row[i].Value.Text = ts.UTC().Format(time.DateTime)
				}
			}
		}
	}
	return row, rows.Err()
}
