package observer

import (
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestStatusJudgedBesideNines: /status gives, beside each window's nines,
// the number of items judged; "+Inf" only when something was judged and
// none of it was wrong, null when nothing was judged.
func TestStatusJudgedBesideNines(t *testing.T) {
	s := newStats([]time.Duration{time.Second, 10 * time.Second, time.Minute}, time.Now())
	for range 99 {
		s.add("r", 0, Consistent)
	}
	s.add("r", 0, Inconsistent)
	s.add("r", 1, Missing)
	s.add("r", 1, NotJudged)
	s.add("r", 2, NotJudged)
	s.rotate(time.Now())
	o := &Observer{stats: s}
	rec := httptest.NewRecorder()
	StatusHandler(o).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var got struct {
		Observer struct {
			Windows []struct {
				Window      string          `json:"window"`
				TotalJudged *uint64         `json:"total_judged"`
				TotalNines  json.RawMessage `json:"total_nines"`
				LastJudged  *uint64         `json:"last_interval_judged"`
				LastNines   json.RawMessage `json:"last_interval_nines"`
			} `json:"windows"`
			Rules map[string][]struct {
				TotalJudged *uint64 `json:"total_judged"`
			} `json:"rules"`
		} `json:"observer"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		judged uint64
		nines  string
	}{{100, "2.000"}, {1, `"+Inf"`}, {0, "null"}}
	if len(got.Observer.Windows) != len(want) {
		t.Fatalf("%d windows:\n%s", len(got.Observer.Windows), rec.Body)
	}
	for i, w := range got.Observer.Windows {
		if w.TotalJudged == nil || *w.TotalJudged != want[i].judged || string(w.TotalNines) != want[i].nines ||
			w.LastJudged == nil || *w.LastJudged != want[i].judged || string(w.LastNines) != want[i].nines {
			t.Errorf("window %s: judged %v nines %s, last %v %s; want %d and %s:\n%s", w.Window, w.TotalJudged, w.TotalNines, w.LastJudged, w.LastNines, want[i].judged, want[i].nines, rec.Body)
		}
	}
	if r := got.Observer.Rules["r"]; len(r) != 3 || r[0].TotalJudged == nil || *r[0].TotalJudged != 100 {
		t.Errorf("the rule's windows lack their judged counts:\n%s", rec.Body)
	}
	if !strings.Contains(rec.Body.String(), `"total_judged": 100`) {
		t.Errorf("no total_judged beside the nines:\n%s", rec.Body)
	}
}
