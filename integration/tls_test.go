package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/cachewarden/cachewarden/internal/testsvc"
)

// writeSelfSigned writes a self-signed certificate for 127.0.0.1 and its
// key to dir, readable by the unprivileged user memcached runs as.
func writeSelfSigned(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "cachewarden test memcached"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IPAddresses:           []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// memcachedHasTLS reports whether the memcached binary was built with TLS.
func memcachedHasTLS() bool {
	out, _ := exec.Command(testsvc.MemcachedBinary(), "-h").CombinedOutput()
	return strings.Contains(string(out), "--enable-ssl")
}

// TestMemcachedTLS runs the daemon, with either write protocol, against a
// memcached that accepts TLS only, configured with memcached.tls.
func TestMemcachedTLS(t *testing.T) {
	if !memcachedHasTLS() {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is built without TLS", testsvc.MemcachedBinary())
		}
		t.Skipf("%s is built without TLS", testsvc.MemcachedBinary())
	}
	dir := t.TempDir()
	certFile, keyFile := writeSelfSigned(t, dir)
	mcp := startMemcachedWith(t, "-Z", "-o", "ssl_chain_cert="+certFile+",ssl_key="+keyFile)

	// A plain-text client gets nothing from the TLS listener.
	if _, err := memcachedCommand(mcp.addr, "version\r\n", "VERSION"); err == nil {
		t.Fatal("memcached answered plain text: the test would not prove TLS is used")
	}

	ctx := context.Background()
	b, err := StartBroker(ctx, testLog(t), BrokerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	rules := "version: 1\nrules:\n  - name: item-ns\n    table: shop.items\n    on: [insert]\n    bump: \"ns:{name}\"\n"
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte(rules), 0o644); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pemBytes, _ := os.ReadFile(certFile)
	pool.AppendCertsFromPEM(pemBytes)
	reader := memcache.New(mcp.addr)
	reader.DialContext = (&tls.Dialer{Config: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}).DialContext

	for _, protocol := range []string{"meta", "text"} {
		t.Run(protocol, func(t *testing.T) {
			topic := "tls-" + protocol
			if err := b.CreateTopics(ctx, 1, topic); err != nil {
				t.Fatal(err)
			}
			var msgs []OutMessage
			for i := range 20 {
				msgs = append(msgs, debeziumChange(topic, "c", nil, nil, map[string]any{"name": fmt.Sprintf("%s-%d", protocol, i)}))
			}
			pub, err := NewPublisher(b.Addrs(), Debezium, nil, testLog(t))
			if err != nil {
				t.Fatal(err)
			}
			defer pub.Close()
			if err := pub.PublishRaw(ctx, msgs...); err != nil {
				t.Fatal(err)
			}
			cfgText := fmt.Sprintf("kafka:\n  brokers: [%q]\n  group: %q\n  topics: [%q]\n"+
				"memcached:\n  servers: [%q]\n  protocol: %s\n  tls:\n    enabled: true\n    ca_file: %q\n"+
				"rules: [rules.yaml]\nhttp:\n  listen: \"127.0.0.1:0\"\n", b.Addrs()[0], topic, topic, mcp.addr, protocol, certFile)
			d := startDaemonYAML(t, ctx, filepath.Join(dir, protocol+".yaml"), cfgText)
			waitCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			if err := b.WaitCaughtUp(waitCtx, topic, 50*time.Millisecond, topic); err != nil {
				d.Stop()
				t.Fatal(err)
			}
			if err := d.Stop(); err != nil {
				t.Fatal(err)
			}
			for i := range 20 {
				key := fmt.Sprintf("ns:%s-%d", protocol, i)
				if _, err := reader.Get(key); err != nil {
					t.Errorf("%s over TLS: %v", key, err)
				}
			}
		})
	}
}
