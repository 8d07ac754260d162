package decode

import (
	"encoding/base64"
	"encoding/binary"
	"math"
	"slices"
	"strconv"
	"strings"
	"unsafe"

	"github.com/cachewarden/cachewarden/internal/jsonstr"
	"github.com/cachewarden/cachewarden/rules"
)

// Avro messages are decoded with the writer schema their id names (taken
// from Decoder.Schemas, which the daemon fills from the schema registry
// before decoding), straight into the same fields and row arena as JSON
// messages, so that the Debezium envelope and flattened rows are
// interpreted by the same code whatever the encoding: the events, and the
// keys built from them, are those of the same change in JSON.
//
// Values are rendered as Debezium's JSON converter writes them, which is
// what the JSON decoders read:
//   - int and long (io.debezium.time.Date, Timestamp, MicroTimestamp,
//     Time..., Connect's Date and Timestamp): decimal digits, KindInt;
//   - float and double: Java's Float.toString / Double.toString ("1.5",
//     "100.0", "1.0E10"), KindFloat; NaN and infinities as KindString;
//   - string (ZonedTimestamp, Enum, Json...): the string, KindString;
//   - boolean: KindBool "1" or "0";
//   - Connect Decimal and VariableScaleDecimal: exact decimal digits
//     (KindInt for scale <= 0, else KindFloat), as with a JSON schema
//     envelope;
//   - bytes and fixed: standard base64, KindString (the JSON converter's
//     rendering of binary columns);
//   - enum: the symbol, KindString;
//   - a union: the value of its branch (null: KindNull);
//   - records, arrays and maps (Geometry, PostgreSQL arrays): compact
//     JSON text, KindJSON.

// textChunk is the size of the blocks that hold values rendered from
// Avro (numbers, base64): strings handed out from a block are never
// written again, so they stay valid for as long as they are used, like
// the strings that point into a message.
const textChunk = 4096

// text returns a slice of length 0 with room for n bytes, at the end of
// the current block. Append at most n bytes to it and hand the result to
// keep.
func (st *decodeState) text(n int) []byte {
	if n > textChunk/4 {
		return make([]byte, 0, n)
	}
	if cap(st.avroText)-len(st.avroText) < n {
		st.avroText = make([]byte, 0, textChunk)
	}
	return st.avroText[len(st.avroText):len(st.avroText)]
}

// keepText returns b, written into the slice text returned, as a string, and
// marks its bytes used.
func (st *decodeState) keepText(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	if cap(st.avroText) > 0 && unsafe.SliceData(b) == unsafe.SliceData(st.avroText[len(st.avroText):cap(st.avroText)]) {
		st.avroText = st.avroText[:len(st.avroText)+len(b)]
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// avroReader reads an Avro binary body. On failure it records where and
// why; the path of the failing value is collected on the way back up.
type avroReader struct {
	s string
	i int
	// failed is set on the first problem; off and reason describe it,
	// path holds the names of the enclosing fields, innermost first.
	failed bool
	off    int
	reason string
	path   []string
	depth  int
}

// release drops the body r read (see Decoded.Release).
func (r *avroReader) release() {
	r.s = ""
	r.path = dropAll(r.path)
}

func (r *avroReader) fail(off int, reason string) bool {
	if !r.failed {
		r.failed, r.off, r.reason = true, off, reason
	}
	return false
}

// in records that the failure happened inside the field or element name.
func (r *avroReader) in(name string) bool {
	r.path = append(r.path, name)
	return false
}

func (r *avroReader) pathString() string {
	var b strings.Builder
	for i := len(r.path) - 1; i >= 0; i-- {
		p := r.path[i]
		if b.Len() > 0 && p[0] != '[' {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

// long reads a zigzag varint of up to 64 bits (Avro int and long).
func (r *avroReader) long() (int64, bool) {
	start := r.i
	var u uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if r.i >= len(r.s) {
			return 0, r.fail(start, "the body ends inside a number (the message is cut short)")
		}
		c := r.s[r.i]
		r.i++
		u |= uint64(c&0x7f) << shift
		if c < 0x80 {
			if shift == 63 && c > 1 {
				break
			}
			return int64(u>>1) ^ -int64(u&1), true
		}
	}
	return 0, r.fail(start, "a number is longer than 64 bits")
}

// int reads an Avro int: a zigzag varint within 32 bits.
func (r *avroReader) int() (int64, bool) {
	start := r.i
	n, ok := r.long()
	if ok && (n < math.MinInt32 || n > math.MaxInt32) {
		return 0, r.fail(start, "an int is out of the 32-bit range")
	}
	return n, ok
}

// bytes reads a length-prefixed string or bytes value, without copying.
func (r *avroReader) bytes() (string, bool) {
	start := r.i
	n, ok := r.long()
	if !ok {
		return "", false
	}
	if n < 0 {
		return "", r.fail(start, "negative length "+strconv.FormatInt(n, 10))
	}
	if n > int64(len(r.s)-r.i) {
		return "", r.fail(start, "a value of "+strconv.FormatInt(n, 10)+" bytes runs past the end of the body (the message is cut short)")
	}
	b := r.s[r.i : r.i+int(n)]
	r.i += int(n)
	return b, true
}

// fixed reads n bytes.
func (r *avroReader) fixed(n int) (string, bool) {
	if n > len(r.s)-r.i {
		return "", r.fail(r.i, "a fixed value of "+strconv.Itoa(n)+" bytes runs past the end of the body (the message is cut short)")
	}
	b := r.s[r.i : r.i+n]
	r.i += n
	return b, true
}

// branch reads a union's branch index and returns the branch.
func (r *avroReader) branch(t *avroType) (*avroType, bool) {
	start := r.i
	n, ok := r.long()
	if !ok {
		return nil, false
	}
	if n < 0 || n >= int64(len(t.branches)) {
		return nil, r.fail(start, "union branch "+strconv.FormatInt(n, 10)+" does not exist (the union has "+strconv.Itoa(len(t.branches))+")")
	}
	return t.branches[n], true
}

// blockCount reads the item count of an array or map block; a negative
// count is followed by the block's byte size, which is not needed. A
// count larger than the bytes left is refused: items of CDC values take
// at least a byte each, and a count that large could only keep the
// decoder looping.
func (r *avroReader) blockCount() (int64, bool) {
	start := r.i
	n, ok := r.long()
	if !ok {
		return 0, false
	}
	if n < 0 {
		if _, ok := r.long(); !ok {
			return 0, false
		}
		n = -n // MinInt64 stays negative and is refused below
	}
	if n < 0 || n > int64(len(r.s)-r.i) {
		return 0, r.fail(start, "a block of "+strconv.FormatInt(n, 10)+" items is longer than the rest of the body")
	}
	return n, true
}

// maxAvroDepth bounds the nesting of records, arrays, maps and unions:
// recursive types could otherwise nest as deep as the message is long.
const maxAvroDepth = 64

// enter records one more level of nesting; false when too deep.
func (r *avroReader) enter() bool {
	r.depth++
	if r.depth > maxAvroDepth {
		return r.fail(r.i, "values nested more than "+strconv.Itoa(maxAvroDepth)+" deep")
	}
	return true
}

func (r *avroReader) leave() { r.depth-- }

// skip reads past a value of type t.
func (r *avroReader) skip(t *avroType) bool {
	switch t.kind {
	case avroNull:
		return true
	case avroBoolean:
		_, ok := r.fixed(1)
		return ok
	case avroInt:
		_, ok := r.int()
		return ok
	case avroLong, avroEnum:
		_, ok := r.long()
		return ok
	case avroFloat:
		_, ok := r.fixed(4)
		return ok
	case avroDouble:
		_, ok := r.fixed(8)
		return ok
	case avroBytes, avroString:
		_, ok := r.bytes()
		return ok
	case avroFixed:
		_, ok := r.fixed(t.size)
		return ok
	case avroDecimal:
		var ok bool
		if t.size > 0 {
			_, ok = r.fixed(t.size)
		} else {
			_, ok = r.bytes()
		}
		return ok
	case avroUnion:
		b, ok := r.branch(t)
		return ok && r.skip(b)
	case avroRecord, avroVarDecimal:
		if !r.enter() {
			return false
		}
		for i := range t.fields {
			if !r.skip(t.fields[i].t) {
				return r.in(t.fields[i].name)
			}
		}
		r.leave()
		return true
	case avroArray, avroMap:
		if !r.enter() {
			return false
		}
		for {
			n, ok := r.blockCount()
			if !ok {
				return false
			}
			if n == 0 {
				r.leave()
				return true
			}
			for k := int64(0); k < n; k++ {
				if t.kind == avroMap {
					if _, ok := r.bytes(); !ok {
						return false
					}
				}
				if !r.skip(t.elem) {
					return r.in("[" + strconv.FormatInt(k, 10) + "]")
				}
			}
		}
	}
	return r.fail(r.i, "unsupported type")
}

// schema returns the schema of id in d.Schemas, nil when it has none or
// d has no Schemas.
func (d *Decoder) schema(id uint32) *AvroSchema {
	if d.Schemas == nil {
		return nil
	}
	return d.Schemas.Lookup(id)
}

// decodeAvro decodes a Confluent-framed Avro message (value[0] is 0).
func (d *Decoder) decodeAvro(value []byte, pos rules.Position, out *Decoded) error {
	out.Format = FormatAvro
	id, ok := AvroSchemaID(value)
	if !ok {
		return &DecodeError{Format: FormatAvro, Offset: 0, Reason: "Confluent Avro header cut short: " + strconv.Itoa(len(value)) + " bytes, want the magic byte 0 and a 4-byte schema id"}
	}
	sch := d.schema(id)
	switch {
	case sch == nil && d.Schemas == nil:
		return &DecodeError{Format: FormatAvro, Offset: 0, Reason: "Confluent Avro message (magic byte 0, schema id " + strconv.FormatUint(uint64(id), 10) +
			") and no schema registry to read its schema from: the daemon and `replay` from Kafka decode Avro with kafka.schema_registry; `plan` and `replay --file` take JSON lines"}
	case sch == nil:
		return &DecodeError{Format: FormatAvro, Offset: 1, Reason: "schema id " + strconv.FormatUint(uint64(id), 10) + " is unknown to the schema registry"}
	case sch.problem != "":
		return &DecodeError{Format: FormatAvro, Offset: 1, Reason: sch.String() + ": " + sch.problem}
	}

	f := d.Format
	if f != FormatDebezium && f != FormatDebeziumFlat {
		f = sch.format
		if sch.skip != "" {
			out.Skip = sch.skip
			return nil
		}
	}
	st := &out.st
	s := unsafe.String(unsafe.SliceData(value), len(value))
	st.reset(s, value)
	r := &st.avro
	*r = avroReader{s: s, i: avroHeaderLen, path: r.path[:0]}
	st.avroMemo.t = nil
	roles := sch.flatRoles
	if f == FormatDebezium {
		roles = sch.envelopeRoles
	}
	if !st.avroTop(r, sch.root, roles) {
		return st.avroError(r)
	}
	if r.i != len(s) {
		return &DecodeError{Format: FormatAvro, Offset: r.i, Reason: strconv.Itoa(len(s)-r.i) + " bytes after the Avro record of " + sch.String() +
			": the message was not written with this schema"}
	}
	m := msg{fields: st.top, idx: &st.topIdx}
	var err error
	if f == FormatDebezium {
		err = d.debezium(m, pos, out)
	} else {
		err = d.flat(m, pos, out)
	}
	if err != nil {
		if de, ok := err.(*DecodeError); ok {
			de.Format = FormatAvro
			de.Offset = -1 // the offsets of fields are not those of the JSON decoders
		}
		out.Events = out.Events[:0]
		return err
	}
	out.attachImages()
	return nil
}

func (st *decodeState) avroError(r *avroReader) *DecodeError {
	return &DecodeError{Format: FormatAvro, Offset: r.off, Path: r.pathString(), Reason: r.reason}
}

// avroTop reads the top-level record into st.top, each field by its role.
func (st *decodeState) avroTop(r *avroReader, t *avroType, roles []uint8) bool {
	for i := range t.fields {
		af := &t.fields[i]
		f := field{name: af.name, off: int32(r.i)}
		switch roles[i] {
		case roleRow:
			rt := af.t
			if rt.kind == avroUnion {
				b, ok := r.branch(rt)
				if !ok {
					return r.in(af.name)
				}
				rt = b
			}
			if rt.kind == avroNull {
				f.val = rules.Value{Kind: rules.KindNull}
				break
			}
			sp, ok := st.avroRow(r, rt)
			if !ok {
				return r.in(af.name)
			}
			f.shape, f.lo, f.hi = shapeRow, sp.lo, sp.hi
			f.val = rules.Value{Kind: rules.KindJSON}
		case roleSource:
			if !st.avroSource(r, af.t) {
				return r.in(af.name)
			}
			f.shape, f.lo = shapeSource, int32(len(st.sources)-1)
			f.val = rules.Value{Kind: rules.KindJSON}
		case roleSkip:
			if !r.skip(af.t) {
				return r.in(af.name)
			}
			continue
		default:
			v, ok := st.avroValue(r, af.t)
			if !ok {
				return r.in(af.name)
			}
			f.val = v
		}
		if af.key >= 0 {
			st.topIdx[af.key] = int32(len(st.top))
		}
		st.top = append(st.top, f)
	}
	return true
}

// avroRowMemo remembers where the fields of the last row image of a
// message lay, so that the next image of the same record type (the after
// image of an update) takes the values of unchanged fields from it instead
// of rendering them again: most columns of an update are unchanged.
type avroRowMemo struct {
	t *avroType
	// lo is the row's first column in the arena; spans holds the byte
	// range of each field's value in the message, start and end.
	lo    int32
	spans []int32
}

// release forgets the last row (see Decoded.Release), keeping the memory
// of its spans.
func (m *avroRowMemo) release() { *m = avroRowMemo{spans: m.spans[:0]} }

// avroRow reads a record into the column arena, one column per field.
func (st *decodeState) avroRow(r *avroReader, t *avroType) (span, bool) {
	lo := int32(len(st.cols))
	prev := &st.avroMemo
	same := prev.t == t && len(prev.spans) == 2*len(t.fields)
	spans := st.avroSpans[:0]
	for i := range t.fields {
		af := &t.fields[i]
		start := r.i
		var v rules.Value
		ok := true
		if same && af.t.rendered {
			// Compare the bytes before rendering the value.
			if !r.skip(af.t) {
				return absent, r.in(af.name)
			}
			if ps, pe := prev.spans[2*i], prev.spans[2*i+1]; r.s[start:r.i] == r.s[ps:pe] {
				v = st.cols[prev.lo+int32(i)].Value
			} else {
				r.i = start
				v, ok = st.avroValue(r, af.t)
			}
		} else {
			v, ok = st.avroValue(r, af.t)
		}
		if !ok {
			return absent, r.in(af.name)
		}
		spans = append(spans, int32(start), int32(r.i))
		st.addColumn(af.name, v)
	}
	st.avroSpans, prev.spans = prev.spans, spans
	prev.t, prev.lo = t, lo
	return span{lo, int32(len(st.cols))}, true
}

// avroSource reads a Debezium source block into a new entry of
// st.sources.
func (st *decodeState) avroSource(r *avroReader, t *avroType) bool {
	st.sources = append(st.sources, sourceInfo{pos: -1, tsMs: -1, tsSec: -1})
	si := &st.sources[len(st.sources)-1]
	for i := range t.fields {
		af := &t.fields[i]
		if af.key == srcOther {
			if !r.skip(af.t) {
				return r.in(af.name)
			}
			continue
		}
		switch af.key {
		case srcPos, srcTsMs, srcTsSec, srcServerID:
			// Numbers are read as numbers, not rendered as text first.
			if n, isNull, ok := r.number(af.t); !ok {
				return r.in(af.name)
			} else if !isNull {
				si.setNumber(af.key, n)
			}
			continue
		}
		v, ok := st.avroValue(r, af.t)
		if !ok {
			return r.in(af.name)
		}
		si.set(af.key, v)
	}
	return true
}

// number reads an int or long, or a union of null and one of them.
// isNull reports a null; a value of another type is skipped and reported
// as a null.
func (r *avroReader) number(t *avroType) (n int64, isNull, ok bool) {
	if t.kind == avroUnion {
		b, ok := r.branch(t)
		if !ok {
			return 0, false, false
		}
		t = b
	}
	switch t.kind {
	case avroInt:
		n, ok = r.int()
		return n, false, ok
	case avroLong:
		n, ok = r.long()
		return n, false, ok
	}
	return 0, true, r.skip(t)
}

// avroValue reads a value of type t and renders it (see the top of this
// file).
func (st *decodeState) avroValue(r *avroReader, t *avroType) (rules.Value, bool) {
	if t.kind == avroUnion {
		b, ok := r.branch(t)
		if !ok {
			return rules.Value{}, false
		}
		t = b
	}
	switch t.kind {
	case avroNull:
		return rules.Value{}, true
	case avroString:
		s, ok := r.bytes()
		return rules.Value{Kind: rules.KindString, Text: s}, ok
	case avroInt, avroLong:
		var n int64
		var ok bool
		if t.kind == avroInt {
			n, ok = r.int()
		} else {
			n, ok = r.long()
		}
		if !ok {
			return rules.Value{}, false
		}
		if n >= 0 && n < int64(len(smallInts)) {
			return rules.Value{Kind: rules.KindInt, Text: smallInts[n]}, true
		}
		return rules.Value{Kind: rules.KindInt, Text: st.keepText(strconv.AppendInt(st.text(20), n, 10))}, true
	case avroBoolean:
		b, ok := r.fixed(1)
		switch {
		case !ok:
			return rules.Value{}, false
		case b[0] == 0:
			return rules.Value{Kind: rules.KindBool, Text: "0"}, true
		case b[0] == 1:
			return rules.Value{Kind: rules.KindBool, Text: "1"}, true
		}
		return rules.Value{}, r.fail(r.i-1, "a boolean is neither 0 nor 1")
	case avroFloat, avroDouble:
		return st.avroFloat(r, t)
	case avroBytes, avroFixed:
		return st.avroBytes(r, t)
	case avroEnum:
		start := r.i
		n, ok := r.long()
		if !ok {
			return rules.Value{}, false
		}
		if n < 0 || n >= int64(len(t.symbols)) {
			return rules.Value{}, r.fail(start, "enum symbol "+strconv.FormatInt(n, 10)+" does not exist in "+t.name)
		}
		return rules.Value{Kind: rules.KindString, Text: t.symbols[n]}, true
	case avroDecimal, avroVarDecimal:
		return st.avroDecimal(r, t)
	case avroRecord, avroArray, avroMap:
		buf, ok := st.appendAvroJSON(r, t, st.jsonBuf[:0])
		st.jsonBuf = buf
		if !ok {
			return rules.Value{}, false
		}
		return rules.Value{Kind: rules.KindJSON, Text: string(buf)}, true
	}
	return rules.Value{}, r.fail(r.i, "unsupported type "+t.kindName())
}

// avroFloat reads a float or double of type t as Java prints it (NaN and
// the infinities as strings).
func (st *decodeState) avroFloat(r *avroReader, t *avroType) (rules.Value, bool) {
	var f float64
	bits := 32
	if t.kind == avroFloat {
		b, ok := r.fixed(4)
		if !ok {
			return rules.Value{}, false
		}
		f = float64(math.Float32frombits(binary.LittleEndian.Uint32([]byte(b))))
	} else {
		b, ok := r.fixed(8)
		if !ok {
			return rules.Value{}, false
		}
		f, bits = math.Float64frombits(binary.LittleEndian.Uint64([]byte(b))), 64
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return rules.Value{Kind: rules.KindString, Text: javaNonFinite(f)}, true
	}
	return rules.Value{Kind: rules.KindFloat, Text: st.keepText(appendJavaFloat(st.text(32), f, bits))}, true
}

// avroBytes reads bytes or a fixed of type t, as base64 text.
func (st *decodeState) avroBytes(r *avroReader, t *avroType) (rules.Value, bool) {
	var b string
	var ok bool
	if t.kind == avroFixed {
		b, ok = r.fixed(t.size)
	} else {
		b, ok = r.bytes()
	}
	if !ok {
		return rules.Value{}, false
	}
	enc := base64.StdEncoding.AppendEncode(st.text(base64.StdEncoding.EncodedLen(len(b))), []byte(b))
	return rules.Value{Kind: rules.KindString, Text: st.keepText(enc)}, true
}

// smallInts are the texts of 0..99, which need no memory of their own.
var smallInts = func() (s [100]string) {
	for i := range s {
		s[i] = strconv.Itoa(i)
	}
	return s
}()

// avroDecimal reads a Connect Decimal or a VariableScaleDecimal as exact
// decimal text.
func (st *decodeState) avroDecimal(r *avroReader, t *avroType) (rules.Value, bool) {
	start := r.i
	scale := t.scale
	var raw string
	var ok bool
	switch {
	case t.kind == avroVarDecimal:
		var n int64
		if n, ok = r.int(); !ok {
			return rules.Value{}, r.in("scale")
		}
		scale = int(n)
		if raw, ok = r.bytes(); !ok {
			return rules.Value{}, r.in("value")
		}
	case t.size > 0:
		raw, ok = r.fixed(t.size)
	default:
		raw, ok = r.bytes()
	}
	if !ok {
		return rules.Value{}, false
	}
	text, kind, problem := unscaledDecimal([]byte(raw), scale)
	if problem != "" {
		return rules.Value{}, r.fail(start, problem)
	}
	return rules.Value{Kind: kind, Text: text}, true
}

// appendAvroJSON renders a value of type t as compact JSON, the way
// Kafka Connect's JSON converter writes it (strings escaped as the plan
// output escapes them).
func (st *decodeState) appendAvroJSON(r *avroReader, t *avroType, b []byte) ([]byte, bool) {
	if !r.enter() {
		return b, false
	}
	b, ok := st.appendAvroJSONValue(r, t, b)
	r.leave()
	return b, ok
}

// appendAvroJSONValue is appendAvroJSON one level down.
func (st *decodeState) appendAvroJSONValue(r *avroReader, t *avroType, b []byte) ([]byte, bool) {
	switch t.kind {
	case avroUnion:
		br, ok := r.branch(t)
		if !ok {
			return b, false
		}
		return st.appendAvroJSON(r, br, b)
	case avroRecord:
		b = append(b, '{')
		for i := range t.fields {
			af := &t.fields[i]
			if i > 0 {
				b = append(b, ',')
			}
			b = jsonstr.Append(b, af.name)
			b = append(b, ':')
			var ok bool
			if b, ok = st.appendAvroJSON(r, af.t, b); !ok {
				return b, r.in(af.name)
			}
		}
		return append(b, '}'), true
	case avroArray, avroMap:
		return st.appendAvroJSONBlocks(r, t, b)
	case avroDecimal:
		// The JSON converter writes a Decimal inside a struct as the
		// base64 of its unscaled bytes (decimal.format BASE64).
		var raw string
		var ok bool
		if t.size > 0 {
			raw, ok = r.fixed(t.size)
		} else {
			raw, ok = r.bytes()
		}
		if !ok {
			return b, false
		}
		b = append(b, '"')
		b = base64.StdEncoding.AppendEncode(b, []byte(raw))
		return append(b, '"'), true
	}
	v, ok := st.avroValue(r, t)
	if !ok {
		return b, false
	}
	switch v.Kind {
	case rules.KindNull:
		return append(b, "null"...), true
	case rules.KindBool:
		if v.Text == "1" {
			return append(b, "true"...), true
		}
		return append(b, "false"...), true
	case rules.KindInt, rules.KindFloat:
		if t.kind == avroVarDecimal {
			return jsonstr.Append(b, v.Text), true
		}
		return append(b, v.Text...), true
	}
	return jsonstr.Append(b, v.Text), true
}

// appendAvroJSONBlocks appends the array or map of type t, read block by
// block, as a JSON array or object.
func (st *decodeState) appendAvroJSONBlocks(r *avroReader, t *avroType, b []byte) ([]byte, bool) {
	open, closing := byte('['), byte(']')
	if t.kind == avroMap {
		open, closing = '{', '}'
	}
	b = append(b, open)
	k := int64(0)
	for {
		n, ok := r.blockCount()
		if !ok {
			return b, false
		}
		if n == 0 {
			return append(b, closing), true
		}
		for range n {
			if k > 0 {
				b = append(b, ',')
			}
			if t.kind == avroMap {
				key, ok := r.bytes()
				if !ok {
					return b, false
				}
				b = jsonstr.Append(b, key)
				b = append(b, ':')
			}
			if b, ok = st.appendAvroJSON(r, t.elem, b); !ok {
				return b, r.in("[" + strconv.FormatInt(k, 10) + "]")
			}
			k++
		}
	}
}

// javaNonFinite is how Java's Double.toString writes NaN and infinities.
func javaNonFinite(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case f > 0:
		return "Infinity"
	}
	return "-Infinity"
}

// appendJavaFloat appends finite f as Java's Double.toString (bits 64) or
// Float.toString (bits 32) writes it, which is how Kafka Connect's JSON
// converter writes FLOAT64 and FLOAT32 values: the shortest digits that
// read back as f; plain notation with at least one digit after the point
// for magnitudes in [1e-3, 1e7), else d.dddE±n.
func appendJavaFloat(b []byte, f float64, bits int) []byte {
	if f == 0 {
		if math.Signbit(f) {
			return append(b, "-0.0"...)
		}
		return append(b, "0.0"...)
	}
	var tmp [32]byte
	e := strconv.AppendFloat(tmp[:0], f, 'e', -1, bits) // -d.ddde±XX
	if e[0] == '-' {
		b = append(b, '-')
		e = e[1:]
	}
	mant, exp, _ := strings.Cut(unsafe.String(unsafe.SliceData(e), len(e)), "e")
	digits := strings.Replace(mant, ".", "", 1)
	x, _ := strconv.Atoi(exp)
	if x >= -3 && x < 7 {
		if x < 0 {
			b = append(b, "0."...)
			for range -x - 1 {
				b = append(b, '0')
			}
			return append(b, digits...)
		}
		if len(digits) <= x+1 {
			b = append(b, digits...)
			for range x + 1 - len(digits) {
				b = append(b, '0')
			}
			return append(b, ".0"...)
		}
		b = append(b, digits[:x+1]...)
		b = append(b, '.')
		return append(b, digits[x+1:]...)
	}
	b = append(b, digits[0], '.')
	if len(digits) == 1 {
		b = append(b, '0')
	} else {
		b = append(b, digits[1:]...)
	}
	b = append(b, 'E')
	return strconv.AppendInt(b, int64(x), 10)
}

// KeyColumns is the package function KeyColumns for the message keys of
// the decoder's topics: a Confluent-framed Avro key names the fields of
// its record schema (Debezium's key: the primary key, or the columns of
// message.key.columns), when its schema is in d.Schemas and its body
// reads with it; anything else is read as JSON.
func (d *Decoder) KeyColumns(key []byte) (cols []string, perTable, ok bool) {
	id, framed := AvroSchemaID(key)
	if !framed {
		return KeyColumns(key)
	}
	sch := d.schema(id)
	if sch == nil || sch.problem != "" || len(sch.keyColumns) == 0 {
		return nil, false, false
	}
	r := avroReader{s: unsafe.String(unsafe.SliceData(key), len(key)), i: avroHeaderLen}
	if !r.skip(sch.root) || r.i != len(r.s) {
		return nil, false, false
	}
	return slices.Clone(sch.keyColumns), false, true
}
