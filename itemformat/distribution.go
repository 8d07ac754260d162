package itemformat

import (
	"crypto/md5"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math"
	"math/bits"
	"net"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/bradfitz/gomemcache/memcache"
)

// Names of the ways keys are spread over several memcached servers
// (config key memcached.distribution). Each matches a client library
// byte for byte, so that the daemon writes every key on the server the
// applications read it from; docs/formats.md describes each algorithm.
const (
	// DistributionModulaCRC32 is gomemcache's ServerList: CRC-32 (IEEE)
	// of the key modulo the number of servers, in list order.
	DistributionModulaCRC32 = "modula-crc32"
	// DistributionKetama is libmemcached's weighted ketama, the continuum
	// php-memcached (OPT_LIBKETAMA_COMPATIBLE), pylibmc
	// ({"ketama_weighted": True}) and spymemcached (KETAMA_HASH with the
	// libmemcached key format) agree on: MD5 of the key, 160 points per
	// server at equal weights, four from each MD5 of "host:port-i" (the
	// ":11211" left out), weights honoured.
	DistributionKetama = "ketama"
	// DistributionRendezvous is pymemcache HashClient's default:
	// rendezvous (highest random weight) hashing with MurmurHash3 (32 bit,
	// seed 0) of "host:port-key"; the highest score wins.
	DistributionRendezvous = "rendezvous"
	// DistributionModulaOAAT is libmemcached's default, and so
	// php-memcached's and pylibmc's: Jenkins' one-at-a-time hash of the
	// key modulo the number of servers.
	DistributionModulaOAAT = "modula-oaat"
	// DistributionLibmemcachedConsistent is libmemcached's unweighted
	// consistent hashing (pylibmc {"ketama": True}, php-memcached
	// OPT_DISTRIBUTION=DISTRIBUTION_CONSISTENT): one-at-a-time points,
	// 100 per server, and a one-at-a-time key hash.
	DistributionLibmemcachedConsistent = "libmemcached-consistent"
)

// Distributions lists the accepted distribution names, the default first.
var Distributions = []string{
	DistributionModulaCRC32,
	DistributionKetama,
	DistributionRendezvous,
	DistributionModulaOAAT,
	DistributionLibmemcachedConsistent,
}

// DefaultDistribution is the distribution used when none is configured:
// gomemcache's, which every earlier release of cachewarden used, so an
// upgrade moves no key.
const DefaultDistribution = DistributionModulaCRC32

// Server is one memcached server of a distribution.
type Server struct {
	// Addr is "host:port" (or a Unix socket path), exactly as the
	// applications' clients are given it: ketama and rendezvous hash the
	// text, so "localhost:11211" and "127.0.0.1:11211" are different
	// servers to them.
	Addr string
	// Weight is the server's share of the keys relative to the others
	// (ketama only); 0 means 1.
	Weight uint32
}

// Selector picks the server of a key by one of the Distributions. It
// implements gomemcache's memcache.ServerSelector, so gomemcache clients,
// the pipelined writer and the read side route alike. It is immutable
// after NewSelector and safe for concurrent use.
type Selector struct {
	distribution string
	addrs        []net.Addr
	names        []string
	// continuum holds the ketama points sorted by value, then by server
	// index (libmemcached's order for equal values).
	continuum []ketamaPoint
	crc       *memcache.ServerList
}

type ketamaPoint struct {
	value uint32
	index uint32
}

// libmemcached's points per server: MEMCACHED_POINTS_PER_SERVER (plain
// consistent) and MEMCACHED_POINTS_PER_SERVER_KETAMA (weighted).
const (
	consistentPointsPerServer = 100
	ketamaPointsPerServer     = 160
	libmemcachedDefaultPort   = "11211"
)

// NewSelector returns the selector of distribution ("" means
// DefaultDistribution) over servers, in list order. Addresses are resolved
// once, here, as gomemcache's ServerList does.
func NewSelector(distribution string, servers []Server) (*Selector, error) {
	if distribution == "" {
		distribution = DefaultDistribution
	}
	if !slices.Contains(Distributions, distribution) {
		return nil, fmt.Errorf("cacheops: unknown memcached distribution %q (want one of %s)", distribution, strings.Join(Distributions, ", "))
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("cacheops: distribution %s: %w", distribution, memcache.ErrNoServers)
	}
	s := &Selector{distribution: distribution}
	weighted := false
	for _, srv := range servers {
		if srv.Weight > 1 {
			weighted = true
		}
		s.names = append(s.names, srv.Addr)
	}
	if weighted && distribution != DistributionKetama {
		return nil, fmt.Errorf("cacheops: distribution %s: server weights apply to ketama only", distribution)
	}
	s.crc = new(memcache.ServerList)
	if err := s.crc.SetServers(s.names...); err != nil {
		return nil, fmt.Errorf("cacheops: memcached servers: %w", err)
	}
	s.crc.Each(func(a net.Addr) error { s.addrs = append(s.addrs, a); return nil })
	switch distribution {
	case DistributionKetama:
		s.continuum = ketamaContinuum(servers)
	case DistributionLibmemcachedConsistent:
		s.continuum = consistentContinuum(servers)
	}
	return s, nil
}

// Distribution returns the selector's distribution name.
func (s *Selector) Distribution() string { return s.distribution }

// PickServer returns the server key lives on.
func (s *Selector) PickServer(key string) (net.Addr, error) {
	if s.distribution == DistributionModulaCRC32 {
		return s.crc.PickServer(key)
	}
	return s.addrs[s.Index(key)], nil
}

// Each calls f for each server, in list order.
func (s *Selector) Each(f func(net.Addr) error) error {
	for _, a := range s.addrs {
		if err := f(a); err != nil {
			return err
		}
	}
	return nil
}

// Index returns the position in the server list of the server key lives
// on.
func (s *Selector) Index(key string) int {
	n := len(s.names)
	if n == 1 {
		return 0
	}
	switch s.distribution {
	case DistributionKetama:
		return searchContinuum(s.continuum, md5Hash(key))
	case DistributionLibmemcachedConsistent:
		return searchContinuum(s.continuum, oneAtATime(key))
	case DistributionModulaOAAT:
		return int(oneAtATime(key) % uint32(n))
	case DistributionRendezvous:
		return rendezvous(s.names, key)
	default:
		return int(crc32.ChecksumIEEE([]byte(key)) % uint32(n))
	}
}

// ketamaContinuum builds libmemcached's weighted ketama continuum
// (update_continuum with MEMCACHED_BEHAVIOR_KETAMA_WEIGHTED). The share
// of points is computed in single precision, as libmemcached does, so
// that uneven weights give the very same point counts.
func ketamaContinuum(servers []Server) []ketamaPoint {
	var total float32
	for _, srv := range servers {
		total += float32(weightOf(srv))
	}
	live := float32(len(servers))
	var points []ketamaPoint
	for i, srv := range servers {
		pct := float32(weightOf(srv)) / total
		share := pct * ketamaPointsPerServer
		share /= 4
		share *= live
		share += 1e-10
		perServer := uint32(math.Floor(float64(share))) * 4
		for p := uint32(0); p < perServer/4; p++ {
			digest := md5.Sum([]byte(pointName(srv.Addr, p)))
			for x := 0; x < 4; x++ {
				points = append(points, ketamaPoint{value: binary.LittleEndian.Uint32(digest[4*x:]), index: uint32(i)})
			}
		}
	}
	sortContinuum(points)
	return points
}

// consistentContinuum builds libmemcached's unweighted consistent
// continuum: 100 one-at-a-time points per server.
func consistentContinuum(servers []Server) []ketamaPoint {
	var points []ketamaPoint
	for i, srv := range servers {
		for p := uint32(0); p < consistentPointsPerServer; p++ {
			points = append(points, ketamaPoint{value: oneAtATime(pointName(srv.Addr, p)), index: uint32(i)})
		}
	}
	sortContinuum(points)
	return points
}

func weightOf(s Server) uint32 {
	if s.Weight == 0 {
		return 1
	}
	return s.Weight
}

// pointName is libmemcached's name of a server's p-th point:
// "host:port-p", or "host-p" on the default port 11211.
func pointName(addr string, p uint32) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		// A Unix socket path: libmemcached names it by its path and
		// port 0.
		return addr + ":0-" + strconv.FormatUint(uint64(p), 10)
	}
	if port == libmemcachedDefaultPort {
		return host + "-" + strconv.FormatUint(uint64(p), 10)
	}
	return host + ":" + port + "-" + strconv.FormatUint(uint64(p), 10)
}

func sortContinuum(points []ketamaPoint) {
	slices.SortFunc(points, func(a, b ketamaPoint) int {
		if a.value != b.value {
			if a.value < b.value {
				return -1
			}
			return 1
		}
		return int(a.index) - int(b.index)
	})
}

// searchContinuum returns the server of the first point at or above
// hash, wrapping to the first point (libmemcached's dispatch_host).
func searchContinuum(points []ketamaPoint, hash uint32) int {
	i, _ := slices.BinarySearchFunc(points, hash, func(p ketamaPoint, h uint32) int {
		if p.value < h {
			return -1
		}
		if p.value > h {
			return 1
		}
		return 0
	})
	// BinarySearchFunc finds the first point >= hash even among equals.
	if i == len(points) {
		i = 0
	}
	return int(points[i].index)
}

// md5Hash is libhashkit's MD5 key hash: the digest's first four bytes,
// little-endian.
func md5Hash(key string) uint32 {
	digest := md5.Sum([]byte(key))
	return binary.LittleEndian.Uint32(digest[:4])
}

// oneAtATime is libhashkit's one-at-a-time hash. libhashkit reads the key
// through a (signed) char, so a byte of 0x80 or more enters the hash sign
// extended; bytes are taken the same way here.
func oneAtATime(key string) uint32 {
	var h uint32
	for i := 0; i < len(key); i++ {
		h += uint32(int32(int8(key[i])))
		h += h << 10
		h ^= h >> 6
	}
	h += h << 3
	h ^= h >> 11
	h += h << 15
	return h
}

// rendezvous is pymemcache's RendezvousHash.get_node over names with
// murmur3_32 (seed 0) of "name-key": the highest score wins, a tie goes
// to the greater name.
func rendezvous(names []string, key string) int {
	best, bestScore := 0, int64(-1)
	for i, name := range names {
		score := int64(pyMurmur3(name + "-" + key))
		if score > bestScore || (score == bestScore && name > names[best]) {
			best, bestScore = i, score
		}
	}
	return best
}

// pyMurmur3 is pymemcache's murmur3_32 (seed 0) of s as a Python str:
// it hashes one byte per character, the low eight bits of its code point,
// and mixes in the number of characters. A key that is valid UTF-8 is
// read as the str an application passes; each byte of an invalid sequence
// counts as one character of that byte's value (what Python's
// surrogateescape decoding gives).
func pyMurmur3(s string) uint32 {
	var buf [512]byte
	data := buf[:0]
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			data = append(data, c)
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			data = append(data, c)
		} else {
			data = append(data, byte(r))
		}
		i += size
	}
	return murmur3x86_32(data, 0)
}

// murmur3x86_32 is MurmurHash3_x86_32.
func murmur3x86_32(data []byte, seed uint32) uint32 {
	const (
		c1 = 0xcc9e2d51
		c2 = 0x1b873593
	)
	h := seed
	n := len(data) &^ 3
	for i := 0; i < n; i += 4 {
		k := binary.LittleEndian.Uint32(data[i:])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	var k uint32
	switch len(data) & 3 {
	case 3:
		k ^= uint32(data[n+2]) << 16
		fallthrough
	case 2:
		k ^= uint32(data[n+1]) << 8
		fallthrough
	case 1:
		k ^= uint32(data[n])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
	}
	h ^= uint32(len(data))
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}
