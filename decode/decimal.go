package decode

import (
	"encoding/base64"
	"math/big"
	"strconv"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// Kafka Connect schema names of decimal columns. With
// decimal.handling.mode=precise, Debezium writes DECIMAL/NUMERIC (and
// BIGINT UNSIGNED) values as base64 of the big-endian two's-complement
// unscaled integer; the scale is only in the schema.
const (
	connectDecimal       = "org.apache.kafka.connect.data.Decimal"
	variableScaleDecimal = "io.debezium.data.VariableScaleDecimal"
	// decimalSuffix ends both names.
	decimalSuffix = "Decimal"
)

// decimalCol is a decimal column found in a message's schema.
type decimalCol struct {
	name     string
	scale    int
	variable bool // VariableScaleDecimal: {"scale":s,"value":"base64"}
}

// applySchemaDecimals rewrites the base64 decimal values of rows a and b
// into exact decimal text, using the scales in the envelope's schema. It
// does nothing without an envelope or when the schema declares no decimal
// columns. Values already written as JSON numbers are left alone.
func (st *decodeState) applySchemaDecimals(f Format, m msg, a, b span) error {
	if m.schema == nil || m.schema.shape != shapeRow {
		return nil
	}
	// Both schema names end in "Decimal", whose rare 'D' is quicker to
	// look for than their common first letters.
	raw := m.schema.val.Text
	if !strings.Contains(raw, decimalSuffix) || (!strings.Contains(raw, connectDecimal) && !strings.Contains(raw, variableScaleDecimal)) {
		return nil
	}
	sc := &st.sc
	sc.i = int(m.schema.off)
	sc.depth = 0
	sc.npath = 0
	sc.pushName("schema")
	if !st.schemaStruct() {
		return st.syntaxError(f)
	}
	if len(st.decimals) == 0 {
		return nil
	}
	for _, sp := range [2]span{a, b} {
		if !sp.present() {
			continue
		}
		for i := sp.lo; i < sp.hi; i++ {
			c := &st.cols[i]
			for _, dc := range st.decimals {
				if dc.name != c.Name {
					continue
				}
				if err := convertDecimal(&c.Value, dc); err != "" {
					return &DecodeError{Format: f, Offset: -1, Path: m.prefix + c.Name, Reason: err}
				}
				break
			}
		}
	}
	return nil
}

// schemaStruct reads a Connect schema object and collects its decimal
// fields into st.decimals: direct fields (a flattened row's schema) and
// the fields of the "before"/"after" structs (an envelope's schema).
func (st *decodeState) schemaStruct() bool {
	sc := &st.sc
	if !sc.beginObject() {
		return false
	}
	for first := true; ; first = false {
		key, ok := sc.nextKey(first)
		if !ok {
			return !sc.failed
		}
		if key != "fields" || sc.peek() != '[' {
			if !sc.skip() {
				return false
			}
			continue
		}
		sc.pushName("fields")
		if !st.schemaFields(0) {
			return false
		}
		sc.pop()
	}
}

// schemaFields reads a "fields" array at sc.i; level 0 is the top struct.
func (st *decodeState) schemaFields(level int) bool {
	sc := &st.sc
	if !sc.enter() {
		return false
	}
	sc.i++
	for first := true; sc.nextElem(first); first = false {
		if !st.schemaField(level) {
			return false
		}
	}
	return !sc.failed
}

// schemaField reads one field schema {"type","name","field","parameters",
// "fields",...}; member order is not fixed.
func (st *decodeState) schemaField(level int) bool {
	sc := &st.sc
	if !sc.beginObject() {
		return false
	}
	mark := len(st.decimals)
	var fieldName, schemaName string
	scale, hasScale := 0, false
	for first := true; ; first = false {
		key, ok := sc.nextKey(first)
		if !ok {
			if sc.failed {
				return false
			}
			break
		}
		switch {
		case key == "field" && sc.peek() == '"':
			if fieldName, ok = sc.str(); !ok {
				return false
			}
		case key == "name" && sc.peek() == '"':
			if schemaName, ok = sc.str(); !ok {
				return false
			}
		case key == "parameters" && sc.peek() == '{':
			if !sc.beginObject() {
				return false
			}
			for pfirst := true; ; pfirst = false {
				pkey, ok := sc.nextKey(pfirst)
				if !ok {
					if sc.failed {
						return false
					}
					break
				}
				v, ok := sc.value()
				if !ok {
					return false
				}
				if pkey == "scale" {
					if n, err := strconv.Atoi(v.Text); err == nil && (v.Kind == rules.KindString || v.Kind == rules.KindInt) {
						scale, hasScale = n, true
					}
				}
			}
		case key == "fields" && level == 0 && sc.peek() == '[':
			if !st.schemaFields(level + 1) {
				return false
			}
		default:
			if !sc.skip() {
				return false
			}
		}
	}
	if level == 0 && fieldName != "before" && fieldName != "after" {
		st.decimals = st.decimals[:mark]
	}
	switch {
	case schemaName == connectDecimal && hasScale && fieldName != "":
		st.decimals = append(st.decimals, decimalCol{name: fieldName, scale: scale})
	case schemaName == variableScaleDecimal && fieldName != "":
		st.decimals = append(st.decimals, decimalCol{name: fieldName, variable: true})
	}
	return true
}

// convertDecimal rewrites v, a base64 Connect decimal (or, for a
// variable-scale decimal, its {"scale","value"} struct), as exact decimal
// text: KindInt when the scale is <= 0, else KindFloat. It returns a
// reason when the value is malformed.
func convertDecimal(v *rules.Value, dc decimalCol) string {
	scale := dc.scale
	b64 := v.Text
	switch {
	case dc.variable && v.Kind == rules.KindJSON:
		var ok bool
		if b64, scale, ok = variableDecimalParts(v.Text); !ok {
			return `variable-scale decimal is not {"scale":n,"value":"base64"}`
		}
	case v.Kind != rules.KindString:
		return ""
	}
	var small [32]byte
	var raw []byte
	if n := base64.StdEncoding.DecodedLen(len(b64)); n <= len(small) {
		raw = small[:n]
	} else {
		raw = make([]byte, n)
	}
	n, err := base64.StdEncoding.Decode(raw, []byte(b64))
	if err != nil || n == 0 {
		return "decimal value is not base64 of an unscaled integer"
	}
	text, kind, problem := unscaledDecimal(raw[:n], scale)
	if problem != "" {
		return problem
	}
	v.Text, v.Kind = text, kind
	return ""
}

// unscaledDecimal renders raw, the big-endian two's-complement unscaled
// integer of a decimal (Kafka Connect's Decimal, in JSON as base64 and in
// Avro as bytes), with scale digits after the decimal point: KindInt when
// the scale is <= 0, else KindFloat. It returns a reason when raw is
// empty or the scale is out of range.
func unscaledDecimal(raw []byte, scale int) (string, rules.Kind, string) {
	if len(raw) == 0 {
		return "", 0, "decimal value has no bytes"
	}
	if scale < -1000 || scale > 1000 {
		return "", 0, "decimal scale " + strconv.Itoa(scale) + " out of range"
	}
	var digits []byte
	var buf [48]byte
	if len(raw) <= 8 {
		var x int64
		if raw[0]&0x80 != 0 {
			x = -1
		}
		for _, c := range raw {
			x = x<<8 | int64(c)
		}
		digits = strconv.AppendInt(buf[:0], x, 10)
	} else {
		x := new(big.Int).SetBytes(raw)
		if raw[0]&0x80 != 0 {
			x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*len(raw))))
		}
		digits = x.Append(buf[:0], 10)
	}
	text, kind := formatDecimal(digits, scale)
	return text, kind, ""
}

// formatDecimal places the decimal point scale digits from the right of an
// integer's digits.
func formatDecimal(digits []byte, scale int) (string, rules.Kind) {
	neg := len(digits) > 0 && digits[0] == '-'
	if neg {
		digits = digits[1:]
	}
	out := make([]byte, 0, len(digits)+4+max(scale, -scale))
	if neg {
		out = append(out, '-')
	}
	switch {
	case scale <= 0:
		out = append(out, digits...)
		if string(digits) != "0" {
			for range -scale {
				out = append(out, '0')
			}
		}
		return string(out), rules.KindInt
	case len(digits) > scale:
		out = append(out, digits[:len(digits)-scale]...)
		out = append(out, '.')
		out = append(out, digits[len(digits)-scale:]...)
	default:
		out = append(out, '0', '.')
		for range scale - len(digits) {
			out = append(out, '0')
		}
		out = append(out, digits...)
	}
	return string(out), rules.KindFloat
}

// variableDecimalParts reads {"scale":n,"value":"base64"}.
func variableDecimalParts(raw string) (b64 string, scale int, ok bool) {
	var sc scanner
	sc.reset(raw, nil)
	if !sc.beginObject() {
		return "", 0, false
	}
	hasScale, hasValue := false, false
	for first := true; ; first = false {
		key, more := sc.nextKey(first)
		if !more {
			break
		}
		v, vok := sc.value()
		if !vok {
			return "", 0, false
		}
		switch key {
		case "scale":
			n, err := strconv.Atoi(v.Text)
			if err != nil || v.Kind != rules.KindInt {
				return "", 0, false
			}
			scale, hasScale = n, true
		case "value":
			if v.Kind != rules.KindString {
				return "", 0, false
			}
			b64, hasValue = v.Text, true
		}
	}
	return b64, scale, !sc.failed && hasScale && hasValue
}
