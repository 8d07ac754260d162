package rules

import (
	"math"
	"math/rand/v2"
	"strconv"
	"testing"
)

func TestCompareDecimal(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"0", "0", 0},
		{"0", "-0.000", 0},
		{"0", "0e5", 0},
		{"1", "1.0", 0},
		{"1", "1e0", 0},
		{"10", "1e1", 0},
		{"10", "1E+1", 0},
		{"0.001", "1e-3", 0},
		{"00012.3400", "12.34", 0},
		{".5", "0.5", 0},
		{"5.", "5", 0},
		{"+7", "7", 0},
		{"1", "2", -1},
		{"2", "10", -1},
		{"-2", "-10", 1},
		{"-1", "0", -1},
		{"0", "-1", 1},
		{"0.1", "0.10000000000000000001", -1},
		{"9223372036854775807", "9223372036854775808", -1},
		{"18446744073709551616", "18446744073709551615", 1},
		{"-18446744073709551616", "-18446744073709551615", -1},
		{"123456789012345678901234567890", "1.2345678901234567890123456789e29", 0},
		{"1e1000000", "1e999999", 1},
		{"1e-1000000", "0", 1},
		{"0.99", "1", -1},
		{"1.01", "1.1", -1},
	}
	for _, tc := range tests {
		a, ok := parseDecimal(tc.a)
		if !ok {
			t.Fatalf("parseDecimal(%q) failed", tc.a)
		}
		b, ok := parseDecimal(tc.b)
		if !ok {
			t.Fatalf("parseDecimal(%q) failed", tc.b)
		}
		if got := compareDecimal(a, b); got != tc.want {
			t.Errorf("compare(%s, %s) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
		if got := compareDecimal(b, a); got != -tc.want {
			t.Errorf("compare(%s, %s) = %d, want %d", tc.b, tc.a, got, -tc.want)
		}
	}
	for _, bad := range []string{"", "-", "+", ".", "1e", "1e+", "e5", "1.2.3", "0x10", "NaN", "Inf", "-Infinity", " 1", "1 ", "1_000", "1,5", "१"} {
		if _, ok := parseDecimal(bad); ok {
			t.Errorf("parseDecimal(%q) accepted", bad)
		}
	}
}

// The exact comparison must agree with Go's for every int64 and every
// float64 (written in its shortest form), including huge and tiny ones.
func TestCompareDecimalAgreesWithGo(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	sign := func(c int) int { return max(-1, min(1, c)) }
	for range 20000 {
		x, y := int64(r.Uint64()), int64(r.Uint64())
		if r.IntN(4) == 0 {
			y = x + int64(r.IntN(3)) - 1
		}
		a, _ := parseDecimal(strconv.FormatInt(x, 10))
		b, _ := parseDecimal(strconv.FormatInt(y, 10))
		want := 0
		if x < y {
			want = -1
		} else if x > y {
			want = 1
		}
		if got := compareDecimal(a, b); got != want {
			t.Fatalf("compare(%d, %d) = %d, want %d", x, y, got, want)
		}
	}
	for range 20000 {
		x, y := math.Float64frombits(r.Uint64()), math.Float64frombits(r.Uint64())
		if r.IntN(4) == 0 {
			y = math.Nextafter(x, math.Inf(1))
		}
		if math.IsNaN(x) || math.IsNaN(y) || math.IsInf(x, 0) || math.IsInf(y, 0) {
			continue
		}
		for _, format := range []byte{'g', 'e', 'f'} {
			sa, sb := strconv.FormatFloat(x, format, -1, 64), strconv.FormatFloat(y, format, -1, 64)
			a, ok1 := parseDecimal(sa)
			b, ok2 := parseDecimal(sb)
			if !ok1 || !ok2 {
				t.Fatalf("parseDecimal(%q / %q) failed", sa, sb)
			}
			want := 0
			if x < y {
				want = -1
			} else if x > y {
				want = 1
			}
			if got := sign(compareDecimal(a, b)); got != want {
				t.Fatalf("compare(%s, %s) = %d, want %d", sa, sb, got, want)
			}
		}
	}
}
