package check

import (
	"fmt"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/parser"
)

// whenColumn is a column a `when` expression names.
type whenColumn struct {
	name string
	// offset is the 0-based rune offset of the name in the expression.
	offset int
}

// whenColumns returns the columns a `when` expression reads, in order of
// appearance, repeats included: its identifiers other than null (the
// rule loader compiles every other identifier to a column).
func whenColumns(src string) (cols []whenColumn, err error) {
	defer func() {
		if r := recover(); r != nil {
			cols, err = nil, fmt.Errorf("cannot parse expression: %v", r)
		}
	}()
	tree, err := parser.Parse(src)
	if err != nil {
		return nil, err
	}
	v := &identVisitor{}
	ast.Walk(&tree.Node, v)
	return v.cols, nil
}

type identVisitor struct{ cols []whenColumn }

func (v *identVisitor) Visit(n *ast.Node) {
	if id, ok := (*n).(*ast.IdentifierNode); ok && id.Value != "null" {
		v.cols = append(v.cols, whenColumn{name: id.Value, offset: id.Location().From})
	}
}
