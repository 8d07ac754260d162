package yamlfile

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// hostileDeadline bounds each hostile case, far above the milliseconds
// they take, so that a slow machine passes and a quadratic search fails
// here rather than at the test binary's timeout.
const hostileDeadline = 30 * time.Second

// TestParseHostile parses files made to be slow to reject or to nest
// without end: each is refused with its error, at its place.
func TestParseHostile(t *testing.T) {
	for _, tc := range []struct {
		name string
		data string
		want string
	}{
		{
			name: "misindented key after 64 KiB",
			data: strings.Repeat("key: value\n", 64<<10/11) + "  bad: x\n",
			want: "5958:6: YAML: mapping values are not allowed in this context",
		},
		{
			name: "misindented key after 256 KiB",
			data: strings.Repeat("key: value\n", 256<<10/11) + "  bad: x\n",
			want: "23832:6: YAML: mapping values are not allowed in this context",
		},
		{
			name: "stray bracket after a 200 KiB line",
			data: "list: [" + strings.Repeat("abc, ", 40<<10) + "x]]\n",
			want: "1:204810: YAML: did not find expected key",
		},
		{
			name: "200 KiB of open brackets",
			data: strings.Repeat("[", 200<<10),
			want: "1:10004: YAML: nested more than 10000 levels deep, deeper than the limit of 100",
		},
		{
			name: "lists 150 deep",
			data: "a: " + strings.Repeat("[", 150) + strings.Repeat("]", 150) + "\n",
			want: "1:103: YAML: nested deeper than the limit of 100 levels",
		},
		{
			name: "mappings 120 deep",
			data: nestedMappings(120),
			want: "101:101: YAML: nested deeper than the limit of 100 levels",
		},
		{
			name: "list 99 deep through an alias",
			data: "a: &a " + strings.Repeat("[", 99) + strings.Repeat("]", 99) + "\nb: [*a]\n",
			want: "2:5: YAML: nested deeper than the limit of 100 levels",
		},
		{
			name: "billion laughs",
			data: laughs(9),
			want: "6:25: YAML: aliases expand to more than 1048576 bytes, the limit",
		},
		{
			name: "alias inside its anchor",
			data: "a: &x [1, *x]\n",
			want: "1:11: YAML: alias *x refers to a value that holds it",
		},
		{
			name: "more than MaxFileBytes",
			data: strings.Repeat("# comment\n", 1<<20/10+1),
			want: "1:1: file is 1048580 bytes, more than the limit of 1048576",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := parseWithin(t, []byte(tc.data))
			if got != tc.want {
				t.Errorf("Parse:\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}

// nestedMappings returns mappings nested depth deep, one key a line.
func nestedMappings(depth int) string {
	var b strings.Builder
	for i := range depth {
		fmt.Fprintf(&b, "%sk:\n", strings.Repeat(" ", i))
	}
	return b.String()
}

// laughs returns the "billion laughs": levels lists of nine aliases to
// the list before, 9^levels values expanded.
func laughs(levels int) string {
	var b strings.Builder
	b.WriteString("l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i <= levels; i++ {
		fmt.Fprintf(&b, "l%d: &l%d [%s]\n", i, i, strings.TrimSuffix(strings.Repeat(fmt.Sprintf("*l%d, ", i-1), 9), ", "))
	}
	return b.String()
}

// parseWithin returns Parse's error text ("" for none), failing the test
// when Parse takes longer than hostileDeadline.
func parseWithin(t *testing.T, data []byte) string {
	t.Helper()
	done := make(chan string, 1)
	start := time.Now()
	go func() {
		_, err := Parse(data)
		if err != nil {
			done <- err.Error()
			return
		}
		done <- ""
	}()
	select {
	case got := <-done:
		t.Logf("%d bytes in %v", len(data), time.Since(start).Round(time.Millisecond))
		return got
	case <-time.After(hostileDeadline):
		t.Fatalf("Parse of %d bytes still running after %v", len(data), hostileDeadline)
		return ""
	}
}

// BenchmarkLocate locates a misindented key at the end of files of 8 KiB
// to 256 KiB: the time per byte stays flat when the search is linear.
func BenchmarkLocate(b *testing.B) {
	for _, size := range []int{8 << 10, 16 << 10, 32 << 10, 64 << 10, 128 << 10, 256 << 10} {
		data := []byte(strings.Repeat("key: value\n", size/11) + "  bad: x\n")
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if _, err := Parse(data); err == nil {
					b.Fatal("parsed")
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(data)), "ns/byte")
		})
	}
}
