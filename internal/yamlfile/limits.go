package yamlfile

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/cachewarden/cachewarden/internal/readfile"
)

// Limits of every file read through this package: the config, rule files
// and rule tests. A file beyond one is refused with an *Error (a
// *readfile.TooLargeError from ReadFile) naming the limit.
const (
	// MaxFileBytes bounds a file's size: 1 MiB.
	MaxFileBytes = 1 << 20
	// MaxDepth bounds how deeply collections nest, aliases followed:
	// 100 levels, room for an event of 64 levels (the CDC decoders'
	// limit) inside a rule test.
	MaxDepth = 100
	// MaxAliasBytes bounds what aliases add to a document: each alias
	// counts the values it names, one byte for each collection and
	// scalar plus the scalar's text, aliases within them followed. 1 MiB:
	// a file may repeat through aliases as much as it may hold.
	MaxAliasBytes = 1 << 20
)

// ReadFile reads the file at path, refusing one of more than
// MaxFileBytes (a *readfile.TooLargeError) after reading at most that
// much, so that /dev/zero or a pipe that never ends is refused too.
func ReadFile(path string) ([]byte, error) {
	return readfile.Read(path, MaxFileBytes)
}

// tooLarge words a file beyond MaxFileBytes given in memory.
func tooLarge(size int) *Error {
	return &Error{Line: 1, Column: 1, Msg: fmt.Sprintf("file is %d bytes, more than the limit of %d", size, MaxFileBytes)}
}

// bounds checks a parsed document against MaxDepth and MaxAliasBytes and
// refuses an alias to a value holding it; it follows aliases, and stops
// at the first problem, so its work is bounded by the document's size
// and MaxAliasBytes.
func bounds(root *yaml.Node) *Error {
	b := &boundsWalk{onPath: map[*yaml.Node]bool{}}
	b.walk(root, 1, nil)
	return b.err
}

type boundsWalk struct {
	aliasBytes int
	onPath     map[*yaml.Node]bool // anchored collections being walked
	err        *Error
}

// walk visits n at depth (1 for the root); via is the alias of the
// document through which n was reached, nil for none: n's bytes then
// count against MaxAliasBytes, and a problem is reported at via.
func (b *boundsWalk) walk(n *yaml.Node, depth int, via *yaml.Node) {
	if b.err != nil || n == nil {
		return
	}
	at := func(format string, args ...any) {
		place := n
		if via != nil {
			place = via
		}
		b.err = &Error{Line: place.Line, Column: place.Column, Msg: "YAML: " + fmt.Sprintf(format, args...)}
	}
	switch n.Kind {
	case yaml.AliasNode:
		switch {
		case n.Alias == nil:
		case b.onPath[n.Alias]:
			at("alias *%s refers to a value that holds it", n.Value)
		case via == nil:
			b.walk(n.Alias, depth, n)
		default:
			b.walk(n.Alias, depth, via)
		}
		return
	case yaml.MappingNode, yaml.SequenceNode:
		if depth > MaxDepth {
			at("nested deeper than the limit of %d levels", MaxDepth)
			return
		}
	}
	if via != nil {
		if b.aliasBytes += 1 + len(n.Value); b.aliasBytes > MaxAliasBytes {
			at("aliases expand to more than %d bytes, the limit", MaxAliasBytes)
			return
		}
	}
	if n.Anchor != "" {
		b.onPath[n] = true
		defer delete(b.onPath, n)
	}
	for _, c := range n.Content {
		b.walk(c, depth+1, via)
	}
}
