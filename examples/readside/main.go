// Command readside reads what the daemon maintains for the example rules
// (configs/rules) the way an application does, through package client:
//
//	go run ./examples/readside -rules configs/rules -memcached 127.0.0.1:11311 \
//	    -dsn 'root@tcp(127.0.0.1:3306)/cachewarden_demo' -user 42 -post 9
//
// The defaults are what the quick start leaves running: memcached on
// 127.0.0.1:11311 (`make services`) and the demo's database
// cachewarden_demo on the MariaDB at 127.0.0.1:3306 (`make demo`).
//
// It prints user 42's namespace version and interests, post 9's comment
// count, and a page cached with GetOrCompute under the user's namespace.
package main

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	_ "github.com/go-sql-driver/mysql" // the application's choice of driver

	"github.com/cachewarden/cachewarden/client"
	"github.com/cachewarden/cachewarden/itemformat"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

func main() {
	rulesPath := flag.String("rules", "configs/rules", "the daemon's rule files (file or directory)")
	servers := flag.String("memcached", "127.0.0.1:11311", "the daemon's memcached.servers, comma-separated, in its order")
	distribution := flag.String("distribution", "", "the daemon's memcached.distribution (default modula-crc32)")
	dsn := flag.String("dsn", "", "MySQL DSN for loading missing sets and counters (empty: none)")
	user := flag.Int64("user", 42, "user id")
	post := flag.Int64("post", 9, "post id")
	flag.Parse()
	if err := run(*rulesPath, *servers, *distribution, *dsn, *user, *post); err != nil {
		fmt.Fprintln(os.Stderr, "readside:", err)
		os.Exit(1)
	}
}

func run(rulesPath, servers, distribution, dsn string, user, post int64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rs, err := rulefile.LoadPaths(rulesPath)
	if err != nil {
		return err
	}
	cfg := client.Config{Rules: rs, Distribution: distribution}
	for _, s := range strings.Split(servers, ",") {
		cfg.Servers = append(cfg.Servers, itemformat.Server{Addr: strings.TrimSpace(s)})
	}
	if dsn != "" {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			return err
		}
		defer db.Close()
		cfg.DB = db
	}
	c, err := client.New(cfg, slog.Default())
	if err != nil {
		return err
	}
	defer c.Close()

	v, err := c.Namespace(ctx, "user", client.Row{"id": user})
	if err != nil {
		return err
	}
	fmt.Printf("user %d: namespace version %s\n", user, v)

	page, err := c.GetOrCompute(ctx, fmt.Sprintf("shop:page:user:%d:v%s", user, v), 10*time.Minute,
		func(ctx context.Context) ([]byte, error) {
			return fmt.Appendf(nil, "<h1>user %d</h1> rendered %s", user, time.Now().Format(time.RFC3339)), nil
		})
	if err != nil {
		return err
	}
	fmt.Printf("user %d: page %q\n", user, page)

	if interests, err := c.Members(ctx, "user-interests", client.Row{"user_id": user}); err != nil {
		fmt.Printf("user %d: interests: %v\n", user, err)
	} else {
		fmt.Printf("user %d: interests %q\n", user, interests)
	}
	if n, err := c.Count(ctx, "post-comments", client.Row{"post_id": post}); err != nil {
		fmt.Printf("post %d: comments: %v\n", post, err)
	} else {
		fmt.Printf("post %d: %d approved comments\n", post, n)
	}
	return nil
}
