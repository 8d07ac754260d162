package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// TestJSONLogsParseStrictly runs the daemon with --log-format json while
// Kafka does not answer and MySQL hangs up on every connection, then reads
// every line it logged with a parser that rejects repeated keys, as
// Elasticsearch and other strict pipelines do: each line must be one JSON
// object, the Kafka client's and the MySQL driver's lines among them, and
// durations written as text.
func TestJSONLogsParseStrictly(t *testing.T) {
	mc := testsvc.Memcached(t)
	hangUp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hangUp.Close() })
	go func() {
		for {
			c, err := hangUp.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	topic := "cdc-" + testsvc.Unique()
	cfg := writeCountConfig(t, []string{closedAddr(t)}, topic, mc, "root@tcp("+hangUp.Addr().String()+")/x")
	d := startDaemon(t, cfg)
	waitUntil(t, 60*time.Second, func() string {
		recs, _ := jsonRecords(d.stderr.String())
		have := map[string]bool{}
		for _, r := range recs {
			have[fmt.Sprint(r["component"])] = true
		}
		for _, c := range []string{"kafka", "mysql-driver"} {
			if !have[c] {
				return "no log line of component " + c + " yet"
			}
		}
		return ""
	})
	if err := d.stop(); err != nil {
		t.Fatalf("run: %v", err)
	}
	timeouts := 0
	for i, line := range strings.Split(strings.TrimSuffix(d.stderr.String(), "\n"), "\n") {
		if err := strictJSONObject([]byte(line)); err != nil {
			t.Errorf("log line %d does not parse strictly: %v\n%s", i+1, err, line)
			continue
		}
		var rec map[string]any
		json.Unmarshal([]byte(line), &rec)
		if v, ok := rec["query_timeout"]; ok {
			timeouts++
			if s, ok := v.(string); !ok || s != "5s" {
				t.Errorf("query_timeout logged as %v (%T), want the text 5s", v, v)
			}
		}
	}
	if timeouts == 0 {
		t.Errorf("no line with the MySQL pool's query_timeout")
	}
}

// strictJSONObject reports whether data is exactly one JSON object in
// which no object repeats a key.
func strictJSONObject(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return fmt.Errorf("not an object: starts with %v", tok)
	}
	if err := strictObject(dec); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("more after the object (%v)", err)
	}
	return nil
}

// strictObject reads the members of an object whose '{' was read, up to
// its '}', and fails on a repeated key at any depth.
func strictObject(dec *json.Decoder) error {
	keys := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key := tok.(string)
		if keys[key] {
			return fmt.Errorf("key %q repeated", key)
		}
		keys[key] = true
		if err := strictValue(dec); err != nil {
			return fmt.Errorf("%s: %w", key, err)
		}
	}
	_, err := dec.Token() // '}'
	return err
}

func strictValue(dec *json.Decoder) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	switch tok {
	case json.Delim('{'):
		return strictObject(dec)
	case json.Delim('['):
		for dec.More() {
			if err := strictValue(dec); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ']'
		return err
	}
	return nil
}
