package decode

import (
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/hamba/avro/v2"
)

// Messages written by Confluent's Avro serializer (Kafka Connect's
// AvroConverter, and every registry-compatible serializer: Apicurio's
// Confluent mode, Redpanda, Karapace) are framed: a magic byte 0, the
// schema's registry id as 4 big-endian bytes, then the Avro binary body
// written with that schema.
const (
	avroMagic     = 0
	avroHeaderLen = 5
)

// AvroSchemaID returns the registry schema id of a Confluent-framed Avro
// message or key; ok is false when b is not one (it does not start with
// the magic byte 0 or is shorter than the 5-byte header). A JSON message
// never starts with byte 0.
func AvroSchemaID(b []byte) (id uint32, ok bool) {
	if len(b) < avroHeaderLen || b[0] != avroMagic {
		return 0, false
	}
	return binary.BigEndian.Uint32(b[1:avroHeaderLen]), true
}

// Kafka Connect and Debezium schema names the decoder renders specially.
const (
	connectNameProp       = "connect.name"
	connectParametersProp = "connect.parameters"
)

// avroKind is the kind of a compiled Avro type.
type avroKind uint8

const (
	avroNull avroKind = iota
	avroBoolean
	avroInt
	avroLong
	avroFloat
	avroDouble
	avroBytes
	avroString
	avroFixed
	avroEnum
	avroArray
	avroMap
	avroRecord
	avroUnion
	// avroDecimal is a Connect Decimal (or Avro's decimal logical type):
	// bytes, or fixed of size bytes, holding the unscaled integer.
	avroDecimal
	// avroVarDecimal is Debezium's VariableScaleDecimal: a record of the
	// scale (int) and the unscaled integer (bytes).
	avroVarDecimal
)

// avroType is a compiled Avro type: what the decoder needs to walk a
// value of it.
type avroType struct {
	kind avroKind
	// name is the full name of a record, enum or fixed.
	name string
	// size is the byte size of a fixed (and of a decimal stored in a
	// fixed; 0 for one stored in bytes).
	size int
	// scale is a decimal's scale.
	scale int
	// fields are a record's fields, in order.
	fields []avroField
	// branches are a union's types, in order.
	branches []*avroType
	// elem is an array's item type or a map's value type.
	elem *avroType
	// symbols are an enum's symbols.
	symbols []string
	// nullable is set on a union of null and one other type (the shape
	// of every optional Connect field): other is that type.
	nullable bool
	other    *avroType
	// rendered is set on types whose values are rendered into new memory
	// (numbers, bytes, decimals, nested values), not taken from the
	// message as they are (strings, enums, booleans, null).
	rendered bool
}

// avroField is one field of a record.
type avroField struct {
	name string
	t    *avroType
	// key is keyID(name) for top-level fields, srcKey for the fields of a
	// Debezium source block.
	key int
}

// Roles of a top-level field in decoding.
const (
	roleValue  = iota // a value (a column of a flattened row, op, ts_ms...)
	roleRow           // a row image (before, after): record, or null
	roleSource        // Debezium's source block
	roleSkip          // read past (the transaction block)
)

// AvroSchema is one registry schema compiled for decoding: the writer
// schema of every message framed with its id. It is immutable and safe for
// concurrent use.
type AvroSchema struct {
	// ID is the registry's schema id.
	ID uint32
	// problem is why messages of this schema cannot be decoded ("" when
	// they can): a schema that is not Avro, or not a record.
	problem string
	root    *avroType
	// format is what the schema's fields make of its messages:
	// FormatDebezium (a change-event envelope, or a record Debezium
	// sends without row changes, see skip) or FormatDebeziumFlat.
	format Format
	// skip is the Skip* reason of every message of the schema, when it is
	// a Debezium record without row changes (transaction marker, schema
	// change, heartbeat).
	skip string
	// envelopeRoles and flatRoles are the roles of the top-level fields
	// when decoded as an envelope or as a flattened row.
	envelopeRoles, flatRoles []uint8
	// keyColumns are the sorted field names of a record schema, the
	// columns a message key of this schema names.
	keyColumns []string
}

// String names the schema by id and, for a record, its full name.
func (s *AvroSchema) String() string {
	if s.root != nil && s.root.name != "" {
		return "schema id " + strconv.FormatUint(uint64(s.ID), 10) + " (" + s.root.name + ")"
	}
	return "schema id " + strconv.FormatUint(uint64(s.ID), 10)
}

// CompileAvroSchema parses the Avro schema text (as a schema registry
// returns it) of registry id id and compiles it for decoding. refs are the
// texts of the schemas it references by name (registry schema
// references), each after those it references itself. An error means the
// text is not a valid Avro schema; the message then names the id.
func CompileAvroSchema(id uint32, schema string, refs ...string) (*AvroSchema, error) {
	// A cache of its own per schema: the default cache of the library is
	// global, and an evolved schema reuses the record names of its
	// predecessor with other fields.
	cache := &avro.SchemaCache{}
	for i, ref := range refs {
		if _, err := avro.ParseWithCache(ref, "", cache); err != nil {
			return nil, fmt.Errorf("cdc: schema id %d: referenced schema %d: %w", id, i+1, err)
		}
	}
	parsed, err := avro.ParseWithCache(schema, "", cache)
	if err != nil {
		return nil, fmt.Errorf("cdc: schema id %d: %w", id, err)
	}
	root, err := compileAvroType(parsed, map[string]*avroType{})
	if err != nil {
		return nil, fmt.Errorf("cdc: schema id %d: %w", id, err)
	}
	markRendered(root, map[*avroType]bool{})
	s := &AvroSchema{ID: id, root: root}
	if root.kind != avroRecord {
		s.problem = "the schema is not an Avro record (it is " + root.kindName() + "): not a Debezium change event or row"
		return s, nil
	}
	s.classify()
	return s, nil
}

// UnusableAvroSchema returns the entry of a registry schema whose messages
// cannot be decoded, for the reason given (such as a Protobuf or JSON
// Schema registered under id): every message framed with id is then
// poison with that reason, without asking the registry again.
func UnusableAvroSchema(id uint32, reason string) *AvroSchema {
	return &AvroSchema{ID: id, problem: reason}
}

// classify decides, from the top-level field names, whether the schema is
// a Debezium change-event envelope, a record without row changes, or a
// flattened row, with the rules Decoder.Decode uses for JSON keys.
func (s *AvroSchema) classify() {
	fields := s.root.fields
	has := func(k int) bool {
		return slices.ContainsFunc(fields, func(f avroField) bool { return f.key == k })
	}
	s.envelopeRoles = make([]uint8, len(fields))
	s.flatRoles = make([]uint8, len(fields))
	for i, f := range fields {
		switch {
		case (f.key == kBefore || f.key == kAfter) && (f.t.kind == avroRecord || (f.t.nullable && f.t.other.kind == avroRecord)):
			s.envelopeRoles[i] = roleRow
		case f.key == kSource && f.t.kind == avroRecord:
			s.envelopeRoles[i] = roleSource
			for j := range f.t.fields {
				f.t.fields[j].key = sourceKey(f.t.fields[j].name)
			}
		case f.name == "transaction":
			s.envelopeRoles[i] = roleSkip
		}
		s.keyColumns = append(s.keyColumns, f.name)
	}
	slices.Sort(s.keyColumns)
	switch {
	case has(kFlatOp) || has(kFlatDeleted):
		s.format = FormatDebeziumFlat
	case has(kOp) && (has(kBefore) || has(kAfter) || has(kSource)):
		s.format = FormatDebezium
	case has(kStatus) && (has(kEventCount) || has(kDataCollections)):
		s.format, s.skip = FormatDebezium, SkipTransaction
	case has(kDDL) && (has(kTableChanges) || has(kDatabaseName)):
		s.format, s.skip = FormatDebezium, SkipSchemaChange
	case len(fields) == 1 && has(kTsMs):
		s.format, s.skip = FormatDebezium, SkipHeartbeat
	default:
		// A record that is no Debezium envelope is a row: a schema says
		// what a message is, so a flattened row needs no __op to be
		// recognised (JSON does, see Decoder.Decode).
		s.format = FormatDebeziumFlat
	}
}

// compileAvroType compiles a parsed schema; named records are compiled
// once, so that recursive types end.
func compileAvroType(s avro.Schema, named map[string]*avroType) (*avroType, error) {
	switch s := s.(type) {
	case *avro.NullSchema:
		return &avroType{kind: avroNull}, nil
	case *avro.PrimitiveSchema:
		return compilePrimitive(s)
	case *avro.FixedSchema:
		t := &avroType{kind: avroFixed, name: s.FullName(), size: s.Size()}
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			t.kind, t.scale = avroDecimal, d.Scale()
		}
		return t, nil
	case *avro.EnumSchema:
		return &avroType{kind: avroEnum, name: s.FullName(), symbols: s.Symbols()}, nil
	case *avro.ArraySchema:
		elem, err := compileAvroType(s.Items(), named)
		if err != nil {
			return nil, err
		}
		return &avroType{kind: avroArray, elem: elem}, nil
	case *avro.MapSchema:
		elem, err := compileAvroType(s.Values(), named)
		if err != nil {
			return nil, err
		}
		return &avroType{kind: avroMap, elem: elem}, nil
	case *avro.UnionSchema:
		t := &avroType{kind: avroUnion}
		for _, b := range s.Types() {
			bt, err := compileAvroType(b, named)
			if err != nil {
				return nil, err
			}
			t.branches = append(t.branches, bt)
		}
		if len(t.branches) == 2 && (t.branches[0].kind == avroNull) != (t.branches[1].kind == avroNull) {
			t.nullable = true
			t.other = t.branches[0]
			if t.other.kind == avroNull {
				t.other = t.branches[1]
			}
		}
		return t, nil
	case *avro.RefSchema:
		return compileAvroType(s.Schema(), named)
	case *avro.RecordSchema:
		if t, ok := named[s.FullName()]; ok {
			return t, nil
		}
		t := &avroType{kind: avroRecord, name: s.FullName()}
		named[s.FullName()] = t
		for _, f := range s.Fields() {
			ft, err := compileAvroType(f.Type(), named)
			if err != nil {
				return nil, err
			}
			t.fields = append(t.fields, avroField{name: f.Name(), t: ft, key: keyID(f.Name())})
		}
		if isVariableScaleDecimal(s, t) {
			t.kind = avroVarDecimal
		}
		return t, nil
	}
	return nil, fmt.Errorf("unsupported Avro type %s", s.Type())
}

// markRendered sets avroType.rendered on t and the types below it.
func markRendered(t *avroType, seen map[*avroType]bool) {
	if seen[t] {
		return
	}
	seen[t] = true
	switch t.kind {
	case avroNull, avroBoolean, avroString, avroEnum:
	case avroUnion:
		for _, b := range t.branches {
			markRendered(b, seen)
			t.rendered = t.rendered || b.rendered
		}
	default:
		t.rendered = true
	}
	for _, f := range t.fields {
		markRendered(f.t, seen)
	}
	if t.elem != nil {
		markRendered(t.elem, seen)
	}
}

func compilePrimitive(s *avro.PrimitiveSchema) (*avroType, error) {
	switch s.Type() {
	case avro.Boolean:
		return &avroType{kind: avroBoolean}, nil
	case avro.Int:
		return &avroType{kind: avroInt}, nil
	case avro.Long:
		return &avroType{kind: avroLong}, nil
	case avro.Float:
		return &avroType{kind: avroFloat}, nil
	case avro.Double:
		return &avroType{kind: avroDouble}, nil
	case avro.String:
		return &avroType{kind: avroString}, nil
	case avro.Bytes:
		if d, ok := s.Logical().(*avro.DecimalLogicalSchema); ok {
			return &avroType{kind: avroDecimal, scale: d.Scale()}, nil
		}
		if s.Prop(connectNameProp) == connectDecimal {
			// A Connect Decimal whose Avro decimal annotation the parser
			// did not accept (no precision): the scale is in the
			// Connect parameters.
			scale, ok := connectDecimalScale(s)
			if !ok {
				return nil, fmt.Errorf("%s without a scale", connectDecimal)
			}
			return &avroType{kind: avroDecimal, scale: scale}, nil
		}
		return &avroType{kind: avroBytes}, nil
	case avro.Null:
		return &avroType{kind: avroNull}, nil
	}
	return nil, fmt.Errorf("unsupported Avro type %s", s.Type())
}

// connectDecimalScale reads the scale of a Connect Decimal from the
// schema's "scale" property or its Connect parameters.
func connectDecimalScale(s *avro.PrimitiveSchema) (int, bool) {
	if n, ok := intProp(s.Prop("scale")); ok {
		return n, true
	}
	if params, ok := s.Prop(connectParametersProp).(map[string]any); ok {
		return intProp(params["scale"])
	}
	return 0, false
}

// intProp reads a schema property written as a JSON number or a string
// of digits.
func intProp(v any) (int, bool) {
	switch v := v.(type) {
	case float64:
		if v == float64(int(v)) {
			return int(v), true
		}
	case int:
		return v, true
	case string:
		n, err := strconv.Atoi(v)
		return n, err == nil
	}
	return 0, false
}

// isVariableScaleDecimal reports whether record s (compiled as t) is
// Debezium's VariableScaleDecimal: {scale: int, value: bytes}.
func isVariableScaleDecimal(s *avro.RecordSchema, t *avroType) bool {
	if s.FullName() != variableScaleDecimal && s.Prop(connectNameProp) != variableScaleDecimal {
		return false
	}
	return len(t.fields) == 2 && t.fields[0].name == "scale" && t.fields[0].t.kind == avroInt &&
		t.fields[1].name == "value" && t.fields[1].t.kind == avroBytes
}

func (t *avroType) kindName() string {
	return [...]string{
		avroNull: "null", avroBoolean: "boolean", avroInt: "int", avroLong: "long", avroFloat: "float",
		avroDouble: "double", avroBytes: "bytes", avroString: "string", avroFixed: "fixed", avroEnum: "enum",
		avroArray: "array", avroMap: "map", avroRecord: "record", avroUnion: "union", avroDecimal: "decimal",
		avroVarDecimal: "VariableScaleDecimal",
	}[t.kind]
}

// AvroSchemas gives a decoder the compiled schemas of registry ids
// (Decoder.Schemas): the decoders read schemas, the schema registry client
// (package source/kafka) fetches them. AvroSchemaCache is one. It must be safe
// for concurrent use: the decoders of all partitions share it.
type AvroSchemas interface {
	// Lookup returns the schema of id, or nil when there is none.
	Lookup(id uint32) *AvroSchema
}

// AvroSchemaCache holds the compiled schemas of registry ids, for
// Decoder.Schemas. Lookups take no lock: decoding never waits for a
// schema being added. The zero value is empty and ready; it is safe for
// concurrent use.
type AvroSchemaCache struct {
	mu sync.Mutex
	// m is replaced, never changed, when a schema is added: schemas are
	// added once per id, read for every message.
	m atomic.Pointer[map[uint32]*AvroSchema]
}

// Lookup returns the schema of id, or nil when the cache does not hold
// it. A nil cache holds nothing.
func (c *AvroSchemaCache) Lookup(id uint32) *AvroSchema {
	if c == nil {
		return nil
	}
	if m := c.m.Load(); m != nil {
		return (*m)[id]
	}
	return nil
}

// Add stores schemas, replacing those of the same ids.
func (c *AvroSchemaCache) Add(schemas ...*AvroSchema) {
	c.mu.Lock()
	defer c.mu.Unlock()
	var next map[uint32]*AvroSchema
	if m := c.m.Load(); m != nil {
		next = make(map[uint32]*AvroSchema, len(*m)+len(schemas))
		for id, s := range *m {
			next[id] = s
		}
	} else {
		next = make(map[uint32]*AvroSchema, len(schemas))
	}
	for _, s := range schemas {
		next[s.ID] = s
	}
	c.m.Store(&next)
}

// Len returns the number of schemas held.
func (c *AvroSchemaCache) Len() int {
	if m := c.m.Load(); m != nil {
		return len(*m)
	}
	return 0
}
