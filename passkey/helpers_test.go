package passkey_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/descope/virtualwebauthn"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/natsrv"
	"github.com/countersign/countersign/internal/testpasskey"
	"github.com/countersign/countersign/passkey"
)

const (
	testRPID   = "example.com"
	testOrigin = "https://approvals.example.com"
)

// clock is a settable clock for expiry tests.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// env is a Service on a real embedded NATS, with a virtual browser.
type env struct {
	svc   *passkey.Service
	js    jetstream.JetStream
	clock *clock
	rp    virtualwebauthn.RelyingParty
}

func newEnv(tb testing.TB) *env {
	tb.Helper()
	srv, err := natsrv.Start(natsrv.Options{StoreDir: tb.TempDir()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(srv.Shutdown)
	nc, err := srv.Connect() // in process, as countersign dev connects
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	clk := &clock{t: time.Date(2026, 7, 1, 12, 0, 0, 0, time.UTC)}
	svc, err := passkey.New(context.Background(), js, passkey.Options{
		RPID:          testRPID,
		RPOrigins:     []string{testOrigin},
		RPDisplayName: "Countersign test",
		Now:           clk.Now,
	})
	if err != nil {
		tb.Fatal(err)
	}
	return &env{
		svc:   svc,
		js:    js,
		clock: clk,
		rp:    virtualwebauthn.RelyingParty{ID: testRPID, Name: "Countersign test", Origin: testOrigin},
	}
}

// kit is an enrolled approver with their virtual authenticator.
type kit struct {
	A      passkey.Approver
	CredID string
	Auth   virtualwebauthn.Authenticator
	Cred   virtualwebauthn.Credential
}

// attestation runs BeginEnrollment and builds the browser's registration
// response. mutate may tamper with the options before signing.
func (e *env) attestation(tb testing.TB, token string, auth virtualwebauthn.Authenticator, cred virtualwebauthn.Credential,
	transports []string, mutate func(*virtualwebauthn.AttestationOptions)) []byte {
	tb.Helper()
	creation, err := e.svc.BeginEnrollment(context.Background(), token)
	if err != nil {
		tb.Fatalf("BeginEnrollment: %v", err)
	}
	raw, err := json.Marshal(creation)
	if err != nil {
		tb.Fatal(err)
	}
	opts, err := virtualwebauthn.ParseAttestationOptions(string(raw))
	if err != nil {
		tb.Fatalf("ParseAttestationOptions: %v", err)
	}
	if mutate != nil {
		mutate(opts)
	}
	return withTransports(tb, virtualwebauthn.CreateAttestationResponse(e.rp, auth, cred, *opts), transports)
}

// withTransports adds response.transports, which a browser reports from
// getTransports() and virtualwebauthn leaves out. They are not signed.
func withTransports(tb testing.TB, resp string, transports []string) []byte {
	tb.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(resp), &m); err != nil {
		tb.Fatal(err)
	}
	if transports != nil {
		m["response"].(map[string]any)["transports"] = transports
	}
	out, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// enroll adds an approver and registers one EC2 passkey for them.
func (e *env) enroll(tb testing.TB, name string, groups []string, transports ...string) *kit {
	tb.Helper()
	ctx := context.Background()
	a, token, err := e.svc.AddApprover(ctx, name, groups)
	if err != nil {
		tb.Fatalf("AddApprover: %v", err)
	}
	// Real authenticators return the user handle for discoverable
	// credentials; the library then checks it against the approver.
	auth := virtualwebauthn.NewAuthenticatorWithOptions(virtualwebauthn.AuthenticatorOptions{UserHandle: []byte(a.ID)})
	cred := testpasskey.NewEC2Credential()
	if transports == nil {
		transports = []string{"hybrid", "internal"}
	}
	id, err := e.svc.FinishEnrollment(ctx, token, e.attestation(tb, token, auth, cred, transports, nil))
	if err != nil {
		tb.Fatalf("FinishEnrollment: %v", err)
	}
	auth.AddCredential(cred)
	a, err = e.svc.Approver(ctx, a.ID)
	if err != nil {
		tb.Fatal(err)
	}
	return &kit{A: a, CredID: id, Auth: auth, Cred: cred}
}

func hashOf(tb testing.TB, tool, args string) canon.ActionHash {
	tb.Helper()
	h, err := canon.Hash(tool, []byte(args), "countersign-test-server")
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// call is a held tool call and the challenge issued for it.
type call struct {
	Req passkey.ChallengeRequest
	Ch  passkey.Challenge
}

func (e *env) issue(tb testing.TB, taskID, group, class string) *call {
	tb.Helper()
	req := passkey.ChallengeRequest{
		TaskID:             taskID,
		Tool:               "delete_resource",
		ActionHash:         hashOf(tb, "delete_resource", `{"resourceId":"`+taskID+`"}`),
		Group:              group,
		AuthenticatorClass: class,
		DisplayText:        "Permanently delete resource " + taskID,
	}
	ch, err := e.svc.IssueChallenge(context.Background(), req)
	if err != nil {
		tb.Fatalf("IssueChallenge: %v", err)
	}
	return &call{Req: req, Ch: ch}
}

// sign has k's authenticator answer the challenge at rp, after bumping the
// credential's signature counter.
func (k *kit) sign(tb testing.TB, rp virtualwebauthn.RelyingParty, ch passkey.Challenge) json.RawMessage {
	tb.Helper()
	k.Cred.Counter++
	return k.signRaw(tb, rp, ch.RequestOptions.Challenge, k.Cred)
}

func (k *kit) signRaw(tb testing.TB, rp virtualwebauthn.RelyingParty, challenge []byte, cred virtualwebauthn.Credential) json.RawMessage {
	tb.Helper()
	opts := virtualwebauthn.AssertionOptions{Challenge: challenge, RelyingPartyID: rp.ID}
	return json.RawMessage(virtualwebauthn.CreateAssertionResponse(rp, k.Auth, cred, opts))
}

// verifyReq is the request the workflow would send for c with response.
func (c *call) verifyReq(resp json.RawMessage) passkey.VerifyRequest {
	return passkey.VerifyRequest{
		ChallengeID:        c.Ch.ID,
		TaskID:             c.Req.TaskID,
		Tool:               c.Req.Tool,
		ActionHash:         c.Req.ActionHash,
		Group:              c.Req.Group,
		AuthenticatorClass: c.Req.AuthenticatorClass,
		Requester:          "carol",
		ConsumerKey:        "consumer-" + c.Ch.ID,
		Method:             passkey.MethodWebAuthn,
		Response:           resp,
	}
}

func wantReason(tb testing.TB, err error, reason string) {
	tb.Helper()
	if err == nil {
		tb.Fatalf("got success, want %s", reason)
	}
	if got := passkey.ReasonOf(err); got != reason {
		tb.Fatalf("got error %v (reason %q), want reason %q", err, got, reason)
	}
	if !errors.Is(err, &passkey.Error{Reason: reason}) {
		tb.Fatalf("errors.Is(%v, reason %s) = false", err, reason)
	}
}

// gatedJS is a JetStream whose credentials bucket holds every write until the
// gate has seen a number of credential reads, so that that many concurrent
// verifications all read a credential before any of them writes it: the
// interleaving a race needs, every time, instead of now and then.
type gatedJS struct {
	jetstream.JetStream
	gate *gate
}

func (js gatedJS) CreateOrUpdateKeyValue(ctx context.Context, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.JetStream.CreateOrUpdateKeyValue(ctx, cfg)
	if err != nil || cfg.Bucket != passkey.BucketCredentials {
		return kv, err
	}
	return gatedKV{KeyValue: kv, gate: js.gate}, nil
}

type gatedKV struct {
	jetstream.KeyValue
	gate *gate
}

func (kv gatedKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	e, err := kv.KeyValue.Get(ctx, key)
	kv.gate.read()
	return e, err
}

func (kv gatedKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if err := kv.gate.wait(ctx); err != nil {
		return 0, err
	}
	return kv.KeyValue.Update(ctx, key, value, revision)
}

// gate opens after n reads, and stays open.
type gate struct {
	mu   sync.Mutex
	n    int
	open chan struct{}
}

func newGate(n int) *gate { return &gate{n: n, open: make(chan struct{})} }

func (g *gate) read() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.n > 0 {
		g.n--
		if g.n == 0 {
			close(g.open)
		}
	}
}

func (g *gate) wait(ctx context.Context) error {
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(10 * time.Second):
		return errors.New("test gate: too few credential reads")
	}
}
