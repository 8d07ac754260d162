package wiring

import (
	"errors"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/config"
	"github.com/cachewarden/cachewarden/decode"
)

// TestReplayFileDecoder checks which decoder a replay file gets.
func TestReplayFileDecoder(t *testing.T) {
	cfg := config.Kafka{
		Format:       "maxwell",
		TopicFormats: map[string]string{"flat": "debezium-flat"},
		TopicTables:  map[string]string{"flat": "shop.users"},
	}
	for _, tt := range []struct {
		topic, format, table string
		want                 decode.Format
		wantTable            string
	}{
		{"", "", "", decode.FormatMaxwell, ""},
		{"flat", "", "", decode.FormatDebeziumFlat, "shop.users"},
		{"other", "", "", decode.FormatMaxwell, ""},
		{"flat", "canal", "a.b", decode.FormatCanal, "a.b"},
		{"", "auto", "", decode.FormatAuto, ""},
	} {
		var format *decode.Format
		if tt.format != "" {
			f, err := decode.ParseFormat(tt.format)
			if err != nil {
				t.Fatal(err)
			}
			format = &f
		}
		dec, err := ReplayFileDecoder(cfg, tt.topic, format, tt.table)
		if err != nil || dec.Format != tt.want || dec.Table != tt.wantTable {
			t.Errorf("ReplayFileDecoder(%q, %q, %q) = %+v, %v; want %s with table %q", tt.topic, tt.format, tt.table, dec, err, tt.want, tt.wantTable)
		}
	}
	avro := decode.FormatAvro
	if _, err := ReplayFileDecoder(cfg, "", &avro, ""); !errors.Is(err, decode.ErrNotInFile) || !strings.Contains(err.Error(), "JSON lines") {
		t.Errorf("format avro for a file: %v, want an error saying a file holds JSON lines", err)
	}
	avroTopic := config.Kafka{Format: "avro"}
	if _, err := ReplayFileDecoder(avroTopic, "", nil, ""); !errors.Is(err, decode.ErrNotInFile) {
		t.Errorf("kafka.format avro for a file: %v, want ErrNotInFile", err)
	}
	if _, err := ReplayFileDecoder(config.Kafka{Format: "protobuf"}, "", nil, ""); err == nil {
		t.Errorf("format protobuf accepted")
	}
}
