package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.temporal.io/api/workflowservice/v1"
	"go.temporal.io/sdk/client"

	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/notify"
)

// TestDevStackAdmitsOnlyItsOwnProcess is the regression test for the forged
// admin token (issue 8): a local process could connect to the embedded NATS
// without credentials, write a token digest into the token bucket and use the
// forged admin token; the embedded Temporal frontend was open on loopback
// too.
func TestDevStackAdmitsOnlyItsOwnProcess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	a, err := New(ctx, Config{DataDir: dir, Addr: freeAddr(t), SQLiteSync: "NORMAL"}, ModeDev, nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(context.Background())

	// NATS without credentials: refused.
	if nc, err := nats.Connect(a.nats.Addr(), nats.NoReconnect()); err == nil {
		nc.Close()
		t.Fatal("connected to the dev NATS without credentials")
	} else if !errors.Is(err, nats.ErrAuthorization) {
		t.Fatalf("anonymous connection: %v, want an authorization violation", err)
	}

	// The credentials for other processes: in a file only the owner reads.
	p := filepath.Join(dir, NATSURLFile)
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm != 0o600 {
		t.Fatalf("%s has mode %v, want 0600", p, perm)
	}
	b, _ := os.ReadFile(p)
	clientURL := strings.TrimSpace(string(b))
	if clientURL != a.NATSURL() {
		t.Fatalf("%s and App.NATSURL differ", NATSURLFile)
	}
	nc, err := nats.Connect(clientURL, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	// They reach the decision service...
	m, err := nc.Request(notify.SubjectApproval, []byte(`{"ref":"apr_doesnotexist"}`), 10*time.Second)
	if err != nil {
		t.Fatalf("decision service: %v", err)
	}
	if st := m.Header.Get(notify.StatusHeader); st != "404" {
		t.Fatalf("decision service answered %s %s, want 404", st, m.Data)
	}
	// ...but cannot forge an admin token: not through KV, not by publishing
	// on the bucket's subject, not as a reply subject.
	forged := authn.NewToken(authn.KindAdmin)
	sum := sha256.Sum256([]byte(forged))
	subject := "$KV." + authn.Bucket + ".t." + hex.EncodeToString(sum[:])
	record, _ := json.Marshal(authn.Principal{Name: "mallory", Kind: authn.KindAdmin, CreatedAt: time.Now()})
	js, _ := jetstream.New(nc)
	short, cancelShort := context.WithTimeout(ctx, 2*time.Second)
	defer cancelShort()
	if kv, err := js.KeyValue(short, authn.Bucket); err == nil {
		if _, err := kv.Put(short, "t."+hex.EncodeToString(sum[:]), record); err == nil {
			t.Error("wrote into the token bucket through KV")
		}
	}
	_ = nc.Publish(subject, record)
	_ = nc.PublishRequest(notify.SubjectApproval, subject, []byte(`{"ref":"apr_doesnotexist"}`))
	_ = nc.Flush()
	time.Sleep(300 * time.Millisecond)
	if p, err := a.Tokens.Lookup(ctx, forged); !errors.Is(err, authn.ErrInvalidToken) {
		t.Fatalf("forged admin token accepted: %+v %v", p, err)
	}

	// Temporal: without the process's client certificate, no.
	hostPort := a.temporal.FrontendHostPort()
	for name, tlsCfg := range map[string]bool{"plaintext": false, "TLS without a client certificate": true} {
		opts := client.Options{HostPort: hostPort, Namespace: a.cfg.TemporalNamespace}
		if tlsCfg {
			c := a.temporal.ClientTLS()
			c.GetClientCertificate = nil
			opts.ConnectionOptions.TLS = c
		}
		dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
		c, err := client.DialContext(dctx, opts)
		dcancel()
		if err == nil {
			c.Close()
			t.Errorf("Temporal, %s: connected", name)
		}
	}
	c, err := client.DialContext(ctx, client.Options{HostPort: hostPort, Namespace: a.cfg.TemporalNamespace,
		ConnectionOptions: client.ConnectionOptions{TLS: a.temporal.ClientTLS()}})
	if err != nil {
		t.Fatalf("Temporal with the process's client certificate: %v", err)
	}
	defer c.Close()
	if _, err := c.WorkflowService().DescribeNamespace(ctx, &workflowservice.DescribeNamespaceRequest{Namespace: a.cfg.TemporalNamespace}); err != nil {
		t.Fatalf("DescribeNamespace with the client certificate: %v", err)
	}
}
