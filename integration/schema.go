package integration

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/cachewarden/cachewarden/rules"
)

// The workload's schema is the one the example rule files in configs/rules
// describe: a shop (users, their interests, products) and a blog (posts
// and their comments, which need approval).
//
// All tables live in one MySQL database, the one the DSN names, so that
// the unqualified load and recount queries of rule files find them. Change
// events name the logical database of each table (Table.Database: "shop"
// or "blog"), which is what rule files match (`table: shop.users`). Tests
// create a fresh database per test; the demo recreates its own.

// ColumnDef is one column of a workload table.
type ColumnDef struct {
	Name string
	// SQLType is the column type as SHOW COLUMNS spells it
	// ("bigint(20)"); Canal's mysqlType carries it too.
	SQLType string
	// Null says whether the column is nullable.
	Null bool
	// Kind is how change events carry the value.
	Kind rules.Kind
	// JDBC is the java.sql.Types code in Canal's sqlType.
	JDBC int
	// Connect is the Kafka Connect schema type in Debezium's schema
	// envelope; Logical its semantic name, if any.
	Connect, Logical string
}

// Table is one workload table.
type Table struct {
	// Database is the logical database named in change events.
	Database string
	Name     string
	Columns  []ColumnDef
	// PK lists the primary key's columns.
	PK []string
	// Indexes lists the columns of each secondary index: those the
	// example rules' load and recount queries look rows up by
	// (`cachewarden check` reports a query that reads a whole table).
	Indexes [][]string
}

// Qualified returns "database.table" as events and rule files name it.
func (t *Table) Qualified() string { return t.Database + "." + t.Name }

// Column returns the named column's definition.
func (t *Table) Column(name string) (ColumnDef, bool) {
	for _, c := range t.Columns {
		if c.Name == name {
			return c, true
		}
	}
	return ColumnDef{}, false
}

func quoteNames(names []string) string {
	q := make([]string, len(names))
	for i, n := range names {
		q[i] = "`" + n + "`"
	}
	return strings.Join(q, ", ")
}

// createSQL returns the table's CREATE TABLE statement.
func (t *Table) createSQL() string {
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE TABLE `%s` (\n", t.Name)
	for _, c := range t.Columns {
		null := " NOT NULL"
		if c.Null {
			null = " NULL"
		}
		fmt.Fprintf(&b, "  `%s` %s%s,\n", c.Name, c.SQLType, null)
	}
	fmt.Fprintf(&b, "  PRIMARY KEY (%s)", quoteNames(t.PK))
	for _, ix := range t.Indexes {
		fmt.Fprintf(&b, ",\n  KEY (%s)", quoteNames(ix))
	}
	b.WriteString("\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4")
	return b.String()
}

func bigintCol(name string) ColumnDef {
	return ColumnDef{Name: name, SQLType: "bigint(20)", Kind: rules.KindInt, JDBC: -5, Connect: "int64"}
}

func intCol(name string) ColumnDef {
	return ColumnDef{Name: name, SQLType: "int(11)", Kind: rules.KindInt, JDBC: 4, Connect: "int32"}
}

func boolCol(name string) ColumnDef {
	return ColumnDef{Name: name, SQLType: "tinyint(1)", Kind: rules.KindInt, JDBC: -7, Connect: "int16"}
}

func varcharCol(name string, n int) ColumnDef {
	return ColumnDef{Name: name, SQLType: fmt.Sprintf("varchar(%d)", n), Kind: rules.KindString, JDBC: 12, Connect: "string"}
}

func textCol(name string) ColumnDef {
	return ColumnDef{Name: name, SQLType: "text", Kind: rules.KindString, JDBC: 2005, Connect: "string"}
}

// decimalCol is published by Debezium as a string
// (decimal.handling.mode=string), by Maxwell as a number, by Canal as text.
func decimalCol(name string) ColumnDef {
	return ColumnDef{Name: name, SQLType: "decimal(10,2)", Kind: rules.KindFloat, JDBC: 3, Connect: "string"}
}

// datetimeCol is published by Debezium as milliseconds since the epoch
// (io.debezium.time.Timestamp), by Maxwell and Canal as text.
func datetimeCol(name string) ColumnDef {
	return ColumnDef{Name: name, SQLType: "datetime", Kind: rules.KindString, JDBC: 93, Connect: "int64", Logical: "io.debezium.time.Timestamp"}
}

func nullable(c ColumnDef) ColumnDef {
	c.Null = true
	return c
}

// Schema is the workload's set of tables.
type Schema struct {
	Users, Interests, Products *Table
	Posts, Comments            *Table
}

// NewSchema returns the workload schema with the logical database names
// shopDB (users, user_interests, products) and blogDB (posts, comments);
// empty names default to "shop" and "blog".
func NewSchema(shopDB, blogDB string) *Schema {
	if shopDB == "" {
		shopDB = "shop"
	}
	if blogDB == "" {
		blogDB = "blog"
	}
	return &Schema{
		Users: &Table{Database: shopDB, Name: "users", PK: []string{"id"}, Columns: []ColumnDef{
			bigintCol("id"), varcharCol("name", 100), varcharCol("email", 255),
			nullable(varcharCol("avatar_url", 255)), nullable(datetimeCol("last_seen_at")),
		}},
		// The primary key is the set membership: a user holds an interest
		// at most once.
		Interests: &Table{Database: shopDB, Name: "user_interests", PK: []string{"user_id", "interest"}, Columns: []ColumnDef{
			bigintCol("user_id"), varcharCol("interest", 64), boolCol("active"),
		}},
		Products: &Table{Database: shopDB, Name: "products", PK: []string{"id"}, Columns: []ColumnDef{
			bigintCol("id"), intCol("category_id"), varcharCol("name", 200), decimalCol("price"), varcharCol("status", 20),
		}, Indexes: [][]string{{"category_id", "status"}}},
		Posts: &Table{Database: blogDB, Name: "posts", PK: []string{"id"}, Columns: []ColumnDef{
			bigintCol("id"), bigintCol("author_id"), varcharCol("title", 200), textCol("body"), boolCol("published"),
		}},
		Comments: &Table{Database: blogDB, Name: "comments", PK: []string{"id"}, Columns: []ColumnDef{
			bigintCol("id"), nullable(bigintCol("post_id")), bigintCol("author_id"), textCol("body"), boolCol("approved"),
		}, Indexes: [][]string{{"post_id", "approved"}}},
	}
}

// Tables returns the schema's tables in creation order.
func (s *Schema) Tables() []*Table {
	return []*Table{s.Users, s.Interests, s.Products, s.Posts, s.Comments}
}

// Create drops and creates the schema's tables in db's current database.
func (s *Schema) Create(ctx context.Context, db *sql.DB) error {
	for _, t := range s.Tables() {
		if _, err := db.ExecContext(ctx, "DROP TABLE IF EXISTS `"+t.Name+"`"); err != nil {
			return fmt.Errorf("integration: drop table %s: %w", t.Name, err)
		}
		if _, err := db.ExecContext(ctx, t.createSQL()); err != nil {
			return fmt.Errorf("integration: create table %s: %w", t.Name, err)
		}
	}
	return nil
}

// CopyTables copies every row of the schema's tables from one database
// to another whose tables exist and are empty (Create), in chunks of
// copyChunk rows, values as the server renders them.
func (s *Schema) CopyTables(ctx context.Context, from, to *sql.DB) error {
	for _, t := range s.Tables() {
		names := make([]string, len(t.Columns))
		for i, c := range t.Columns {
			names[i] = c.Name
		}
		rows, err := from.QueryContext(ctx, "SELECT "+quoteNames(names)+" FROM `"+t.Name+"`")
		if err != nil {
			return fmt.Errorf("integration: copy %s: %w", t.Name, err)
		}
		var args []any
		flush := func() error {
			if len(args) == 0 {
				return nil
			}
			one := "(?" + strings.Repeat(", ?", len(names)-1) + ")"
			n := len(args) / len(names)
			q := "INSERT INTO `" + t.Name + "` (" + quoteNames(names) + ") VALUES " + one + strings.Repeat(", "+one, n-1)
			if _, err := to.ExecContext(ctx, q, args...); err != nil {
				return fmt.Errorf("integration: copy %s: %w", t.Name, err)
			}
			args = args[:0]
			return nil
		}
		for rows.Next() {
			raw := make([]sql.RawBytes, len(names))
			dest := make([]any, len(names))
			for i := range raw {
				dest[i] = &raw[i]
			}
			if err := rows.Scan(dest...); err != nil {
				rows.Close()
				return fmt.Errorf("integration: copy %s: %w", t.Name, err)
			}
			for i, v := range raw {
				if v == nil {
					args = append(args, nil)
					continue
				}
				text := string(v)
				if t.Columns[i].SQLType == "datetime" {
					// With parseTime the driver renders DATETIME as RFC
					// 3339, which the server does not take back.
					if ts, err := time.Parse(time.RFC3339Nano, text); err == nil {
						text = ts.UTC().Format(time.DateTime)
					}
				}
				args = append(args, text)
			}
			if len(args) >= copyChunk*len(names) {
				if err := flush(); err != nil {
					rows.Close()
					return err
				}
			}
		}
		err = rows.Err()
		rows.Close()
		if err != nil {
			return fmt.Errorf("integration: copy %s: %w", t.Name, err)
		}
		if err := flush(); err != nil {
			return err
		}
	}
	return nil
}

// copyChunk is the number of rows CopyTables inserts per statement.
const copyChunk = 200
