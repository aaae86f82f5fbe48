package app

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"

	"github.com/countersign/countersign/internal/devstack"
)

// devTemporal starts the embedded Temporal, which requires mutual TLS, and
// writes its CA and a client certificate and key to files, as an operator's
// PKI would hand them out.
func devTemporal(t *testing.T) (hostPort, ca, cert, key string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	srv, err := devstack.Start(ctx, devstack.Options{DataDir: t.TempDir(), Synchronous: "NORMAL"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Stop() })
	caPEM, certPEM, keyPEM, err := srv.ClientPEM()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ca, cert, key = filepath.Join(dir, "ca.pem"), filepath.Join(dir, "client.pem"), filepath.Join(dir, "client.key")
	for p, b := range map[string][]byte{ca: caPEM, cert: certPEM, key: keyPEM} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return srv.FrontendHostPort(), ca, cert, key
}

// otherCA writes the certificate of a CA that vouches for nothing here.
func otherCA(t *testing.T) string {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "some other CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// connectTemporal resolves the configuration file at path and connects to
// Temporal as a server process would.
func connectTemporal(t *testing.T, path string) (*App, error) {
	t.Helper()
	cfg := Config{ConfigFile: path, DataDir: t.TempDir()}
	if err := cfg.Resolve(ModeDev); err != nil {
		t.Fatal(err)
	}
	a := &App{cfg: cfg, mode: ModeServer, log: slog.New(slog.DiscardHandler)}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := a.startTemporal(ctx)
	if a.tc != nil {
		t.Cleanup(a.tc.Close)
	}
	return a, err
}

// TestTemporalMutualTLSFromConfigFile: the temporal section's TLS settings
// (and an API key) reach the client; the embedded Temporal, which admits
// only its own CA's client certificates, answers. With another CA the
// connection fails and the error says which setting to check.
func TestTemporalMutualTLSFromConfigFile(t *testing.T) {
	hostPort, ca, cert, key := devTemporal(t)
	t.Setenv("CS_TEST_TEMPORAL_KEY", "test-api-key")
	write := func(ca string) string {
		p := filepath.Join(t.TempDir(), "countersign.yaml")
		content := "temporal:\n  address: " + hostPort + "\n  api_key: ${CS_TEST_TEMPORAL_KEY}\n  tls:\n    ca: " + ca +
			"\n    cert: " + cert + "\n    key: " + key + "\n    server_name: " + devstack.TLSServerName + "\n"
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	a, err := connectTemporal(t, write(ca))
	if err != nil {
		t.Fatalf("mutual TLS with the file's settings: %v", err)
	}
	if a.cfg.TemporalAPIKey != "test-api-key" || !a.cfg.temporalTLSOn() {
		t.Fatalf("the file's temporal section was not applied: TLS %v", a.cfg.temporalTLSOn())
	}
	if _, creds, _ := a.cfg.temporalConnection(); creds == nil {
		t.Error("the API key gives no client credentials")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := a.tc.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: "default"}); err != nil {
		t.Fatalf("a call over the connection: %v", err)
	}

	_, err = connectTemporal(t, write(otherCA(t)))
	if err == nil {
		t.Fatal("connected while trusting another CA")
	}
	for _, want := range []string{"connect to Temporal at " + hostPort, "certificate", "check --temporal-tls-ca / temporal.tls.ca"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}

	// The right CA and no client certificate: the server, which requires
	// one, closes the connection, and the error says what is missing.
	noCert := filepath.Join(t.TempDir(), "countersign.yaml")
	if err := os.WriteFile(noCert, []byte("temporal:\n  address: "+hostPort+"\n  tls:\n    ca: "+ca+
		"\n    server_name: "+devstack.TLSServerName+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = connectTemporal(t, noCert)
	if err == nil {
		t.Fatal("connected to a mutual TLS server without a client certificate")
	}
	if want := "set --temporal-tls-cert and --temporal-tls-key / temporal.tls.cert and temporal.tls.key"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q lacks %q", err, want)
	}
}

// TestTemporalNamespaceMissing: a server pointed at a namespace its
// Temporal does not have stops at start, saying so, instead of starting,
// answering ready and failing every workflow start.
func TestTemporalNamespaceMissing(t *testing.T) {
	hostPort, ca, cert, key := devTemporal(t)
	p := filepath.Join(t.TempDir(), "countersign.yaml")
	content := "temporal:\n  address: " + hostPort + "\n  namespace: prod-approvals\n  tls:\n    ca: " + ca +
		"\n    cert: " + cert + "\n    key: " + key + "\n    server_name: " + devstack.TLSServerName + "\n"
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := connectTemporal(t, p)
	if err == nil || !strings.Contains(err.Error(), `namespace "prod-approvals" not found on Temporal at `+hostPort) {
		t.Fatalf("start with a namespace Temporal lacks: %v", err)
	}
}

// TestTemporalDialHint: the hint a failed connection's error gets, by what
// the TLS settings hold.
func TestTemporalDialHint(t *testing.T) {
	const clientCert = "set --temporal-tls-cert and --temporal-tls-key"
	for _, tc := range []struct {
		name string
		cfg  Config
		err  string
		want string
	}{
		{"closed after the handshake, no client certificate", Config{TemporalTLSCA: "ca.pem"}, "write tcp 127.0.0.1:1->127.0.0.1:2: write: broken pipe", clientCert},
		{"certificate required alert", Config{TemporalTLS: true}, "remote error: tls: certificate required", clientCert},
		{"reset, no client certificate", Config{TemporalTLS: true}, "read: connection reset by peer", clientCert},
		{"with a client certificate", Config{TemporalTLSCert: "c.pem", TemporalTLSKey: "k.pem"}, "remote error: tls: bad certificate", "check --temporal-tls-ca"},
		{"unknown authority", Config{TemporalTLS: true}, "x509: certificate signed by unknown authority", "check --temporal-tls-ca"},
		{"TLS off, server speaks TLS", Config{}, "x509: certificate signed by unknown authority", "set --temporal-tls / temporal.tls"},
		{"TLS off, refused", Config{}, "connection refused", ""},
		{"TLS off, reset", Config{}, "connection reset by peer", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.cfg.temporalDialHint(errors.New(tc.err))
			if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
				t.Fatalf("hint %q, want %q", got, tc.want)
			}
		})
	}
}

// TestTemporalTLSSettings: what the Temporal settings must hold, checked
// before anything connects.
func TestTemporalTLSSettings(t *testing.T) {
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("hello"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"cert without key", Config{TemporalAddress: "t:7233", TemporalTLSCert: notPEM}, "--temporal-tls-cert and --temporal-tls-key go together"},
		{"CA not PEM", Config{TemporalAddress: "t:7233", TemporalTLSCA: notPEM}, "no PEM certificate"},
		{"CA missing", Config{TemporalAddress: "t:7233", TemporalTLSCA: "/nonexistent/ca.pem"}, "no such file"},
		{"bad key pair", Config{TemporalAddress: "t:7233", TemporalTLSCert: notPEM, TemporalTLSKey: notPEM}, "--temporal-tls-cert"},
		{"TLS without address", Config{TemporalAPIKey: "k"}, "need --temporal-address"},
		{"creds and nkey", Config{NATSCreds: notPEM, NATSNKey: notPEM}, "exclude each other"},
		{"nkey missing", Config{NATSNKey: "/nonexistent/seed.nk"}, "--nats-nkey"},
		{"log level", Config{LogLevel: "loud"}, "--log-level"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Defaults()
			err := tc.cfg.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate: %v, want %q", err, tc.want)
			}
		})
	}
	// An API key alone turns TLS on with the system roots.
	c := Config{TemporalAddress: "my-ns.tmprl.cloud:7233", TemporalAPIKey: "k"}
	conn, creds, err := c.temporalConnection()
	if err != nil || conn.TLS == nil || conn.TLS.RootCAs != nil || creds == nil {
		t.Fatalf("API key alone: TLS %v, creds %v, err %v", conn.TLS, creds, err)
	}
}
