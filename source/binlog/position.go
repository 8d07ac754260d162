package binlog

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
	"strings"

	"github.com/go-mysql-org/go-mysql/mysql"
)

// Positions are saved as text (Checkpoint.Save): "gtid:" and the GTID
// set when the stream has one (it survives a failover of the source to
// a replica that has the same transactions), else "file:" and the binlog
// file and position ("file:mysql-bin.000003:154"). The empty text is no
// position: read from the server's current one.
const (
	gtidPrefix = "gtid:"
	filePrefix = "file:"
)

// FormatPosition renders a start position as its saved text.
func FormatPosition(s Start) string {
	switch {
	case s.GTIDSet != "":
		return gtidPrefix + s.GTIDSet
	case s.File != "":
		return filePrefix + s.File + ":" + strconv.FormatUint(uint64(s.Pos), 10)
	}
	return ""
}

// ParsePosition reads a position FormatPosition wrote; "" is the zero
// Start.
func ParsePosition(text string) (Start, error) {
	switch {
	case text == "":
		return Start{}, nil
	case strings.HasPrefix(text, gtidPrefix):
		return Start{GTIDSet: strings.TrimPrefix(text, gtidPrefix)}, nil
	case strings.HasPrefix(text, filePrefix):
		rest := strings.TrimPrefix(text, filePrefix)
		i := strings.LastIndexByte(rest, ':')
		if i <= 0 {
			return Start{}, fmt.Errorf("position %q: want file:NAME:POS", text)
		}
		pos, err := strconv.ParseUint(rest[i+1:], 10, 32)
		if err != nil {
			return Start{}, fmt.Errorf("position %q: %q is not a binlog position", text, rest[i+1:])
		}
		return Start{File: rest[:i], Pos: uint32(pos)}, nil
	}
	return Start{}, fmt.Errorf("position %q: want gtid:SET or file:NAME:POS", text)
}

// currentStart returns the server's current position: its GTID set when
// it has one (MariaDB's gtid_binlog_pos; MySQL's gtid_executed with
// gtid_mode ON), else the binlog file and position.
func currentStart(ctx context.Context, db *sql.DB, flavor string) (Start, error) {
	q := "SELECT @@GLOBAL.gtid_binlog_pos"
	if flavor == mysql.MySQLFlavor {
		q = "SELECT IF(@@GLOBAL.gtid_mode = 'ON', @@GLOBAL.gtid_executed, '')"
	}
	var set sql.NullString
	if err := db.QueryRowContext(ctx, q).Scan(&set); err == nil && set.String != "" {
		return Start{GTIDSet: strings.ReplaceAll(set.String, "\n", "")}, nil
	}
	return currentPosition(ctx, db)
}
