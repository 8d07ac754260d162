package binlog

import "strings"

// quoteIdent quotes a MySQL identifier with backquotes, doubling any
// inside: the one way this package puts a name into SQL text.
func quoteIdent(name string) string {
	return "`" + strings.ReplaceAll(name, "`", "``") + "`"
}
