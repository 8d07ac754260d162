package decode

import "fmt"

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

// ParseFormat returns the format named s: "auto", "debezium",
// "debezium-flat", "maxwell", "canal" or "avro".
func ParseFormat(s string) (Format, error) {
	for f, name := range formatNames {
		if s == name {
			return Format(f), nil
		}
	}
	return FormatAuto, fmt.Errorf("cdc: unknown CDC format %q (want auto, debezium, debezium-flat, maxwell, canal or avro)", s)
}
