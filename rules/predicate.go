package rules

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/expr-lang/expr/ast"
	"github.com/expr-lang/expr/file"
	"github.com/expr-lang/expr/parser"
)

// A predicate is a compiled `when` expression (the language and its
// semantics are described on rulefile.ParseFiles). It is evaluated directly on a
// Row, without building an environment or allocating, and is safe for
// concurrent use.
type predicate struct {
	root *pnode
}

type pkind uint8

const (
	pConst pkind = iota + 1
	pAnd
	pOr
	pNot
	pTruthy
	pEq
	pNe
	pLt
	pLe
	pGt
	pGe
	pIn
	pStartsWith
	pEndsWith
	pContains
	pMatches
)

type pnode struct {
	kind     pkind
	constVal bool
	l, r     *pnode
	a, b     operand
	list     []operand
	re       *regexp.Regexp
}

// operand is a column reference or a literal.
type operand struct {
	column string
	isCol  bool
	lit    Value
}

func (o *operand) value(row Row) Value {
	if o.isCol {
		v, _ := row.Get(o.column)
		return v
	}
	return o.lit
}

// holds evaluates the predicate on a row image. A nil predicate holds.
func (p *predicate) holds(row Row) bool {
	if p == nil {
		return true
	}
	return p.root.eval(row)
}

func (n *pnode) eval(row Row) bool {
	switch n.kind {
	case pConst:
		return n.constVal
	case pAnd:
		return n.l.eval(row) && n.r.eval(row)
	case pOr:
		return n.l.eval(row) || n.r.eval(row)
	case pNot:
		return !n.l.eval(row)
	case pTruthy:
		return truthy(n.a.value(row))
	case pEq:
		return predicateEqual(n.a.value(row), n.b.value(row))
	case pNe:
		return !predicateEqual(n.a.value(row), n.b.value(row))
	case pLt, pLe, pGt, pGe:
		a, b := n.a.value(row), n.b.value(row)
		if a.IsNull() || b.IsNull() {
			return false
		}
		c, ok := compareValues(a, b)
		if !ok {
			return false
		}
		switch n.kind {
		case pLt:
			return c < 0
		case pLe:
			return c <= 0
		case pGt:
			return c > 0
		}
		return c >= 0
	case pIn:
		a := n.a.value(row)
		for i := range n.list {
			if predicateEqual(a, n.list[i].value(row)) {
				return true
			}
		}
		return false
	case pStartsWith, pEndsWith, pContains:
		a, b := n.a.value(row), n.b.value(row)
		if a.IsNull() || b.IsNull() {
			return false
		}
		switch n.kind {
		case pStartsWith:
			return strings.HasPrefix(a.Text, b.Text)
		case pEndsWith:
			return strings.HasSuffix(a.Text, b.Text)
		}
		return strings.Contains(a.Text, b.Text)
	case pMatches:
		a := n.a.value(row)
		return !a.IsNull() && n.re.MatchString(a.Text)
	}
	return false
}

// predicateEqual is equalValues, with a shortcut for the most common
// comparison, an integer column against an integer literal: two integers
// written canonically are equal exactly when their texts are.
func predicateEqual(a, b Value) bool {
	if canonicalInt(a) && canonicalInt(b) {
		return a.Text == b.Text
	}
	return equalValues(a, b)
}

// canonicalInt reports whether v is an integer (or boolean) written in the
// one way that has no alternative: digits without leading zeros, and a
// '-' only before a non-zero number.
func canonicalInt(v Value) bool {
	if v.Kind != KindInt && v.Kind != KindBool {
		return false
	}
	t := v.Text
	if len(t) > 1 && t[0] == '-' {
		t = t[1:]
		if t[0] == '0' {
			return false
		}
	}
	if len(t) == 0 || (len(t) > 1 && t[0] == '0') {
		return false
	}
	for i := 0; i < len(t); i++ {
		if t[i]-'0' > 9 {
			return false
		}
	}
	return true
}

// PredicateError is a compile error of a `when` expression at a position
// inside it.
type PredicateError struct {
	// Line is 1-based; Column is the 0-based rune offset in that line.
	Line, Column int
	Msg          string
}

func (e *PredicateError) Error() string { return e.Msg }

// CheckPredicate compiles a `when` expression (see rulefile for the syntax)
// and reports why it cannot be used: nil, or a *PredicateError locating
// the problem inside src.
func CheckPredicate(src string) error {
	_, err := compilePredicate(src)
	return err
}

// Bounds of a `when` expression, checked before expr's parser sees it:
// that parser recurses once for each level of nesting, and a deep enough
// expression (a million '!') overflows the stack, which no recover
// catches.
const (
	// MaxWhenBytes bounds an expression's length: 16 KiB.
	MaxWhenBytes = 16 << 10
	// MaxWhenDepth bounds its nesting: open brackets plus the prefix
	// operators (!, not, -, +) written in a row before them: 32 levels.
	MaxWhenDepth = 32
)

// checkWhenBounds refuses src beyond MaxWhenBytes or MaxWhenDepth with a
// *PredicateError at the place where the limit is passed. It reads src
// once, skipping string literals.
func checkWhenBounds(src string) *PredicateError {
	if len(src) > MaxWhenBytes {
		return &PredicateError{Line: 1, Msg: fmt.Sprintf("expression is %d bytes, more than the limit of %d", len(src), MaxWhenBytes)}
	}
	line, col := 1, 0
	depth, run := 0, 0 // open brackets; prefix operators in a row
	var quote rune     // the quote of the string literal being read, or 0
	escaped := false
	word := false // inside an identifier, number or keyword
	for i, r := range src {
		switch {
		case quote != 0:
			switch {
			case escaped:
				escaped = false
			case r == '\\' && quote != '`':
				escaped = true
			case r == quote:
				quote = 0
			}
		case isWordByte(r) || r == '.' && word:
			if !word {
				word = true
				if rest := src[i:]; strings.HasPrefix(rest, "not") && (len(rest) == 3 || !isWordByte(rune(rest[3]))) {
					run++
				} else {
					run = 0
				}
			}
		default:
			word = false
			switch r {
			case '\'', '"', '`':
				quote, run = r, 0
			case '(', '[', '{':
				depth++
			case ')', ']', '}':
				depth, run = max(depth-1, 0), 0
			case '!', '-', '+':
				if r == '!' && strings.HasPrefix(src[i+1:], "=") {
					run = 0
				} else {
					run++
				}
			case ' ', '\t', '\r', '\n':
			default:
				run = 0
			}
		}
		if depth+run > MaxWhenDepth {
			return &PredicateError{Line: line, Column: col, Msg: fmt.Sprintf("expression nests more than %d levels deep (the limit)", MaxWhenDepth)}
		}
		if r == '\n' {
			line, col = line+1, 0
		} else {
			col++
		}
	}
	return nil
}

// isWordByte reports whether r may be part of an identifier, a number or
// a keyword.
func isWordByte(r rune) bool {
	return r == '_' || r == '$' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z'
}

// compilePredicate checks src's bounds, parses it with expr's parser and
// compiles the subset described on predicate. Errors are
// *PredicateError.
func compilePredicate(src string) (p *predicate, err error) {
	if pe := checkWhenBounds(src); pe != nil {
		return nil, pe
	}
	tree, err := parseExpr(src)
	if err != nil {
		var fe *file.Error
		if errors.As(err, &fe) {
			msg := fe.Message
			if strings.HasPrefix(msg, "invalid integer literal") || msg == "integer literal is too large" {
				msg = "integer literal beyond 64 bits; write it as a string: x == \"18446744073709551616\""
			}
			return nil, &PredicateError{Line: max(fe.Line, 1), Column: max(fe.Column, 0), Msg: msg}
		}
		return nil, &PredicateError{Line: 1, Msg: err.Error()}
	}
	c := compiler{src: src}
	root := c.cond(tree.Node)
	if c.err != nil {
		return nil, c.err
	}
	return &predicate{root: root}, nil
}

// parseExpr runs expr's parser, turning a panic on hostile input into an
// error so that loading never crashes.
func parseExpr(src string) (tree *parser.Tree, err error) {
	defer func() {
		if r := recover(); r != nil {
			tree, err = nil, fmt.Errorf("cannot parse expression: %v", r)
		}
	}()
	return parser.Parse(src)
}

type compiler struct {
	src string
	err *PredicateError
}

// fail records the first error, located at node n.
func (c *compiler) fail(n ast.Node, format string, args ...any) *pnode {
	if c.err != nil {
		return nil
	}
	line, col := 1, 0
	if n != nil {
		from := n.Location().From
		r := 0
		for _, ch := range c.src {
			if r == from {
				break
			}
			if ch == '\n' {
				line++
				col = 0
			} else {
				col++
			}
			r++
		}
	}
	c.err = &PredicateError{Line: line, Column: col, Msg: fmt.Sprintf(format, args...)}
	return nil
}

// cond compiles a node in a boolean position.
func (c *compiler) cond(n ast.Node) *pnode {
	if c.err != nil {
		return nil
	}
	switch n := n.(type) {
	case nil:
		return c.fail(nil, "empty expression")
	case *ast.BoolNode:
		return &pnode{kind: pConst, constVal: n.Value}
	case *ast.IdentifierNode:
		if n.Value == "null" {
			return c.fail(n, "null is not a condition; compare a column with it: x == null")
		}
		return &pnode{kind: pTruthy, a: operand{column: n.Value, isCol: true}}
	case *ast.UnaryNode:
		switch n.Operator {
		case "!", "not":
			return &pnode{kind: pNot, l: c.cond(n.Node)}
		}
		return c.fail(n, "%q does not give a condition; compare the value: x == 1", n.Operator)
	case *ast.BinaryNode:
		return c.binary(n)
	case *ast.IntegerNode, *ast.FloatNode, *ast.StringNode, *ast.NilNode:
		return c.fail(n, "a literal is not a condition; compare a column with it: x == 1")
	}
	return c.fail(n, "%s is not supported in when", describe(n))
}

func (c *compiler) binary(n *ast.BinaryNode) *pnode {
	switch n.Operator {
	case "&&", "and":
		return &pnode{kind: pAnd, l: c.cond(n.Left), r: c.cond(n.Right)}
	case "||", "or":
		return &pnode{kind: pOr, l: c.cond(n.Left), r: c.cond(n.Right)}
	}
	var kind pkind
	switch n.Operator {
	case "==":
		kind = pEq
	case "!=":
		kind = pNe
	case "<":
		kind = pLt
	case "<=":
		kind = pLe
	case ">":
		kind = pGt
	case ">=":
		kind = pGe
	case "startsWith":
		kind = pStartsWith
	case "endsWith":
		kind = pEndsWith
	case "contains":
		kind = pContains
	case "in":
		arr, ok := n.Right.(*ast.ArrayNode)
		if !ok {
			return c.fail(n.Right, "in needs a list literal: x in [1, 2]")
		}
		list := make([]operand, 0, len(arr.Nodes))
		for _, e := range arr.Nodes {
			list = append(list, c.operand(e))
		}
		return &pnode{kind: pIn, a: c.operand(n.Left), list: list}
	case "matches":
		s, ok := n.Right.(*ast.StringNode)
		if !ok {
			return c.fail(n.Right, "matches needs a string literal")
		}
		re, err := regexp.Compile(s.Value)
		if err != nil {
			return c.fail(n.Right, "bad regular expression: %v", err)
		}
		return &pnode{kind: pMatches, a: c.operand(n.Left), re: re}
	default:
		return c.fail(n, "operator %q is not supported in when", n.Operator)
	}
	return &pnode{kind: kind, a: c.operand(n.Left), b: c.operand(n.Right)}
}

// operand compiles a node in a value position.
func (c *compiler) operand(n ast.Node) operand {
	if c.err != nil {
		return operand{}
	}
	switch n := n.(type) {
	case *ast.IdentifierNode:
		if n.Value == "null" {
			return operand{}
		}
		return operand{column: n.Value, isCol: true}
	case *ast.NilNode:
		return operand{}
	case *ast.IntegerNode:
		return operand{lit: Value{Kind: KindInt, Text: strconv.Itoa(n.Value)}}
	case *ast.FloatNode:
		return operand{lit: Value{Kind: KindFloat, Text: strconv.FormatFloat(n.Value, 'g', -1, 64)}}
	case *ast.StringNode:
		return operand{lit: Value{Kind: KindString, Text: n.Value}}
	case *ast.BoolNode:
		t := "0"
		if n.Value {
			t = "1"
		}
		return operand{lit: Value{Kind: KindBool, Text: t}}
	case *ast.UnaryNode:
		if n.Operator == "-" || n.Operator == "+" {
			inner := c.operand(n.Node)
			if c.err != nil {
				return operand{}
			}
			if inner.isCol || (inner.lit.Kind != KindInt && inner.lit.Kind != KindFloat) {
				return c.failOperand(n, "unary %q applies only to number literals", n.Operator)
			}
			if n.Operator == "-" {
				if strings.HasPrefix(inner.lit.Text, "-") {
					inner.lit.Text = inner.lit.Text[1:]
				} else {
					inner.lit.Text = "-" + inner.lit.Text
				}
			}
			return inner
		}
	case nil:
		return c.failOperand(nil, "missing operand")
	}
	return c.failOperand(n, "%s is not supported as a value in when; use a column or a literal", describe(n))
}

func (c *compiler) failOperand(n ast.Node, format string, args ...any) operand {
	c.fail(n, format, args...)
	return operand{}
}

// describe names a node kind for error messages.
func describe(n ast.Node) string {
	switch n := n.(type) {
	case *ast.BinaryNode:
		return fmt.Sprintf("operator %q", n.Operator)
	case *ast.UnaryNode:
		return fmt.Sprintf("operator %q", n.Operator)
	case *ast.CallNode:
		return "a function call"
	case *ast.BuiltinNode:
		return fmt.Sprintf("builtin %s()", n.Name)
	case *ast.MemberNode, *ast.ChainNode:
		return "member access"
	case *ast.ConditionalNode:
		return "a conditional"
	case *ast.ArrayNode:
		return "a list"
	case *ast.MapNode:
		return "a map"
	case *ast.SliceNode:
		return "slicing"
	case *ast.VariableDeclaratorNode:
		return "let"
	case *ast.SequenceNode:
		return "a sequence of expressions"
	case *ast.BytesNode:
		return "a bytes literal"
	case *ast.PointerNode, *ast.PredicateNode:
		return "a predicate"
	case *ast.BoolNode:
		return "a boolean literal"
	}
	return fmt.Sprintf("%T", n)
}
