package decode

import (
	"math"
	"slices"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// A message is read in one pass into a shallow tree: the members of the
// top-level object (and of an envelope's "payload") become fields; object
// members become rows in the column arena; arrays of objects become lists
// of rows; anything deeper is kept as raw JSON text. The format decoders
// then read fields by name and take row images straight from the arena.

// Shapes of a field's value.
const (
	shapeScalar   = iota // string, number, bool or null in val
	shapeRow             // object parsed into cols[lo:hi]
	shapeRows            // array of objects parsed into rows[lo:hi]
	shapeArray           // any other array (raw text only)
	shapeFields          // the envelope payload, parsed into inner[lo:hi]
	shapeSource          // a Debezium "source" object, read into sources[lo]
	shapeManyRows        // array of more than MaxMessageRows objects, the first ones in rows[lo:hi]
)

// MaxMessageRows bounds the rows of one message (Canal's data and old
// arrays): the memory a message takes grows with its rows (up to about
// 3 KB each while it is decoded, planned and coalesced, beside about 8
// times its size; docs/operations.md, "Memory per message"), so a
// message of more rows is poison rather than a cost without bound. The
// rows beyond it are validated, not stored. No producer
// cachewarden reads writes that many: Canal writes a message per binary
// log rows event (8 KB of rows by default).
const MaxMessageRows = 10_000

// field is one member of the top-level (or payload) object.
type field struct {
	name string
	// val is the value; objects and arrays are KindJSON with raw text.
	val    rules.Value
	off    int32
	shape  uint8
	lo, hi int32
}

// Keys the decoders look up, indexed while parsing.
const (
	kSchema = iota
	kPayload
	kBefore
	kAfter
	kSource
	kOp
	kTsMs
	kStatus
	kEventCount
	kDataCollections
	kDDL
	kDatabaseName
	kTableChanges
	kDatabase
	kTable
	kType
	kData
	kOld
	kTs
	kPosition
	kGTID
	kServerID
	kEncrypted
	kIsDdl
	kEs
	kMysqlType
	kSQLType
	kFlatOp
	kFlatDeleted
	nKeys
)

func keyID(name string) int {
	switch name {
	case "schema":
		return kSchema
	case "payload":
		return kPayload
	case "before":
		return kBefore
	case "after":
		return kAfter
	case "source":
		return kSource
	case "op":
		return kOp
	case "ts_ms":
		return kTsMs
	case "status":
		return kStatus
	case "event_count":
		return kEventCount
	case "data_collections":
		return kDataCollections
	case "ddl":
		return kDDL
	case "databaseName":
		return kDatabaseName
	case "tableChanges":
		return kTableChanges
	case "database":
		return kDatabase
	case "table":
		return kTable
	case "type":
		return kType
	case "data":
		return kData
	case "old":
		return kOld
	case "ts":
		return kTs
	case "position":
		return kPosition
	case "gtid":
		return kGTID
	case "server_id":
		return kServerID
	case "encrypted":
		return kEncrypted
	case "isDdl":
		return kIsDdl
	case "es":
		return kEs
	case "mysqlType":
		return kMysqlType
	case "sqlType":
		return kSQLType
	case "__op":
		return kFlatOp
	case "__deleted":
		return kFlatDeleted
	}
	return -1
}

// keyIndex maps a known key to the index of its (last) field, or -1.
type keyIndex [nKeys]int32

func (x *keyIndex) reset() { *x = noKeys }

// noKeys is the keyIndex of an object without known keys.
var noKeys = func() (x keyIndex) {
	for i := range x {
		x[i] = -1
	}
	return x
}()

// msg is the object a format decoder reads: the top level or the
// envelope payload.
type msg struct {
	fields []field
	idx    *keyIndex
	// prefix is prepended to error paths ("payload." inside an envelope).
	prefix string
	// schema is the envelope's "schema" field, nil without an envelope.
	schema *field
}

func (m msg) get(k int) *field {
	if i := m.idx[k]; i >= 0 {
		return &m.fields[i]
	}
	return nil
}

func (m msg) has(k int) bool { return m.idx[k] >= 0 }

// str returns the string value of key k ("" unless it is a string) and
// the field itself (nil when absent).
func (m msg) str(k int) (string, *field) {
	f := m.get(k)
	if f == nil || f.val.Kind != rules.KindString {
		return "", f
	}
	return f.val.Text, f
}

// detect picks the format of m from its keys (see Decoder.Decode).
func (m msg) detect() (Format, error) {
	switch {
	case m.has(kFlatOp) || m.has(kFlatDeleted):
		return FormatDebeziumFlat, nil
	case m.has(kOp) && (m.has(kBefore) || m.has(kAfter) || m.has(kSource)):
		return FormatDebezium, nil
	case m.has(kIsDdl):
		return FormatCanal, nil
	}
	if f := m.get(kData); f != nil && (f.shape == shapeRows || f.shape == shapeArray || f.shape == shapeManyRows) {
		return FormatCanal, nil
	}
	switch {
	case m.has(kType) && (m.has(kData) || m.has(kDatabase) || m.has(kTable) || m.has(kEncrypted)):
		return FormatMaxwell, nil
	case m.has(kEncrypted) && len(m.fields) == 1:
		return FormatMaxwell, nil
	case m.debeziumSkip() != "":
		return FormatDebezium, nil
	}
	var b strings.Builder
	b.WriteString("unrecognised change-event format (top-level keys:")
	for i, f := range m.fields {
		if i == 8 {
			b.WriteString(" ...")
			break
		}
		b.WriteString(" ")
		b.WriteString(f.name)
	}
	b.WriteString(`); a flattened Debezium row needs "__op" or "__deleted" to be detected, or format debezium-flat`)
	return FormatAuto, &DecodeError{Format: FormatAuto, Offset: -1, Path: strings.TrimSuffix(m.prefix, "."), Reason: b.String()}
}

// debeziumSkip classifies Debezium records that carry no row change.
func (m msg) debeziumSkip() string {
	switch {
	case m.has(kStatus) && (m.has(kEventCount) || m.has(kDataCollections)):
		return SkipTransaction
	case m.has(kDDL) && (m.has(kTableChanges) || m.has(kDatabaseName)):
		return SkipSchemaChange
	case len(m.fields) == 1 && m.has(kTsMs):
		return SkipHeartbeat
	}
	return ""
}

// fields parses the object at sc.i into *dst, indexing known keys in idx.
// Object members become rows, arrays of objects lists of rows; with
// envelope set, a "payload" object is parsed as fields into st.inner.
func (st *decodeState) fields(dst *[]field, idx *keyIndex, envelope bool) bool {
	sc := &st.sc
	i, empty, ok := sc.openObject()
	if !ok || empty {
		return ok
	}
	s, b := sc.s, sc.b
	kc := &st.keys
	cur := int32(objPayload)
	if envelope {
		cur = objTop
	}
	for {
		var key string
		var k, klo, khi int
		var dup bool
		node := kc.first(b, cur, i)
		if node < 0 {
			node = kc.lookup(b, cur, i)
		}
		if node >= 0 {
			nd := &kc.nodes[node]
			key, k, dup, cur = nd.name, int(nd.id), nd.dup, node
			klo = i + 1
			i += nd.n
			khi = i - 2
		} else {
			var ok bool
			if key, cur, klo, khi, i, ok = st.memberName(i, cur, objPayload); !ok {
				return false
			}
			k = keyID(key)
			dup = cur < 0 || kc.nodes[cur].dup
		}
		if i < len(s) && s[i] <= ' ' {
			i = wsEnd(s, i)
		}
		sc.i = i
		sc.pushKey(klo, khi)
		f := field{name: key, off: int32(i)}
		// Strings and numbers, most members, are read here, the rest
		// apart.
		switch c := byteAt(s, i); {
		case c == '"':
			t, ok := sc.str()
			if !ok {
				return false
			}
			f.val = rules.Value{Kind: rules.KindString, Text: t}
		case c == '-' || c-'0' <= 9:
			end, kind, problem := numberEnd(s, i)
			if problem != "" {
				return sc.fail(i, problem)
			}
			sc.i = end
			f.val = rules.Value{Kind: kind, Text: s[i:end]}
		case !st.memberValue(&f, k, envelope):
			return false
		}
		sc.pop()
		n := len(*dst)
		if dup {
			n = fieldIndex(*dst, key)
		}
		if k >= 0 {
			idx[k] = int32(n)
		}
		setField(dst, n, &f)
		if i = sc.i; i+1 < len(s) && s[i] == ',' && s[i+1] > ' ' {
			i++ // the next member follows at once
			continue
		}
		var more bool
		if i, more = sc.memberEnd(i); !more {
			return !sc.failed
		}
	}
}

// memberValue reads the value of the member at sc.i, whose key id is k
// (payload and source are read apart; envelope: the object is a message's
// top level), into f.
func (st *decodeState) memberValue(f *field, k int, envelope bool) bool {
	sc := &st.sc
	s, i := sc.s, sc.i
	start := i
	var ok bool
	var c byte
	if i < len(s) {
		c = s[i]
	}
	switch c {
	case '{':
		if envelope && k == kPayload {
			// A later payload replaces an earlier one.
			st.inner = st.inner[:0]
			st.innerIdx.reset()
			if !st.fields(&st.inner, &st.innerIdx, false) {
				return false
			}
			f.shape, f.lo, f.hi = shapeFields, 0, int32(len(st.inner))
		} else if k == kSource {
			// Only its position fields matter: read them without
			// storing the block as a row.
			if !st.source() {
				return false
			}
			f.shape, f.lo, f.hi = shapeSource, int32(len(st.sources)-1), 0
		} else {
			r, ok := st.row()
			if !ok {
				return false
			}
			f.shape, f.lo, f.hi = shapeRow, r.lo, r.hi
		}
		f.val = rules.Value{Kind: rules.KindJSON, Text: sc.s[start:sc.i]}
	case '[':
		if !st.array(f) {
			return false
		}
		f.val = rules.Value{Kind: rules.KindJSON, Text: sc.s[start:sc.i]}
	case '"':
		t, ok := sc.str()
		if !ok {
			return false
		}
		f.val = rules.Value{Kind: rules.KindString, Text: t}
	default:
		if f.val, ok = sc.value(); !ok {
			return false
		}
	}
	return true
}

// fieldIndex returns the index of the member named key in dst, len(dst)
// when there is none: of duplicate members the last value counts, as in
// encoding/json, in the place of the first.
func fieldIndex(dst []field, key string) int {
	for j := range dst {
		if dst[j].name == key {
			return j
		}
	}
	return len(dst)
}

// setField stores f at index n of dst, n at most len(dst), copying it
// field by field (see addColumn).
func setField(dst *[]field, n int, f *field) {
	if n == len(*dst) {
		if n == cap(*dst) {
			*dst = append(*dst, field{})
		} else {
			*dst = (*dst)[:n+1]
		}
	}
	d := &(*dst)[n]
	d.name = f.name
	d.val.Kind = f.val.Kind
	d.val.Text = f.val.Text
	d.off, d.shape, d.lo, d.hi = f.off, f.shape, f.lo, f.hi
}

// releaseFields drops what the parsed members, columns and sources hold
// of the message (see Decoded.Release).
func (st *decodeState) releaseFields() {
	st.top, st.inner, st.cols = dropAll(st.top), dropAll(st.inner), dropAll(st.cols)
	st.sources = dropAll(st.sources)
}

// sourceInfo is what a Debezium "source" block says about a change.
type sourceInfo struct {
	db, schema, table string
	file, gtid        string
	pos, tsMs, tsSec  int64  // -1 when absent
	serverID          uint32 // 0 when absent (and in snapshot rows)
	snapshot          bool
}

// source reads a Debezium "source" object at sc.i into a new entry of
// st.sources. Members other than the position fields are only validated.
//
// Like row, it keeps the offset in a local and reads the members inline:
// a source block is about as long as a row image.
func (st *decodeState) source() bool {
	sc := &st.sc
	st.sources = append(st.sources, sourceInfo{pos: -1, tsMs: -1, tsSec: -1})
	si := &st.sources[len(st.sources)-1]
	i, empty, ok := sc.openObject()
	if !ok || empty {
		return ok
	}
	s, b := sc.s, sc.b
	kc := &st.keys
	cur := int32(objSource)
	for {
		var k, klo, khi int
		node := kc.first(b, cur, i)
		if node < 0 {
			node = kc.lookup(b, cur, i)
		}
		if node >= 0 {
			nd := &kc.nodes[node]
			k, cur = int(nd.id), node
			klo = i + 1
			i += nd.n
			khi = i - 2
		} else {
			key, node, lo, hi, end, ok := st.memberName(i, cur, objSource)
			if !ok {
				return false
			}
			k, cur, klo, khi, i = sourceKey(key), node, lo, hi, end
		}
		if i < len(s) && s[i] <= ' ' {
			i = wsEnd(s, i)
		}
		sc.i = i
		// Members no one reads, strings and plain integers, most members,
		// are read here, the rest apart.
		switch c := byteAt(s, i); {
		case k == srcOther:
			// Validated only; its key stays out of the error path.
			if c == '"' {
				if !sc.skipStr() {
					return false
				}
			} else if !sc.skip() {
				return false
			}
		case c == '"' && k != srcSnapshot:
			t, ok := sc.str()
			if !ok {
				return sc.failedIn(klo, khi)
			}
			si.set(k, rules.Value{Kind: rules.KindString, Text: t})
		case c-'0' <= 9 && k >= srcPos:
			if n, end, ok := plainInt(s, i); ok {
				sc.i = end
				si.setInt(k, n)
				break
			}
			fallthrough
		default:
			if !st.sourceValue(si, k, klo, khi) {
				return false
			}
		}
		if i = sc.i; i+1 < len(s) && s[i] == ',' && s[i+1] > ' ' {
			i++ // the next member follows at once
			continue
		}
		var more bool
		if i, more = sc.memberEnd(i); !more {
			return !sc.failed
		}
	}
}

// sourceValue reads the JSON value at sc.i of the source member of id k,
// its key s[klo:khi], into si.
func (st *decodeState) sourceValue(si *sourceInfo, k, klo, khi int) bool {
	sc := &st.sc
	sc.pushKey(klo, khi)
	v, ok := sc.value()
	if !ok {
		return false
	}
	sc.pop()
	si.set(k, v)
	return true
}

// Members of a Debezium "source" block that sourceInfo keeps.
const (
	srcOther = iota
	srcDB
	srcSchema
	srcTable
	srcFile
	srcGTID
	srcSnapshot
	// The numeric members, last.
	srcPos
	srcTsMs
	srcTsSec
	srcServerID
)

func sourceKey(key string) int {
	switch key {
	case "db":
		return srcDB
	case "schema":
		return srcSchema
	case "table":
		return srcTable
	case "file":
		return srcFile
	case "gtid":
		return srcGTID
	case "pos":
		return srcPos
	case "ts_ms":
		return srcTsMs
	case "ts_sec":
		return srcTsSec
	case "snapshot":
		return srcSnapshot
	case "server_id":
		return srcServerID
	}
	return srcOther
}

// set records the value v of the member k.
func (si *sourceInfo) set(k int, v rules.Value) {
	str := ""
	if v.Kind == rules.KindString {
		str = v.Text
	}
	switch k {
	case srcDB:
		si.db = str
	case srcSchema:
		si.schema = str
	case srcTable:
		si.table = str
	case srcFile:
		si.file = str
	case srcGTID:
		si.gtid = str
	case srcPos, srcTsMs, srcTsSec:
		if n, ok := parseInt64(v); ok {
			si.setNumber(k, n)
		}
	case srcServerID:
		si.serverID = parseServerID(v)
	case srcSnapshot:
		si.snapshot = isSnapshotMarker(v)
	}
}

// setInt records n, read from JSON as an integer, as the value of the
// numeric member k (srcPos, srcTsMs, srcTsSec or srcServerID), as set
// does.
func (si *sourceInfo) setInt(k int, n int64) {
	if k == srcServerID && (n <= 0 || n > math.MaxUint32) {
		si.serverID = 0
		return
	}
	si.setNumber(k, n)
}

// plainInt reads the JSON number at s[i] when it is an integer of 1 to 18
// digits without a sign, fraction or exponent (what shortDigits reads),
// and returns it with the offset after it; ok is false for any other
// number, valid or not, which the caller reads the ordinary way.
func plainInt(s string, i int) (n int64, end int, ok bool) {
	j := i
	for ; j < len(s); j++ {
		d := s[j] - '0'
		if d > 9 {
			break
		}
		n = n*10 + int64(d)
	}
	if d := j - i; d == 0 || d > 18 || (d > 1 && s[i] == '0') {
		return 0, i, false
	}
	if j < len(s) && (s[j] == '.' || s[j]|0x20 == 'e') {
		return 0, i, false
	}
	return n, j, true
}

// setNumber records n as the value of the numeric member k (srcPos,
// srcTsMs, srcTsSec or srcServerID), read from a binary encoding.
func (si *sourceInfo) setNumber(k int, n int64) {
	switch k {
	case srcPos:
		si.pos = n
	case srcTsMs:
		si.tsMs = n
	case srcTsSec:
		si.tsSec = n
	case srcServerID:
		if n > 0 && n <= math.MaxUint32 {
			si.serverID = uint32(n)
		}
	}
}

// array parses the array at sc.i. When every element is an object, the
// elements become rows and f.shape is shapeRows (shapeManyRows, beyond
// MaxMessageRows of them); otherwise shapeArray.
func (st *decodeState) array(f *field) bool {
	sc := &st.sc
	if !sc.enter() {
		return false
	}
	sc.i++
	f.shape = shapeRows
	f.lo = int32(len(st.rows))
	n := 0
	for first := true; sc.nextElem(first); first = false {
		sc.pushElem(n)
		isObject := f.shape != shapeArray && sc.i < len(sc.s) && sc.s[sc.i] == '{'
		if isObject && n >= MaxMessageRows {
			f.shape = shapeManyRows
			if !sc.skip() {
				return false
			}
		} else if isObject {
			r, ok := st.row()
			if !ok {
				return false
			}
			if len(st.rows) == cap(st.rows) {
				st.rows = slices.Grow(st.rows, max(len(st.rows), 16)) // double (see addColumn)
			}
			st.rows = append(st.rows, r)
		} else {
			f.shape = shapeArray
			if !sc.skip() {
				return false
			}
		}
		sc.pop()
		n++
	}
	f.hi = int32(len(st.rows))
	return !sc.failed
}

// row parses the object at sc.i into the column arena. Nested objects and
// arrays become KindJSON values with their raw text. Columns that st.keep
// leaves out are validated and skipped.
//
// This is the hot loop of decoding: it keeps the offset in a local and
// reads strings and numbers inline (columnValue), falling back to the
// scanner's methods for anything else.
func (st *decodeState) row() (span, bool) {
	sc := &st.sc
	if cap(st.cols)-len(st.cols) < rowRoom {
		st.growCols()
	}
	lo := int32(len(st.cols))
	i, empty, ok := sc.openObject()
	switch {
	case !ok:
		return absent, false
	case empty:
		return span{lo, lo}, true
	}
	s, b := sc.s, sc.b
	kc := &st.keys
	cur := int32(objRow)
	for {
		var key string
		var klo, khi int
		var keep, dup bool
		node := kc.first(b, cur, i)
		if node < 0 {
			node = kc.lookup(b, cur, i)
		}
		if node >= 0 {
			nd := &kc.nodes[node]
			key, keep, dup, cur = nd.name, nd.keep, nd.dup, node
			klo = i + 1
			i += nd.n
			khi = i - 2
		} else {
			var ok bool
			if key, cur, klo, khi, i, ok = st.memberName(i, cur, objRow); !ok {
				return absent, false
			}
			if cur >= 0 {
				keep, dup = kc.nodes[cur].keep, kc.nodes[cur].dup
			} else {
				// Not remembered: the name may have come before.
				keep, dup = st.keep == nil || st.keep.Has(key), true
			}
		}
		if i < len(s) && s[i] <= ' ' {
			i = wsEnd(s, i)
		}
		// The column's key joins the error path only when its value
		// fails (failedIn): reading a value pushes no path of its own.
		if !keep {
			// A column no rule reads: validated, not stored.
			var ok bool
			if i, ok = sc.skipAt(i); !ok {
				return absent, sc.failedIn(klo, khi)
			}
		} else {
			v, end, ok := st.columnValue(i)
			if i = end; !ok {
				return absent, sc.failedIn(klo, khi)
			}
			if !dup || !st.replaceColumn(lo, key, v) {
				st.addColumn(key, v)
			}
		}
		if i+1 < len(s) && s[i] == ',' && s[i+1] > ' ' {
			i++ // the next member follows at once
			continue
		}
		var more bool
		if i, more = sc.memberEnd(i); more {
			continue
		}
		if sc.failed {
			return absent, false
		}
		return span{lo, int32(len(st.cols))}, true
	}
}

// columnValue reads the value of a row's column at offset i and returns
// it with the offset after it; ok is false after a syntax error.
func (st *decodeState) columnValue(i int) (v rules.Value, end int, ok bool) {
	sc := &st.sc
	s := sc.s
	switch {
	case i >= len(s):
		sc.i = i
		return v, i, sc.failAt("expected a JSON value")
	case s[i] == '"':
		sc.i = i
		if v.Text, ok = sc.str(); !ok {
			return v, i, false
		}
		v.Kind = rules.KindString
		return v, sc.i, true
	case s[i] == '-' || s[i]-'0' <= 9:
		end, kind, problem := numberEnd(s, i)
		if problem != "" {
			return v, i, sc.fail(i, problem)
		}
		return rules.Value{Kind: kind, Text: s[i:end]}, end, true
	default:
		sc.i = i
		if v, ok = sc.value(); !ok {
			return v, i, false
		}
		return v, sc.i, true
	}
}

// rowRoom is the free room in the column arena that row makes sure of
// before reading a row.
const rowRoom = 32

// growCols doubles the capacity of the column arena. Appending alone
// would grow it by a quarter at a time once it is large, which for a
// message of many rows allocates about five times the arena; row calls it
// when the arena is nearly full, so addColumn stays small enough to be
// inlined.
//
//go:noinline
func (st *decodeState) growCols() {
	st.cols = slices.Grow(st.cols, max(len(st.cols), rowRoom))
}

// replaceColumn gives the column named name of the row that starts at
// cols[lo] the value v, and reports whether the row had one: of duplicate
// members of an object, the last one's value counts (as in encoding/json),
// at the place of the first.
func (st *decodeState) replaceColumn(lo int32, name string, v rules.Value) bool {
	for i := int(lo); i < len(st.cols); i++ {
		if c := &st.cols[i]; c.Name == name {
			c.Value = v
			return true
		}
	}
	return false
}

// addColumn appends a column to the arena. Writing the fields in place
// rather than appending a composite value keeps the GC's write barrier on
// its fast path.
func (st *decodeState) addColumn(name string, v rules.Value) {
	n := len(st.cols)
	if n == cap(st.cols) {
		st.cols = append(st.cols, rules.Column{})
	} else {
		st.cols = st.cols[:n+1]
	}
	c := &st.cols[n]
	c.Name = name
	c.Value.Kind = v.Kind
	c.Value.Text = v.Text
}

// rowOf returns the row image held by field f: absent for a missing field
// or null, an error reason for anything but an object.
func rowOf(f *field) (span, bool) {
	if f == nil || (f.shape == shapeScalar && f.val.Kind == rules.KindNull) {
		return absent, true
	}
	if f.shape != shapeRow {
		return absent, false
	}
	return span{f.lo, f.hi}, true
}

// overlay appends to the arena a copy of base with the values of old
// replacing those of the same name; columns of old that base lacks are
// appended after base's. It returns the new row.
func (st *decodeState) overlay(base, old span) span {
	lo := int32(len(st.cols))
	for i := base.lo; i < base.hi; i++ {
		c := st.cols[i]
		if old.present() {
			for j := old.lo; j < old.hi; j++ {
				if st.cols[j].Name == c.Name {
					c.Value = st.cols[j].Value
					break
				}
			}
		}
		st.addColumn(c.Name, c.Value)
	}
	if old.present() {
	next:
		for j := old.lo; j < old.hi; j++ {
			name := st.cols[j].Name
			for i := base.lo; i < base.hi; i++ {
				if st.cols[i].Name == name {
					continue next
				}
			}
			st.addColumn(name, st.cols[j].Value)
		}
	}
	return span{lo, int32(len(st.cols))}
}

// parseServerID reads a server_id member: the MySQL/MariaDB server_id of
// the server where the change was first written (1..4294967295). Anything
// else, 0 included (Debezium's snapshot rows), is 0: unknown.
func parseServerID(v rules.Value) uint32 {
	n, ok := parseInt64(v)
	if !ok || n <= 0 || n > math.MaxUint32 {
		return 0
	}
	return uint32(n)
}
