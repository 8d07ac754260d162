package main

import (
	"context"
	"fmt"
	"io"

	"github.com/cachewarden/cachewarden/doctor"
)

// doctorHelp is the description `cachewarden doctor -h` prints.
const doctorHelp = `Checks what the config names, writing nothing: the Kafka topics and their
partitions, the dead-letter topic (and whether the client may write to
it), the consumer group's committed offsets and lag; every memcached
server (reachable, answering the meta protocol); MySQL's binary log
settings (log_bin, binlog_format=ROW, binlog_row_image=FULL, GTIDs) and
the SELECT privilege each rule's queries need. Prints one line per check
(ok, warn or FAIL) and exits 1 when any check failed.`

// doctorCmd implements `doctor`: checks that what the config names is
// there and usable (package doctor), writing nothing.
func (a *app) doctorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("doctor", "doctor -c FILE [--timeout 10s]", doctorHelp, stderr)
	timeout := fs.Duration("timeout", doctor.DefaultTimeout, "bound on each area's checks (Kafka, memcached, MySQL)")
	cfg, err := parseConfigOnly(fs, "doctor", args, stderr)
	if err != nil {
		return err
	}
	rep := doctor.Run(ctx, doctor.Options{Config: cfg, Timeout: *timeout, Logger: a.configLogger(cfg.Log, stderr)})
	if err := rep.Write(stdout); err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	if n := rep.Count(doctor.Fail); n > 0 {
		return fmt.Errorf("doctor: %d checks failed", n)
	}
	return nil
}
