package app

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
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/countersign/countersign/passkey"
)

// tlsNATS runs a JetStream NATS server that requires TLS and a password, as a
// production NATS would, and returns its URL with the credentials and the
// CA file that verifies it.
func tlsNATS(t *testing.T) (url, caFile string) {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "countersign test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	srvKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	srvDER, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "localhost"},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, KeyUsage: x509.KeyUsageDigitalSignature,
	}, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: filepath.Join(dir, "js"),
		NoLog: true, NoSigs: true, Username: "countersign", Password: "s3cret",
		TLS: true, TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{{Certificate: [][]byte{srvDER}, PrivateKey: srvKey}},
			MinVersion:   tls.VersionTLS12,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("TLS NATS not ready")
	}
	t.Cleanup(srv.Shutdown)
	addr := srv.Addr().(*net.TCPAddr)
	return fmt.Sprintf("tls://countersign:s3cret@localhost:%d", addr.Port), caFile
}

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func TestExternalNATSWithTLSAndCredentials(t *testing.T) {
	url, ca := tlsNATS(t)
	ctx := context.Background()
	a, err := New(ctx, Config{DataDir: t.TempDir(), Addr: freeAddr(t), NATSURL: url, NATSTLSCA: ca, SQLiteSync: "NORMAL"}, ModeDev, nil, io.Discard)
	if err != nil {
		t.Fatalf("start against TLS NATS: %v", err)
	}
	defer a.Shutdown(ctx)
	// The dev bootstrap wrote its tokens into the external NATS.
	tok, err := os.ReadFile(filepath.Join(a.cfg.DataDir, AgentTokenFile))
	if err != nil {
		t.Fatal(err)
	}
	if name, err := a.Tokens.Agent(ctx, strings.TrimSpace(string(tok))); err != nil || name != DevAgentName {
		t.Fatalf("agent token in external NATS: %q %v", name, err)
	}
	// The startup log never shows the NATS password.
	for _, v := range a.Config().Redacted() {
		if s, ok := v.(string); ok && strings.Contains(s, "s3cret") {
			t.Fatalf("redacted config leaks the NATS password: %q", s)
		}
	}
}

func TestExternalNATSRefusesAnUntrustedServer(t *testing.T) {
	url, _ := tlsNATS(t)
	_, err := New(context.Background(), Config{DataDir: t.TempDir(), Addr: freeAddr(t), NATSURL: url, SQLiteSync: "NORMAL"}, ModeDev, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "NATS") {
		t.Fatalf("connected to a server whose certificate no CA vouches for: %v", err)
	}
}

func TestConfigValidation(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"http outside localhost", Config{PublicURL: "http://approvals.example.com"}, "https"},
		{"url with path", Config{PublicURL: "https://example.com/x"}, "path"},
		{"bad sqlite mode", Config{SQLiteSync: "OFF"}, "FULL or NORMAL"},
		{"conformance off loopback", Config{Conformance: true, Addr: "0.0.0.0:8080"}, "loopback"},
		{"bad addr", Config{Addr: "nope"}, "--addr"},
		{"too many replicas", Config{NATSReplicas: 6}, "--nats-replicas 6 must be between 1 and 5"},
		{"negative replicas", Config{NATSReplicas: -1}, "--nats-replicas"},
		{"negative retention", Config{ResultRetention: -time.Hour}, "--result-retention"},
		{"negative inline wait", Config{InlineWait: -time.Second}, "--inline-wait -1s must be from 0s to 10m"},
		{"inline wait too long", Config{InlineWait: time.Hour}, "--inline-wait 1h0m0s must be from 0s to 10m"},
		{"negative shutdown delay", Config{ShutdownDelay: -time.Second}, "--shutdown-delay -1s must be from 0s to 5m0s"},
		{"shutdown delay too long", Config{ShutdownDelay: time.Hour}, "--shutdown-delay 1h0m0s must be from 0s to 5m0s"},
		{"negative policy timeout", Config{PolicyTimeout: -time.Second}, "--policy-timeout -1s must be 0 (the default, 5s) or from 10ms to 20s"},
		{"policy timeout too long", Config{PolicyTimeout: time.Minute}, "--policy-timeout 1m0s must be"},
		{"in-band enrollment unknown", Config{InBandEnrollment: "never"}, `--inband-enrollment "never" must be open, first or closed`},
		{"slack api url without a token", Config{SlackAPIURL: "https://slack-gov.com/api/"}, "--slack-api-url need --slack-token"},
		{"slack api url over http", Config{SlackToken: "xoxb-1", SlackAPIURL: "http://proxy.internal/api/"}, `--slack-api-url "http://proxy.internal/api/" must be an https URL (http only on a loopback host)`},
		{"slack api url relative", Config{SlackToken: "xoxb-1", SlackAPIURL: "slack-gov.com/api/"}, "must be an absolute https URL"},
		{"slack api url with a query", Config{SlackToken: "xoxb-1", SlackAPIURL: "https://slack-gov.com/api/?x=1"}, "without query or fragment"},
		{"slack api url with a password", Config{SlackToken: "xoxb-1", SlackAPIURL: "https://u:s3cret@proxy/api/"}, "without user:password"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Defaults()
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
	ok := Config{}
	ok.Defaults()
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	// In-band enrollment: open in dev, first (trust on first use) in the
	// server, whatever is set otherwise.
	for _, tc := range []struct {
		set  string
		mode Mode
		want string
	}{
		{"", ModeDev, passkey.EnrollOpen}, {"", ModeServer, passkey.EnrollFirst},
		{passkey.EnrollClosed, ModeDev, passkey.EnrollClosed}, {passkey.EnrollOpen, ModeServer, passkey.EnrollOpen},
	} {
		c := Config{InBandEnrollment: tc.set}
		if got := c.InBandEnrollmentFor(tc.mode); got != tc.want {
			t.Errorf("InBandEnrollment %q in %v: %q, want %q", tc.set, tc.mode, got, tc.want)
		}
	}
	for _, u := range []string{"https://slack-gov.com/api/", "https://egress.internal:8443/slack/api", "http://127.0.0.1:9000/api/", "http://localhost/api/"} {
		c := Config{SlackToken: "xoxb-1", SlackAPIURL: u}
		c.Defaults()
		if err := c.Validate(); err != nil {
			t.Errorf("--slack-api-url %s: %v", u, err)
		}
	}
}
