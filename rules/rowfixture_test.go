package rules

import "strings"

// RowFixture exports row to the package's external tests.
var RowFixture = row

// row builds a Row from "column=value" specs: null, true, false, 'text'
// (a string), or a number (an int unless it has '.', 'e' or 'E').
func row(specs ...string) Row {
	r := Row{}
	for _, s := range specs {
		name, v, ok := strings.Cut(s, "=")
		if !ok {
			panic("bad row spec " + s)
		}
		var val Value
		switch {
		case v == "null":
		case v == "true":
			val = Value{Kind: KindBool, Text: "1"}
		case v == "false":
			val = Value{Kind: KindBool, Text: "0"}
		case strings.HasPrefix(v, "'") && strings.HasSuffix(v, "'") && len(v) >= 2:
			val = Value{Kind: KindString, Text: v[1 : len(v)-1]}
		case strings.ContainsAny(v, ".eE"):
			val = Value{Kind: KindFloat, Text: v}
		default:
			val = Value{Kind: KindInt, Text: v}
		}
		r = append(r, Column{Name: name, Value: val})
	}
	return r
}
