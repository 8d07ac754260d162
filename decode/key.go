package decode

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
)

// KeyColumns returns the columns a Kafka message key names, sorted: the
// fields of a Debezium key (the primary key, or the columns of the
// connector's message.key.columns), with or without its schema envelope,
// or the pk.* fields of a Maxwell key. perTable reports a Maxwell key that
// names its database and table but no column (Maxwell partitioning by
// database or table): every change of the table has the same key. ok is
// false when the key names no column: empty or null, not a JSON object
// (Canal and other producers that key by table or by a hash), or an
// object without fields.
//
// A message key decides the partition a message goes to, so two changes
// whose keys name the same values of these columns stay in order.
func KeyColumns(key []byte) (cols []string, perTable, ok bool) {
	key = bytes.TrimSpace(key)
	if len(key) == 0 || key[0] != '{' {
		return nil, false, false
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(key, &obj); err != nil {
		return nil, false, false
	}
	if payload, ok := obj["payload"]; ok {
		if _, schema := obj["schema"]; schema && len(obj) == 2 {
			obj = nil
			if err := json.Unmarshal(payload, &obj); err != nil {
				return nil, false, false
			}
		}
	}
	_, db := obj["database"]
	_, table := obj["table"]
	maxwell := db && table
	for k := range obj {
		if k != "database" && k != "table" && !strings.HasPrefix(k, "pk.") {
			maxwell = false
		}
	}
	for k := range obj {
		switch {
		case maxwell && strings.HasPrefix(k, "pk."):
			cols = append(cols, k[len("pk."):])
		case !maxwell:
			cols = append(cols, k)
		}
	}
	slices.Sort(cols)
	if maxwell && len(cols) == 0 {
		return nil, true, true
	}
	return cols, false, len(cols) > 0
}
