package config

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTLSFilesBounded loads TLS files: a certificate and key are read,
// a file of more than maxPEMBytes or one without end (/dev/zero) is
// refused with its name and the limit.
func TestTLSFilesBounded(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writeCertificate(t, dir)
	big := filepath.Join(dir, "big.pem")
	if err := os.WriteFile(big, []byte(strings.Repeat("#", maxPEMBytes+1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		tls  TLS
		want string // in the error; "" for none
	}{
		{name: "certificate, key and CA", tls: TLS{Enabled: true, CAFile: certFile, CertFile: certFile, KeyFile: keyFile}},
		{name: "CA from /dev/zero", tls: TLS{Enabled: true, CAFile: "/dev/zero"},
			want: "config: memcached.tls.ca_file: /dev/zero: more than 1048576 bytes, the limit (read up to it and stopped)"},
		{name: "large certificate", tls: TLS{Enabled: true, CertFile: big, KeyFile: keyFile},
			want: "config: memcached.tls.cert_file: " + big + ": 1048577 bytes, more than the limit of 1048576"},
		{name: "key from /dev/zero", tls: TLS{Enabled: true, CertFile: certFile, KeyFile: "/dev/zero"},
			want: "config: memcached.tls.key_file: /dev/zero: more than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := tc.tls.Config("memcached.tls")
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "" && (len(c.Certificates) != 1 || c.RootCAs == nil):
				t.Fatalf("config without the certificate or the CAs: %+v", c)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// writeCertificate writes a self-signed certificate and its key as PEM.
func writeCertificate(t *testing.T, dir string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	for path, block := range map[string]*pem.Block{certFile: {Type: "CERTIFICATE", Bytes: der}, keyFile: {Type: "EC PRIVATE KEY", Bytes: keyDER}} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return certFile, keyFile
}
