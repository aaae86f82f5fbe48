package devstack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strconv"
	"testing"
	"time"

	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
)

// TestOnlyTheOwnerReachesTheServer: the frontend answers a client that
// presents the server's client certificate, and refuses plaintext, a client
// without a certificate, and a client whose certificate comes from another
// CA. The internode ports (history, matching, worker) refuse the same way, so
// a local process cannot go around the frontend.
func TestOnlyTheOwnerReachesTheServer(t *testing.T) {
	dir := t.TempDir()
	s := startServer(t, Options{DataDir: dir, Synchronous: SynchronousNormal})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	// The owner's certificate: works, through the SDK.
	c, err := dial(s)
	if err != nil {
		t.Fatalf("dial with the client certificate: %v", err)
	}
	if _, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.Namespace()}); err != nil {
		t.Fatalf("DescribeNamespace with the client certificate: %v", err)
	}
	c.Close()

	noCert := s.ClientTLS()
	noCert.GetClientCertificate = nil
	other, err := newDevPKI(certIPs(loopback))
	if err != nil {
		t.Fatal(err)
	}
	strangerCert := s.ClientTLS() // trusts the server, but presents a certificate of another CA
	strangerCert.GetClientCertificate = other.clientConfig().GetClientCertificate

	describe := func(creds credentials.TransportCredentials) error {
		conn, err := grpc.NewClient(s.FrontendHostPort(), grpc.WithTransportCredentials(creds))
		if err != nil {
			return err
		}
		defer conn.Close()
		cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		_, err = workflowservice.NewWorkflowServiceClient(conn).DescribeNamespace(cctx, &workflowservice.DescribeNamespaceRequest{Namespace: s.Namespace()})
		return err
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"plaintext":                 insecure.NewCredentials(),
		"TLS without a certificate": credentials.NewTLS(noCert),
		"certificate of another CA": credentials.NewTLS(strangerCert),
	} {
		if err := describe(creds); err == nil {
			t.Errorf("frontend, %s: DescribeNamespace succeeded", name)
		}
	}
	// And through the SDK, as a local process would try it.
	if c, err := client.Dial(client.Options{HostPort: s.FrontendHostPort(), Namespace: s.Namespace(), Logger: quietSDKLogger()}); err == nil {
		c.Close()
		t.Errorf("SDK client without TLS connected")
	}
	if c, err := client.Dial(client.Options{HostPort: s.FrontendHostPort(), Namespace: s.Namespace(), Logger: quietSDKLogger(),
		ConnectionOptions: client.ConnectionOptions{TLS: noCert}}); err == nil {
		c.Close()
		t.Errorf("SDK client without a client certificate connected")
	}

	// Every port: a TLS handshake without a client certificate is refused.
	p, _, err := loadPorts(dir)
	if err != nil {
		t.Fatal(err)
	}
	for name, port := range map[string]int{"frontend": p.Frontend, "history": p.History, "matching": p.Matching, "worker": p.Worker} {
		addr := net.JoinHostPort(loopback, strconv.Itoa(port))
		raw, err := net.DialTimeout("tcp", addr, 3*time.Second)
		if err != nil {
			continue // the service does not listen on its port (worker)
		}
		conn := tls.Client(raw, noCert)
		_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
		err = conn.Handshake()
		if err == nil {
			// TLS 1.3: the server's verdict on the client's certificate
			// arrives after the client's side of the handshake.
			_, err = conn.Read(make([]byte, 1))
		}
		conn.Close()
		t.Logf("%s port %d without a client certificate: %v", name, port, err)
		var alert tls.AlertError
		if err == nil || (!errors.As(err, &alert) && !isTLSRefusal(err)) {
			t.Errorf("%s port %d: no refusal without a client certificate: %v", name, port, err)
		}
	}
}

// isTLSRefusal accepts the forms a refused handshake takes when the alert is
// not surfaced as a tls.AlertError.
func isTLSRefusal(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && !ne.Timeout()
}

// TestLeafRenewal: leaf certificates are reissued before they expire, from
// the same CA, so a long-running server keeps accepting its own clients.
func TestLeafRenewal(t *testing.T) {
	p, err := newDevPKI(certIPs(loopback))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	p.now = func() time.Time { return now }
	first, err := p.leaf(false)
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := p.leaf(false); again != first {
		t.Fatal("a fresh leaf was reissued")
	}
	now = now.Add(leafLifetime - leafRenew + time.Minute)
	renewed, err := p.leaf(false)
	if err != nil {
		t.Fatal(err)
	}
	if renewed == first || !renewed.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Fatal("a leaf near its end was not reissued")
	}
	opts := x509.VerifyOptions{Roots: p.pool, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if _, err := renewed.Leaf.Verify(opts); err != nil {
		t.Fatalf("renewed leaf does not verify: %v", err)
	}
	srv, err := p.leaf(true)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Leaf.VerifyHostname(TLSServerName); err != nil {
		t.Fatal(err)
	}
	if err := srv.Leaf.VerifyHostname(loopback); err != nil {
		t.Fatal(err)
	}
}
