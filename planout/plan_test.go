package planout

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cachewarden/cachewarden/decode"
	"github.com/cachewarden/cachewarden/rules"
	"github.com/cachewarden/cachewarden/rules/rulefile"
)

const planTestRules = `
version: 1
prefix: "t:"
rules:
  - name: user
    table: shop.users
    bump: "ns:user:{id}"
  - name: interests
    table: shop.user_interests
    when: "active == 1"
    set:
      key: "interests:{user_id}"
      member: "{interest}"
  - name: comments
    table: blog.comments
    when: "approved == 1"
    count:
      key: "comments:{post_id}"
`

func planTestRuleSet(t testing.TB) *rules.RuleSet {
	t.Helper()
	rs, err := rulefile.Parse("plan-test.yaml", []byte(planTestRules))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

func userInsert(id string) string {
	return `{"op":"c","before":null,"after":{"id":` + id + `,"name":"x"},"source":{"db":"shop","table":"users"}}`
}

func TestPlanStream(t *testing.T) {
	rs := planTestRuleSet(t)
	long := strings.Repeat("p", 300<<10) // longer than the reader's buffer
	tests := []struct {
		name    string
		in      string
		dec     decode.Decoder
		wantOut string
		// wantErr are the stderr lines; a decode error's reason belongs
		// to the decoder and is matched by prefix.
		wantErr []string
		wantSum Summary
	}{
		{
			name:    "empty input",
			in:      "",
			wantSum: Summary{},
		},
		{
			name: "LF, CRLF, tombstones and a last line without newline",
			in: userInsert("1") + "\n" +
				userInsert("2") + "\r\n" +
				"\n" +
				"  \t\r\n" +
				"null\n" +
				userInsert("3"),
			wantOut: `{"line":1,"rule":"user","op":"bump","key":"t:ns:user:1"}
{"line":2,"rule":"user","op":"bump","key":"t:ns:user:2"}
{"line":6,"rule":"user","op":"bump","key":"t:ns:user:3"}
`,
			wantSum: Summary{Lines: 6, Skipped: 3, Events: 3, Ops: 3},
		},
		{
			name: "a line longer than the read buffer",
			in: userInsert("1") + "\n" +
				`{"op":"c","before":null,"after":{"id":2,"pad":"` + long + `"},"source":{"db":"shop","table":"users"}}` + "\r\n" +
				userInsert("3") + "\n",
			wantOut: `{"line":1,"rule":"user","op":"bump","key":"t:ns:user:1"}
{"line":2,"rule":"user","op":"bump","key":"t:ns:user:2"}
{"line":3,"rule":"user","op":"bump","key":"t:ns:user:3"}
`,
			wantSum: Summary{Lines: 3, Events: 3, Ops: 3},
		},
		{
			name: "bad lines are reported and skipped",
			in: "{not json\n" +
				userInsert("1") + "\n" +
				`{"op":"c","before":null,"after":{"name":"no id"},"source":{"db":"shop","table":"users"}}` + "\n" +
				`{"op":"u","before":{"user_id":7,"interest":"go","active":1},"after":{"user_id":8,"interest":"go","active":1},"source":{"db":"shop","table":"user_interests"}}` + "\n",
			wantOut: `{"line":2,"rule":"user","op":"bump","key":"t:ns:user:1"}
{"line":4,"rule":"interests","op":"set_remove","key":"t:interests:7","member":"go"}
{"line":4,"rule":"interests","op":"set_add","key":"t:interests:8","member":"go"}
`,
			wantErr: []string{
				"line 1: cdc: decode message: at byte 1: ",
				`line 3: rule "user": column "id" missing from the after image`,
			},
			wantSum: Summary{Lines: 4, Failed: 2, Events: 3, Ops: 3},
		},
		{
			name: "a message whose second row fails keeps the ops of its other rows",
			in: `{"data":[{"id":"1","post_id":"9","approved":"1"},{"id":"2","approved":"1"}],"database":"blog","table":"comments","type":"INSERT","isDdl":false,"mysqlType":{"id":"int","post_id":"int","approved":"tinyint(1)"}}` + "\n" +
				`{"data":[{"id":"1","post_id":"9","approved":"1"},{"id":"2","post_id":"10","approved":"0"}],"database":"blog","table":"comments","type":"INSERT","isDdl":false,"mysqlType":{"id":"int","post_id":"int","approved":"tinyint(1)"}}` + "\n",
			wantOut: `{"line":1,"rule":"comments","op":"count","key":"t:comments:9","delta":1}
{"line":2,"rule":"comments","op":"count","key":"t:comments:9","delta":1}
`,
			wantErr: []string{`line 1: row 2 of 2 (blog.comments): rule "comments": column "post_id" missing from the after image`},
			wantSum: Summary{Lines: 2, Failed: 1, Events: 4, Ops: 2},
		},
		{
			name: "flattened rows take their table from the decoder",
			in:   `{"id":5,"__op":"u"}` + "\n",
			dec:  decode.Decoder{Table: "shop.users"},
			wantOut: `{"line":1,"rule":"user","op":"bump","key":"t:ns:user:5"}
`,
			wantSum: Summary{Lines: 1, Events: 1, Ops: 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			sum, err := Stream(context.Background(), strings.NewReader(tt.in), &out, &errOut, &tt.dec, rs, Options{})
			if err != nil {
				t.Fatalf("Stream: %v", err)
			}
			if out.String() != tt.wantOut {
				t.Errorf("stdout:\n%s\nwant:\n%s", out.String(), tt.wantOut)
			}
			var gotErr []string
			if errOut.Len() > 0 {
				gotErr = strings.Split(strings.TrimSuffix(errOut.String(), "\n"), "\n")
			}
			ok := len(gotErr) == len(tt.wantErr) && strings.HasSuffix(errOut.String(), "\n") == (len(gotErr) > 0)
			for i := 0; ok && i < len(gotErr); i++ {
				ok = gotErr[i] == tt.wantErr[i] || strings.HasSuffix(tt.wantErr[i], ": ") && strings.HasPrefix(gotErr[i], tt.wantErr[i])
			}
			if !ok {
				t.Errorf("stderr:\n%s\nwant lines:\n%s", errOut.String(), strings.Join(tt.wantErr, "\n"))
			}
			sum.Stats = rules.PlanStats{}
			if sum != tt.wantSum {
				t.Errorf("summary %+v, want %+v", sum, tt.wantSum)
			}
		})
	}
}

func TestPlanStreamStops(t *testing.T) {
	rs := planTestRuleSet(t)
	in := userInsert("1") + "\n" + userInsert("2") + "\n"

	t.Run("context canceled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		var out bytes.Buffer
		sum, err := Stream(ctx, strings.NewReader(in), &out, &out, &decode.Decoder{}, rs, Options{})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if sum.Lines != 0 || out.Len() != 0 {
			t.Fatalf("read %d lines and wrote %q after cancellation", sum.Lines, out.String())
		}
	})

	t.Run("write error", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := Stream(context.Background(), strings.NewReader(in), failingWriter{boom}, &bytes.Buffer{}, &decode.Decoder{}, rs, Options{})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want the writer's error", err)
		}
	})

	t.Run("read error", func(t *testing.T) {
		boom := errors.New("disk gone")
		r := &failingReader{data: []byte(in), err: boom}
		var out bytes.Buffer
		sum, err := Stream(context.Background(), r, &out, &out, &decode.Decoder{}, rs, Options{})
		if !errors.Is(err, boom) {
			t.Fatalf("err = %v, want the reader's error", err)
		}
		if sum.Lines != 2 || strings.Count(out.String(), "\n") != 2 {
			t.Fatalf("lines before the error: summary %+v, output %q", sum, out.String())
		}
	})
}

type failingWriter struct{ err error }

func (w failingWriter) Write([]byte) (int, error) { return 0, w.err }

type failingReader struct {
	data []byte
	err  error
}

func (r *failingReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, r.err
	}
	n := copy(p, r.data)
	r.data = r.data[n:]
	return n, nil
}

func TestAppendPlanOp(t *testing.T) {
	rule := &rules.Rule{Name: "r-1"}
	tests := []struct {
		op   rules.Op
		want string
	}{
		{rules.Op{Kind: rules.OpBump, Rule: rule, Key: "k:1"},
			`{"line":7,"rule":"r-1","op":"bump","key":"k:1"}`},
		{rules.Op{Kind: rules.OpSetAdd, Rule: rule, Key: "s:1", Member: "m%20x"},
			`{"line":7,"rule":"r-1","op":"set_add","key":"s:1","member":"m%20x"}`},
		{rules.Op{Kind: rules.OpSetRemove, Rule: rule, Key: "s:1", Member: ""},
			`{"line":7,"rule":"r-1","op":"set_remove","key":"s:1","member":""}`},
		{rules.Op{Kind: rules.OpCount, Rule: rule, Key: "c:9", Delta: -3},
			`{"line":7,"rule":"r-1","op":"count","key":"c:9","delta":-3}`},
		{rules.Op{Kind: rules.OpRecount, Rule: rule, Key: "c:9", Args: []rules.Value{{Kind: rules.KindInt, Text: "9"}}},
			`{"line":7,"rule":"r-1","op":"recount","key":"c:9"}`},
		{rules.Op{Kind: rules.OpSetAppend, Rule: rule, Key: "s:1", Tokens: "+a -b "},
			`{"line":7,"rule":"r-1","op":"set_append","key":"s:1","tokens":"+a -b "}`},
		{rules.Op{Kind: rules.OpBump, Rule: rule, Key: `k:"quoted"\back` + "\x7f" + "é"},
			`{"line":7,"rule":"r-1","op":"bump","key":"k:\"quoted\"\\back` + "\x7f" + `é"}`},
	}
	for _, tt := range tests {
		got := string(AppendOp(nil, 7, &tt.op))
		if got != tt.want+"\n" {
			t.Errorf("%s:\n got %s\nwant %s", tt.op.Kind, got, tt.want)
		}
		if !json.Valid([]byte(got)) {
			t.Errorf("%s: output is not valid JSON: %s", tt.op.Kind, got)
		}
	}
}

// BenchmarkPlanStream measures the plan loop over Maxwell messages that
// each produce two ops.
func BenchmarkPlanStream(b *testing.B) {
	rs := planTestRuleSet(b)
	var in bytes.Buffer
	const lines = 1000
	for i := range lines {
		fmt.Fprintf(&in, `{"database":"shop","table":"user_interests","type":"update","ts":1714557600,"xid":%d,"data":{"user_id":%d,"interest":"rock climbing","active":1},"old":{"user_id":%d}}`+"\n", i, i+1, i)
	}
	data := in.Bytes()
	dec := &decode.Decoder{}
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		sum, err := Stream(context.Background(), bytes.NewReader(data), discard{}, discard{}, dec, rs, Options{})
		if err != nil || sum.Ops != 2*lines {
			b.Fatalf("sum %+v, err %v", sum, err)
		}
	}
	b.ReportMetric(float64(lines*b.N)/b.Elapsed().Seconds(), "lines/s")
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
