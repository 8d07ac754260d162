package decode

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cachewarden/cachewarden/rules"
)

// Format is the wire format of CDC messages on a topic.
type Format uint8

const (
	// FormatAuto detects the format of every message from its top-level
	// keys (see Decoder.Decode).
	FormatAuto Format = iota
	// FormatDebezium is the Debezium change-event envelope
	// {"before","after","source","op",...}, bare or wrapped in
	// {"schema":...,"payload":...}.
	FormatDebezium
	// FormatDebeziumFlat is a row flattened by Debezium's
	// ExtractNewRecordState transform: the row's columns at top level plus
	// optional "__"-prefixed metadata fields.
	FormatDebeziumFlat
	// FormatMaxwell is Maxwell's daemon JSON: one row per message.
	FormatMaxwell
	// FormatCanal is Canal's flat message: many rows per message, values
	// as strings typed by "mysqlType".
	FormatCanal
	// FormatAvro is Confluent-framed Avro (Kafka Connect's AvroConverter
	// with a schema registry): a Debezium envelope or flattened row,
	// told apart by the schema. Under FormatAuto a message whose first
	// byte is 0 is Avro; FormatDebezium and FormatDebeziumFlat accept
	// Avro too and fix the shape.
	FormatAvro
)

var formatNames = [...]string{
	FormatAuto:         "auto",
	FormatDebezium:     "debezium",
	FormatDebeziumFlat: "debezium-flat",
	FormatMaxwell:      "maxwell",
	FormatCanal:        "canal",
	FormatAvro:         "avro",
}

// String returns the name ParseFormat accepts.
func (f Format) String() string {
	if int(f) < len(formatNames) {
		return formatNames[f]
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// InFile reports whether a file of JSON lines (`plan`, `rules test`,
// `replay --file`) may hold messages of format f: every format but Avro,
// which is binary.
func (f Format) InFile() bool { return f != FormatAvro }

// NeedsRegistry reports whether messages of format f are read with
// schemas from a schema registry (Decoder.Schemas).
func (f Format) NeedsRegistry() bool { return f == FormatAvro }

// Names returns the name of every format, as ParseFormat accepts them.
func Names() []string { return slices.Clone(formatNames[:]) }

// FileNames returns the names of the formats a file of JSON lines may
// hold (see Format.InFile).
func FileNames() []string {
	names := make([]string, 0, len(formatNames))
	for f, name := range formatNames {
		if Format(f).InFile() {
			names = append(names, name)
		}
	}
	return names
}

// Alternatives joins names as "a, b or c", for flag help and errors.
func Alternatives(names []string) string {
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

// ParseFormat returns the format named s, one of Names.
func ParseFormat(s string) (Format, error) {
	for f, name := range formatNames {
		if s == name {
			return Format(f), nil
		}
	}
	return FormatAuto, fmt.Errorf("cdc: unknown CDC format %q (want %s)", s, Alternatives(Names()))
}

// ErrNotInFile is the error (compare with errors.Is) of ParseFileFormat
// for a format a file of JSON lines cannot hold.
var ErrNotInFile = errors.New("a file holds JSON lines, one message value each")

// ParseFileFormat returns the format named s, one of FileNames: the
// format of a file of JSON lines. A format such a file cannot hold (Avro,
// which is binary) is an error wrapping ErrNotInFile.
func ParseFileFormat(s string) (Format, error) {
	f, err := ParseFormat(s)
	if err == nil && !f.InFile() {
		err = fmt.Errorf("cdc: format %s is binary and %w (want %s)", s, ErrNotInFile, Alternatives(FileNames()))
	}
	return f, err
}

// debeziumOp is what one of Debezium's op letters means: the "op" member
// of a change event, the "__op" field of a flattened row.
type debeziumOp struct {
	letter string
	op     rules.Operation
	// message marks a logical decoding message (PostgreSQL): it names no
	// row, and is skipped as SkipMessage.
	message bool
}

// debeziumOps are the op letters Debezium documents: c create, u update,
// d delete, r read (a snapshot row), t truncate, m message.
var debeziumOps = [...]debeziumOp{
	{letter: "c", op: rules.Insert},
	{letter: "u", op: rules.Update},
	{letter: "d", op: rules.Delete},
	{letter: "r", op: rules.Read},
	{letter: "t", op: rules.Truncate},
	{letter: "m", message: true},
}

// parseDebeziumOp returns the meaning of letter; ok is false for a letter
// Debezium does not document.
func parseDebeziumOp(letter string) (d debeziumOp, ok bool) {
	for _, d := range debeziumOps {
		if d.letter == letter {
			return d, true
		}
	}
	return debeziumOp{}, false
}

// debeziumOpLetters lists the op letters, for errors: "c, u, d, r, t, m".
func debeziumOpLetters() string {
	letters := make([]string, len(debeziumOps))
	for i, d := range debeziumOps {
		letters[i] = d.letter
	}
	return strings.Join(letters, ", ")
}
