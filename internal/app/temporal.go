package app

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/nats-io/nkeys"
	"go.temporal.io/sdk/client"
	tlog "go.temporal.io/sdk/log"
)

// temporalTLSOn reports whether the connection to an external Temporal uses
// TLS: asked for, or implied by a TLS file, a server name or an API key
// (Temporal Cloud takes API keys over TLS only).
func (c *Config) temporalTLSOn() bool {
	return c.TemporalTLS || c.TemporalTLSCA != "" || c.TemporalTLSCert != "" || c.TemporalTLSKey != "" ||
		c.TemporalTLSServerName != "" || c.TemporalAPIKey != ""
}

// validateTemporal checks the Temporal TLS settings: files that load, a
// certificate with its key, and no TLS setting without an external Temporal
// to use it on.
func (c *Config) validateTemporal() []error {
	var errs []error
	if (c.TemporalTLSCert == "") != (c.TemporalTLSKey == "") {
		errs = append(errs, errors.New("--temporal-tls-cert and --temporal-tls-key go together"))
	} else if _, err := loadTLS("--temporal-tls", "temporal.tls", c.TemporalTLSCA, c.TemporalTLSCert, c.TemporalTLSKey); err != nil {
		errs = append(errs, err)
	}
	if c.TemporalAddress == "" && c.temporalTLSOn() {
		errs = append(errs, errors.New("the Temporal TLS settings and API key need --temporal-address (the embedded Temporal of dev has its own TLS)"))
	}
	return errs
}

// temporalConnection is how the client reaches an external Temporal: TLS as
// configured, and the API key as its credentials.
func (c *Config) temporalConnection() (client.ConnectionOptions, client.Credentials, error) {
	var conn client.ConnectionOptions
	if !c.temporalTLSOn() {
		return conn, nil, nil
	}
	tc, err := loadTLS("--temporal-tls", "temporal.tls", c.TemporalTLSCA, c.TemporalTLSCert, c.TemporalTLSKey)
	if err != nil {
		return conn, nil, err
	}
	tc.ServerName = c.TemporalTLSServerName // empty: the address's host
	conn.TLS = tc
	var creds client.Credentials
	if c.TemporalAPIKey != "" {
		creds = client.NewAPIKeyStaticCredentials(c.TemporalAPIKey)
	}
	return conn, creds, nil
}

// temporalDialHint says which setting to look at when connecting fails on
// TLS, the usual mistake with a new cluster.
func (c *Config) temporalDialHint(err error) string {
	msg := err.Error()
	// A server that requires mutual TLS refuses a client without a
	// certificate after the handshake: the client sees the alert, or only
	// its connection closed (TLS 1.3).
	noClientCert := c.temporalTLSOn() && c.TemporalTLSCert == "" && !strings.Contains(msg, "x509:") &&
		(strings.Contains(msg, "certificate required") || strings.Contains(msg, "bad certificate") ||
			strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset") || strings.Contains(msg, "EOF"))
	switch {
	case noClientCert:
		return " (TLS: the server may require a client certificate: set --temporal-tls-cert and --temporal-tls-key / temporal.tls.cert and temporal.tls.key)"
	case strings.Contains(msg, "x509:") || strings.Contains(msg, "certificate"):
		if c.temporalTLSOn() {
			return " (TLS: check --temporal-tls-ca / temporal.tls.ca, the client certificate and --temporal-tls-server-name)"
		}
		return " (the server speaks TLS: set --temporal-tls / temporal.tls)"
	case strings.Contains(msg, "first record does not look like a TLS handshake") ||
		strings.Contains(msg, "tls: ") && !c.temporalTLSOn():
		return " (TLS: the server may not speak TLS; check --temporal-tls)"
	}
	return ""
}

// loadTLS is a client TLS configuration: the CA bundle to trust (none: the
// system roots) and a client certificate (none: no mutual TLS). flag and
// key name the settings in errors, as flags ("--nats-tls") and as the
// configuration file's keys ("nats.tls"), where they are often given.
func loadTLS(flag, key, caFile, certFile, keyFile string) (*tls.Config, error) {
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s-ca (%s.ca): %w", flag, key, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s-ca (%s.ca) %s: no PEM certificate in it", flag, key, caFile)
		}
		tc.RootCAs = pool
	}
	if certFile != "" || keyFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s-cert (%s.cert) %s and %s-key (%s.key): %w", flag, key, certFile, flag, key, tlsFileError(err))
		}
		tc.Certificates = []tls.Certificate{pair}
	}
	return tc, nil
}

// tlsFileError keeps a key file's error from quoting the key.
func tlsFileError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe
	}
	// crypto/tls's messages name the problem (no PEM data, mismatch) and
	// never quote the file's content.
	return err
}

// checkNATSCreds reports a credentials file (--nats-creds) that is set but
// does not hold what the NATS client reads from it when it connects: a user
// JWT and the user's nkey seed. The errors never quote the file.
func checkNATSCreds(path string) error {
	return checkSecretFile(path, func(b []byte) error {
		if !bytes.Contains(b, []byte("-----BEGIN NATS USER JWT-----")) {
			return errors.New("no user JWT in it (a .creds file from nsc holds a NATS USER JWT block and a USER NKEY SEED block; a bare seed file goes in --nats-nkey)")
		}
		if jwt, _ := nkeys.ParseDecoratedJWT(b); strings.Count(jwt, ".") != 2 {
			return errors.New("its NATS USER JWT block does not hold a JWT")
		}
		return checkUserSeed(b, "no user nkey seed in it")
	})
}

// checkNATSNKey reports an nkey seed file (--nats-nkey) that is set but
// does not hold a user nkey seed, as the NATS client reads it when it
// connects.
func checkNATSNKey(path string) error {
	return checkSecretFile(path, func(b []byte) error {
		return checkUserSeed(b, "no user nkey seed (SU…) in it")
	})
}

// checkSecretFile reads the file at path, if set, gives its content to
// check and then clears it.
func checkSecretFile(path string, check func([]byte) error) error {
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return unwrapPathError(err)
	}
	defer clear(b)
	return check(b)
}

// checkUserSeed reports b holding no user nkey seed, with what.
func checkUserSeed(b []byte, what string) error {
	kp, err := nkeys.ParseDecoratedUserNKey(b)
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	kp.Wipe()
	return nil
}

// unwrapPathError drops the path from a file error, which the caller names.
func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// DialTemporal connects to the external Temporal that c's Temporal settings
// name (address, namespace, TLS, API key) as the server does: `countersign
// bench --baseline` starts its baseline workflows on the server's Temporal.
func DialTemporal(ctx context.Context, c *Config) (client.Client, error) {
	if c.TemporalAddress == "" {
		return nil, errors.New("no Temporal address (--temporal-address)")
	}
	if c.TemporalNamespace == "" {
		c.TemporalNamespace = DefaultTemporalNamespace
	}
	if errs := c.validateTemporal(); len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	conn, creds, err := c.temporalConnection()
	if err != nil {
		return nil, err
	}
	tc, err := client.DialContext(ctx, client.Options{
		HostPort: c.TemporalAddress, Namespace: c.TemporalNamespace, ConnectionOptions: conn, Credentials: creds,
		Logger: tlog.NewStructuredLogger(slog.New(slog.DiscardHandler)),
	})
	if err != nil {
		return nil, fmt.Errorf("connect to Temporal at %s: %w%s", c.TemporalAddress, err, c.temporalDialHint(err))
	}
	return tc, nil
}
