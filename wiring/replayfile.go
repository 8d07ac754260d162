package wiring

import (
	"fmt"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/decode"
)

// ReplayFileDecoder returns the decoder of an NDJSON replay file under the
// kafka section k: the one of topic when not empty (its topic_formats and
// topic_tables entries apply), else the one of kafka.format. A non-nil
// format or a non-empty table ("db.table") overrides it. A format a file
// cannot hold (avro) is refused: a file holds JSON lines.
func ReplayFileDecoder(k config.Kafka, topic string, format *decode.Format, table string) (*decode.Decoder, error) {
	f, err := replayFileFormat(k, topic, format)
	if err != nil {
		return nil, err
	}
	if !f.InFile() {
		return nil, fmt.Errorf("wiring: replay: %w, and format %s is not: "+
			"replay its topics from Kafka (--from), or give the file's JSON format with --format", decode.ErrNotInFile, f)
	}
	dec := &decode.Decoder{Format: f, TopicTables: k.TopicTables}
	if topic != "" {
		dec.Table = k.TopicTables[topic]
	}
	if table != "" {
		dec.Table = table
	}
	return dec, nil
}

// replayFileFormat returns format when not nil, else the format of topic
// under k (kafka.format when topic is "" or has no topic_formats entry).
func replayFileFormat(k config.Kafka, topic string, format *decode.Format) (decode.Format, error) {
	if format != nil {
		return *format, nil
	}
	name := k.Format
	if f, ok := k.TopicFormats[topic]; ok && topic != "" {
		name = f
	}
	if name == "" {
		name = config.DefaultFormat
	}
	return decode.ParseFormat(name)
}
