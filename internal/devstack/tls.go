package devstack

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"sync"
	"time"

	"go.temporal.io/server/common/rpc/encryption"
)

// TLSServerName is the DNS name in the server certificate, and the name
// ClientTLS verifies, whatever address the client dials.
const TLSServerName = "temporal.devstack.countersign.invalid"

// Lifetimes. Leaf certificates are reissued from the CA when less than
// leafRenew of their life is left, so a long-running server keeps working;
// the CA outlives any reasonable dev session.
const (
	caLifetime   = 366 * 24 * time.Hour
	leafLifetime = 24 * time.Hour
	leafRenew    = 6 * time.Hour
	clockSkew    = 5 * time.Minute
)

// devPKI is a server's private PKI: an ECDSA P-256 CA made at every Start
// and the leaf certificates it issues, held only in memory. Every gRPC port
// of the server (frontend and internode) requires a client certificate from
// this CA, so only this process can talk to the server.
type devPKI struct {
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	pool   *x509.CertPool
	ips    []net.IP
	now    func() time.Time
	mu     sync.Mutex
	leaves map[bool]*tls.Certificate // server (true) and client (false)
}

func newDevPKI(ips []net.IP) (*devPKI, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devstack: CA key: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "countersign devstack CA"},
		NotBefore:             now.Add(-clockSkew),
		NotAfter:              now.Add(caLifetime),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("devstack: CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("devstack: CA certificate: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	return &devPKI{ca: ca, caKey: key, pool: pool, ips: ips, now: time.Now, leaves: map[bool]*tls.Certificate{}}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127)) // never fails (crypto/rand)
	return n
}

// leaf returns the current server or client certificate, issuing a new one
// when it is missing or near its end.
func (p *devPKI) leaf(server bool) (*tls.Certificate, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if c := p.leaves[server]; c != nil && c.Leaf.NotAfter.Sub(now) > leafRenew {
		return c, nil
	}
	if now.Add(leafLifetime).After(p.ca.NotAfter) {
		return nil, errors.New("devstack: the in-memory CA has expired; restart the server")
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("devstack: leaf key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		NotBefore:    now.Add(-clockSkew),
		NotAfter:     now.Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
	}
	if server {
		tmpl.Subject = pkix.Name{CommonName: TLSServerName}
		tmpl.DNSNames = []string{TLSServerName}
		tmpl.IPAddresses = p.ips
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	} else {
		tmpl.Subject = pkix.Name{CommonName: "countersign devstack client"}
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	if err != nil {
		return nil, fmt.Errorf("devstack: leaf certificate: %w", err)
	}
	parsed, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("devstack: leaf certificate: %w", err)
	}
	c := &tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: parsed}
	p.leaves[server] = c
	return c, nil
}

// serverConfig requires and verifies a client certificate from the CA.
func (p *devPKI) serverConfig() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS13,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return p.leaf(true) },
		ClientAuth:     tls.RequireAndVerifyClientCert,
		ClientCAs:      p.pool,
	}
}

// clientConfig presents the client certificate and trusts only the CA.
func (p *devPKI) clientConfig() *tls.Config {
	return &tls.Config{
		MinVersion:           tls.VersionTLS13,
		RootCAs:              p.pool,
		ServerName:           TLSServerName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return p.leaf(false) },
	}
}

// provider gives the embedded server's services mutual TLS on every port:
// the frontend and internode (history, matching, worker) alike.
func (p *devPKI) provider(dialHost string) encryption.TLSConfigProvider {
	return &encryption.FixedTLSConfigProvider{
		InternodeServerConfig:      p.serverConfig(),
		InternodeClientConfig:      p.clientConfig(),
		FrontendServerConfig:       p.serverConfig(),
		FrontendClientConfig:       p.clientConfig(),
		RemoteClusterClientConfigs: map[string]*tls.Config{dialHost: p.clientConfig(), loopback: p.clientConfig()},
	}
}

// clientPEM is the CA certificate and a client certificate and key, PEM.
func (p *devPKI) clientPEM() (ca, cert, key []byte, err error) {
	leaf, err := p.leaf(false)
	if err != nil {
		return nil, nil, nil, err
	}
	der, err := x509.MarshalPKCS8PrivateKey(leaf.PrivateKey)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("devstack: client key: %w", err)
	}
	ca = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: p.ca.Raw})
	cert = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leaf.Certificate[0]})
	key = pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	return ca, cert, key, nil
}
