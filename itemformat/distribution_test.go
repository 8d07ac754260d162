package itemformat

import (
	"encoding/json"
	"net"
	"os"
	"strconv"
	"testing"

	"github.com/bradfitz/gomemcache/memcache"
)

// distributionVector is one client configuration of
// testdata/distribution-vectors.json: the server each key was found on
// after the real client stored it (integration/testdata/clients/vectors.py
// generates the file).
type distributionVector struct {
	Client       string `json:"client"`
	Distribution string `json:"distribution"`
	Servers      []struct {
		Addr   string `json:"addr"`
		Weight uint32 `json:"weight"`
	} `json:"servers"`
	Keys   []string `json:"keys"`
	Server []int    `json:"server"`
}

func TestSelectorMatchesClients(t *testing.T) {
	b, err := os.ReadFile("testdata/distribution-vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var vectors []distributionVector
	if err := json.Unmarshal(b, &vectors); err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, v := range vectors {
		seen[v.Distribution] = true
		var servers []Server
		for _, s := range v.Servers {
			servers = append(servers, Server{Addr: s.Addr, Weight: s.Weight})
		}
		sel, err := NewSelector(v.Distribution, servers)
		if err != nil {
			t.Fatalf("%s: %v", v.Client, err)
		}
		wrong := 0
		for i, key := range v.Keys {
			if got := sel.Index(key); got != v.Server[i] {
				if wrong < 5 {
					t.Errorf("%s (%s): key %q: server %d, the client stored it on %d", v.Client, v.Distribution, key, got, v.Server[i])
				}
				wrong++
			}
		}
		if wrong > 0 {
			t.Errorf("%s (%s): %d of %d keys on the wrong server", v.Client, v.Distribution, wrong, len(v.Keys))
		}
	}
	for _, d := range Distributions {
		if d != DistributionModulaCRC32 && !seen[d] {
			t.Errorf("no client vectors for distribution %s", d)
		}
	}
}

// TestSelectorModulaCRC32IsGomemcache: the default routes exactly as
// gomemcache's ServerList.
func TestSelectorModulaCRC32IsGomemcache(t *testing.T) {
	addrs := []string{"127.0.0.1:11211", "127.0.0.1:11212", "127.0.0.1:11213"}
	var list memcache.ServerList
	if err := list.SetServers(addrs...); err != nil {
		t.Fatal(err)
	}
	var servers []Server
	for _, a := range addrs {
		servers = append(servers, Server{Addr: a})
	}
	sel, err := NewSelector("", servers)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2000; i++ {
		key := "shop:ns:user:" + string(rune('a'+i%26)) + strconv.Itoa(i)
		want, _ := list.PickServer(key)
		got, _ := sel.PickServer(key)
		if got.String() != want.String() {
			t.Fatalf("key %q: %v, gomemcache picks %v", key, got, want)
		}
		if idx := sel.Index(key); addrs[idx] != want.String() {
			t.Fatalf("key %q: Index %d (%s), gomemcache picks %v", key, idx, addrs[idx], want)
		}
	}
}

func TestSelectorErrors(t *testing.T) {
	one := []Server{{Addr: "127.0.0.1:11211"}}
	if _, err := NewSelector("maglev", one); err == nil {
		t.Error("unknown distribution accepted")
	}
	if _, err := NewSelector(DistributionKetama, nil); err == nil {
		t.Error("no servers accepted")
	}
	if _, err := NewSelector(DistributionRendezvous, []Server{{Addr: "127.0.0.1:1", Weight: 3}, {Addr: "127.0.0.1:2"}}); err == nil {
		t.Error("weights accepted for rendezvous")
	}
	sel, err := NewSelector(DistributionKetama, one)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	sel.Each(func(net.Addr) error { n++; return nil })
	if n != 1 || sel.Index("anything") != 0 {
		t.Errorf("one server: Each saw %d, Index %d", n, sel.Index("anything"))
	}
}

func TestKetamaPointsPerServer(t *testing.T) {
	// libmemcached: 160 points per server at equal weights; uneven weights
	// share 160 x servers in single-precision steps of four.
	cases := []struct {
		weights []uint32
		want    []int
	}{
		{[]uint32{1, 1, 1}, []int{160, 160, 160}},
		{[]uint32{1, 2, 5}, []int{60, 120, 300}},
		{[]uint32{3, 1}, []int{240, 80}},
	}
	for _, c := range cases {
		var servers []Server
		for i, w := range c.weights {
			servers = append(servers, Server{Addr: "10.0.0." + strconv.Itoa(i+1) + ":11211", Weight: w})
		}
		points := ketamaContinuum(servers)
		got := make([]int, len(servers))
		for _, p := range points {
			got[p.index]++
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("weights %v: points %v, want %v", c.weights, got, c.want)
				break
			}
		}
	}
}

func TestPointNames(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:11211":   "127.0.0.1-7",
		"127.0.0.1:11311":   "127.0.0.1:11311-7",
		"mc1.example:11211": "mc1.example-7",
	} {
		if got := pointName(addr, 7); got != want {
			t.Errorf("pointName(%q) = %q, want %q", addr, got, want)
		}
	}
}

func FuzzSelector(f *testing.F) {
	f.Add("shop:ns:user:1", uint8(0))
	f.Add("ключ", uint8(2))
	f.Fuzz(func(t *testing.T, key string, d uint8) {
		dist := Distributions[int(d)%len(Distributions)]
		sel, err := NewSelector(dist, []Server{{Addr: "127.0.0.1:11211"}, {Addr: "127.0.0.1:11212"}, {Addr: "127.0.0.1:11213"}})
		if err != nil {
			t.Fatal(err)
		}
		if i := sel.Index(key); i < 0 || i > 2 {
			t.Fatalf("%s: Index(%q) = %d", dist, key, i)
		}
	})
}
