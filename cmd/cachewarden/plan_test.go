package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPlanGolden(t *testing.T) {
	const rulesFile = "testdata/plan/inventory.yaml"
	tests := []struct {
		golden string // testdata/plan/<golden>.stdout and .stderr
		input  string
		args   []string
	}{
		{"debezium", "debezium.ndjson", nil},
		{"debezium-flat-auto", "debezium-flat.ndjson", []string{"--table", "inventory.customers"}},
		{"debezium-flat", "debezium-flat.ndjson", []string{"--format", "debezium-flat", "--table", "inventory.customers"}},
		{"maxwell", "maxwell.ndjson", []string{"--format", "maxwell"}},
		{"canal", "canal.ndjson", nil},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			input, err := os.ReadFile(filepath.Join("testdata/plan", tt.input))
			if err != nil {
				t.Fatal(err)
			}
			for _, strict := range []bool{false, true} {
				args := append([]string{"plan", "--rules", rulesFile}, tt.args...)
				if strict {
					args = append(args, "--strict")
				}
				out, errOut, err := invoke(t, string(input), args...)
				wantCode := 0
				if strict && errOut != "" {
					wantCode = 1
				}
				if code := exitCode(err); code != wantCode {
					t.Errorf("strict=%v: exit code %d (err %v), want %d", strict, code, err, wantCode)
				}
				compareGolden(t, filepath.Join("testdata/plan", tt.golden+".stdout"), out)
				compareGolden(t, filepath.Join("testdata/plan", tt.golden+".stderr"), errOut)
			}
		})
	}
}

// TestPlanTakesJSONLines: plan refuses format avro, and reports a line
// that is a Confluent-framed Avro message as such.
func TestPlanTakesJSONLines(t *testing.T) {
	const rulesFile = "testdata/plan/inventory.yaml"
	_, _, err := invoke(t, "", "plan", "--rules", rulesFile, "--format", "avro")
	if code := exitCode(err); code != 2 || !strings.Contains(err.Error(), "plan reads JSON lines") {
		t.Errorf("--format avro: exit code %d, error %v", code, err)
	}
	avroLine := "\x00\x00\x00\x00\x07\x02\x06abc\n"
	_, errOut, err := invoke(t, avroLine, "plan", "--rules", rulesFile)
	if exitCode(err) != 0 || !strings.HasPrefix(errOut, "line 1: ") || !strings.Contains(errOut, "schema id 7") || !strings.Contains(errOut, "take JSON lines") {
		t.Errorf("an Avro line: %v, stderr %q", err, errOut)
	}
}

// TestPlanLongKey plans a key longer than memcached allows whose cut at
// 200 bytes falls inside a two-byte character: the key is hashed, and the
// lone leading byte is printed as U+FFFD.
func TestPlanLongKey(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "r.yaml")
	err := os.WriteFile(rulesFile, []byte("version: 1\nrules:\n  - name: by-name\n    table: db.t\n    bump: \"k:{name}\"\n"), 0o644)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.Repeat("a", 197) + "é" + strings.Repeat("b", 100) + `"\`
	msg, _ := json.Marshal(map[string]any{
		"op": "c", "before": nil, "after": map[string]any{"name": name},
		"source": map[string]string{"db": "db", "table": "t"},
	})
	out, errOut, err := invoke(t, string(msg)+"\r\n\r\n", "plan", "--rules", rulesFile, "--strict")
	if err != nil || errOut != "" {
		t.Fatalf("err %v, stderr %q", err, errOut)
	}
	full := "k:" + name
	sum := sha256.Sum256([]byte(full))
	wantKey := full[:200] + "%#" + hex.EncodeToString(sum[:16])
	if len(wantKey) != 234 || !strings.HasSuffix(full[:200], "\xc3") {
		t.Fatalf("test setup: key %q", wantKey)
	}
	want := `{"line":1,"rule":"by-name","op":"bump","key":"k:` + strings.Repeat("a", 197) + `\ufffd%#` + hex.EncodeToString(sum[:16]) + "\"}\n" +
		// and the key earlier releases hashed it to (docs/formats.md, "Keys")
		`{"line":1,"rule":"by-name","op":"bump","key":"k:` + strings.Repeat("a", 197) + `\ufffd#` + hex.EncodeToString(sum[:16]) + "\",\"legacy\":true}\n"
	if out != want {
		t.Fatalf("got  %s\nwant %s", out, want)
	}
}

// TestPlanExampleRules runs plan over the example rule directory with one
// message of each format, in the shape of the documented plan output.
func TestPlanExampleRules(t *testing.T) {
	in := strings.Join([]string{
		`{"op":"u","before":{"id":42,"name":"Ann","email":"a@x","avatar_url":null},"after":{"id":42,"name":"Ann","email":"b@x","avatar_url":null},"source":{"db":"shop","table":"users"}}`,
		`{"database":"shop","table":"user_interests","type":"update","data":{"user_id":42,"interest":"rock climbing","active":1},"old":{"user_id":41}}`,
		``,
		`{"data":[{"id":"1","post_id":"9","approved":"0"}],"old":[{"approved":"1"}],"database":"blog","table":"comments","type":"UPDATE","isDdl":false,"mysqlType":{"id":"bigint","post_id":"bigint","approved":"tinyint(1)"}}`,
		`{"id":1,"post_id":9,"approved":1,"__op":"u","__db":"blog","__table":"comments"}`,
		`{"op":"t","source":{"db":"shop","table":"products"}}`,
		`{"database":"shop","table":"user_interests","type":"insert","data":{"interest":"chess","active":1}}`,
	}, "\n") + "\n"
	out, errOut, err := invoke(t, in, "plan", "--rules", "../../configs/rules")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"line":1,"rule":"user","op":"bump","key":"shop:ns:user:42"}
{"line":2,"rule":"user-interests","op":"set_remove","key":"shop:interests:41","member":"rock%20climbing"}
{"line":2,"rule":"user-interests","op":"set_add","key":"shop:interests:42","member":"rock%20climbing"}
{"line":4,"rule":"post-comments","op":"count","key":"blog:comments:9","delta":-1}
{"line":5,"rule":"post-comments","op":"recount","key":"blog:comments:9"}
{"line":6,"rule":"catalog","op":"bump","key":"shop:ns:catalog"}
{"line":6,"rule":"generation","op":"bump","key":"shop:%gen:shop.products"}
`
	if out != want {
		t.Errorf("stdout:\n%s\nwant:\n%s", out, want)
	}
	if wantErr := "line 7: rule \"user-interests\": column \"user_id\" missing from the after image\n"; errOut != wantErr {
		t.Errorf("stderr %q, want %q", errOut, wantErr)
	}
}
