package passkey_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/countersign/countersign/passkey"
)

// TestChallengeCapacity: a challenges bucket created without a cap gets
// one when a service opens it with ChallengeMaxBytes, with DiscardNew.
// Once it holds ChallengeAdmitBytes, IssueChallenge refuses with
// ErrChallengeCapacity and stores nothing; every challenge issued before
// is still there, verifies and is consumed, and a consumed one still
// refuses its replay. A consume the bucket itself refuses (no room left)
// is ErrChallengeCapacity too, and consumes nothing; under a raised cap
// it succeeds.
func TestChallengeCapacity(t *testing.T) {
	w := newWorld(t) // the default cap
	ctx := context.Background()
	early := w.issue(t, "task-early", "finance", "")

	const capBytes = passkey.MinChallengeMaxBytes
	svc, err := passkey.New(ctx, w.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin},
		Now: w.clock.Now, ChallengeMaxBytes: capBytes})
	if err != nil {
		t.Fatal(err)
	}
	st, err := w.js.Stream(ctx, "KV_"+passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := st.CachedInfo().Config; cfg.MaxBytes != capBytes || cfg.Discard != jetstream.DiscardNew {
		t.Fatalf("bucket MaxBytes %d, discard %v; want %d, DiscardNew", cfg.MaxBytes, cfg.Discard, capBytes)
	}
	kv, err := w.js.KeyValue(ctx, passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	values := func() uint64 {
		s, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s.Values()
	}

	req := early.Req
	req.DisplayText = strings.Repeat("x", 4000)
	req.Asker = passkey.AskerApprover
	var issued []passkey.Challenge
	for i := 0; ; i++ {
		if i > 5000 {
			t.Fatal("the bucket never filled")
		}
		req.TaskID = fmt.Sprintf("task-%d", i)
		ch, err := svc.IssueChallenge(ctx, req)
		if errors.Is(err, passkey.ErrChallengeCapacity) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		issued = append(issued, ch)
	}
	n := values()
	if _, err := svc.IssueChallenge(ctx, req); !errors.Is(err, passkey.ErrChallengeCapacity) || passkey.ReasonOf(err) != "" {
		t.Fatalf("a full bucket: %v", err)
	}
	if values() != n || n != uint64(len(issued)+1) {
		t.Fatalf("%d values, want %d: a refused challenge was stored or one was evicted", values(), len(issued)+1)
	}

	// Earlier challenges verify and are consumed; a replay is refused.
	resp := w.alice.sign(t, w.rp, early.Ch)
	if _, err := svc.Verify(ctx, early.verifyReq(resp)); err != nil {
		t.Fatalf("an earlier challenge at capacity: %v", err)
	}
	replay := early.verifyReq(resp)
	replay.ConsumerKey = "someone-else"
	_, err = svc.Verify(ctx, replay)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	last := &call{Req: req, Ch: issued[len(issued)-1]}
	last.Req.TaskID = fmt.Sprintf("task-%d", len(issued)-1)

	// The bucket's own cap: filled to the last byte, it refuses the
	// consume (the record grows), and the challenge stays unconsumed.
	var fillers []string
	for i := 0; ; i++ {
		key := fmt.Sprintf("filler%d", i)
		if _, err := kv.Create(ctx, key, []byte(strings.Repeat("f", 256))); err != nil {
			break
		}
		fillers = append(fillers, key)
	}
	_, err = svc.Verify(ctx, last.verifyReq(w.alice.sign(t, w.rp, last.Ch)))
	if !errors.Is(err, passkey.ErrChallengeCapacity) || passkey.ReasonOf(err) != "" {
		t.Fatalf("a consume with no room: %v", err)
	}
	// The operator raises the cap: it applies at the next start, and the
	// challenge is consumed, once.
	svc, err = passkey.New(ctx, w.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin},
		Now: w.clock.Now, ChallengeMaxBytes: 2 * capBytes})
	if err != nil {
		t.Fatal(err)
	}
	resp = w.alice.sign(t, w.rp, last.Ch)
	if _, err := svc.Verify(ctx, last.verifyReq(resp)); err != nil {
		t.Fatalf("the same challenge under a raised cap: %v", err)
	}
	replay = last.verifyReq(resp)
	replay.ConsumerKey = "someone-else"
	_, err = svc.Verify(ctx, replay)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	if len(fillers) == 0 {
		t.Fatal("no filler fit")
	}
}

// TestChallengeRecordLeavesDisplayTextOut: the display text, which an
// agent chooses through the arguments (4,000 bytes of "<" would be stored
// as 24,000), is not stored: a challenge takes the same room whatever it
// says, so the bucket's share of each asker is counted in challenges, not
// in what an agent makes them say.
func TestChallengeRecordLeavesDisplayTextOut(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.enroll(t, "alice", []string{"finance"})
	kv, err := e.js.KeyValue(ctx, passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int{}
	for _, display := range []string{"Delete", strings.Repeat("<", passkey.MaxDisplayText)} {
		ch, err := e.svc.IssueChallenge(ctx, passkey.ChallengeRequest{TaskID: "task-1", Tool: "delete_resource",
			ActionHash: hashOf(t, "delete_resource", "{}"), Group: "finance", DisplayText: display, Asker: passkey.AskerApprover})
		if err != nil {
			t.Fatal(err)
		}
		if ch.DisplayText != display {
			t.Fatalf("the challenge says %.20q, want %.20q", ch.DisplayText, display)
		}
		entry, err := kv.Get(ctx, ch.ID)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(entry.Value()), "Delete") || strings.Contains(string(entry.Value()), `\u003c`) {
			t.Fatalf("the stored challenge holds its display text: %.200s", entry.Value())
		}
		sizes[display[:1]] = len(entry.Value())
	}
	if sizes["D"] != sizes["<"] || sizes["<"] > 1024 {
		t.Fatalf("stored sizes %v: want one size, under 1 KiB", sizes)
	}
}

// TestUnansweredChallengesAgeOut: a challenge never answered is purged by
// NATS soon after its lifetime (here 1 s lifetimes, purged at 2 s), in a
// bucket made before per-key TTLs as in a new one, while a consumed one is
// kept (ChallengeRetention) and still refuses its replay. Before, every
// challenge was kept 48 h, so asking for challenges and never answering
// them filled the bucket.
func TestUnansweredChallengesAgeOut(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	// The bucket as versions before per-key TTLs made it.
	if err := e.js.DeleteKeyValue(ctx, passkey.BucketChallenges); err != nil {
		t.Fatal(err)
	}
	if _, err := e.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: passkey.BucketChallenges, History: 1,
		TTL: passkey.ChallengeRetention, MaxBytes: passkey.DefaultChallengeMaxBytes, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	svc, err := passkey.New(ctx, e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}, Now: e.clock.Now,
		ChallengeTTL: time.Second, InBandChallengeTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	alice := e.enroll(t, "alice", []string{"finance"})
	e.enrollInBand(t, "agent-a", "usb")

	answered := e.issue(t, "task-answered", "finance", "")
	unanswered := e.issue(t, "task-unanswered", "finance", "")
	inBand, err := e.issueInBand(t, "agent-a", "")
	if err != nil {
		t.Fatal(err)
	}
	resp := alice.sign(t, e.rp, answered.Ch)
	if _, err := svc.Verify(ctx, answered.verifyReq(resp)); err != nil {
		t.Fatalf("the answered challenge: %v", err)
	}

	kv, err := e.js.KeyValue(ctx, passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, id := range []string{unanswered.Ch.ID, inBand.Ch.ID} {
		for {
			_, err := kv.Get(ctx, id)
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if time.Now().After(deadline) {
				t.Fatalf("challenge %s never answered is still stored 10 s after its 1 s lifetime", id)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if _, err := kv.Get(ctx, answered.Ch.ID); err != nil {
		t.Fatalf("the consumed challenge: %v", err)
	}
	replay := answered.verifyReq(resp)
	replay.ConsumerKey = "someone-else"
	_, err = svc.Verify(ctx, replay)
	wantReason(t, err, passkey.ReasonChallengeConsumed)
	_, err = svc.Verify(ctx, unanswered.verifyReq(alice.sign(t, e.rp, unanswered.Ch)))
	wantReason(t, err, passkey.ReasonChallengeUnknown)
}

// TestChallengeRoomForApprovers: agents asking in-band, each challenge for
// new arguments, fill the challenges bucket only to
// AgentChallengeAdmitBytes; then they are refused with
// ErrChallengeCapacity, storing nothing, while the approver site's
// challenges are still admitted, up to ChallengeAdmitBytes.
func TestChallengeRoomForApprovers(t *testing.T) {
	e, svc := newSmallBucketEnv(t)
	ctx := context.Background()
	const capBytes = passkey.MinChallengeMaxBytes
	e.enrollInBand(t, "agent-a", "usb")
	e.enrollInBand(t, "agent-b", "usb")
	e.enroll(t, "alice", []string{"finance"})
	kv, err := e.js.KeyValue(ctx, passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	status := func() (bytes, values uint64) {
		s, err := kv.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return s.Bytes(), s.Values()
	}

	// The largest display text an agent's arguments make (not stored).
	display := strings.Repeat("<", passkey.MaxDisplayText)
	agent := func(i int) error {
		principal := []string{"agent-a", "agent-b"}[i%2]
		args := fmt.Sprintf(`{"n":%d}`, i)
		_, err := svc.IssueChallenge(ctx, passkey.ChallengeRequest{Tool: "place_trade",
			ActionHash: hashOf(t, "place_trade", args), Principal: principal, DisplayText: display})
		return err
	}
	approver := func(i int) error {
		_, err := svc.IssueChallenge(ctx, passkey.ChallengeRequest{TaskID: fmt.Sprintf("task-%d", i),
			Tool: "delete_resource", ActionHash: hashOf(t, "delete_resource", "{}"), Group: "finance",
			DisplayText: display, Decision: "approve", Asker: passkey.AskerApprover})
		return err
	}

	agents := issueUntilFull(t, "agents", agent)
	bytes, values := status()
	if limit := uint64(passkey.AgentChallengeAdmitBytes(capBytes)); bytes < limit || bytes >= limit+32<<10 {
		t.Fatalf("agents were refused at %d bytes; their admission limit is %d", bytes, limit)
	}
	if err := agent(agents); !errors.Is(err, passkey.ErrChallengeCapacity) {
		t.Fatalf("an agent at its admission limit: %v", err)
	}
	if _, v := status(); v != values {
		t.Fatalf("%d values, want %d: a refused challenge was stored", v, values)
	}

	// The approver site still has room, to seven eighths.
	approvers := issueUntilFull(t, "the approver site", approver)
	if approvers < 10 {
		t.Fatalf("the approver site got %d challenges after the agents' flood", approvers)
	}
	if bytes, _ := status(); bytes < uint64(passkey.ChallengeAdmitBytes(capBytes)) {
		t.Fatalf("the approver site was refused at %d bytes; its admission limit is %d", bytes, passkey.ChallengeAdmitBytes(capBytes))
	}
	if err := agent(agents); !errors.Is(err, passkey.ErrChallengeCapacity) {
		t.Fatalf("an agent over its admission limit: %v", err)
	}
}

// TestChallengeAsker: an unknown asker, or an in-band challenge that
// claims to be the approver site's, is refused and stores nothing.
func TestChallengeAsker(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.enrollInBand(t, "agent-a", "usb")
	e.enroll(t, "alice", []string{"finance"})
	inBand := passkey.ChallengeRequest{Tool: "place_trade", ActionHash: hashOf(t, "place_trade", "{}"),
		Principal: "agent-a", DisplayText: "Buy 1 AAPL"}
	group := passkey.ChallengeRequest{TaskID: "task-1", Tool: "delete_resource",
		ActionHash: hashOf(t, "delete_resource", "{}"), Group: "finance", DisplayText: "Delete"}
	for _, tc := range []struct {
		name  string
		req   passkey.ChallengeRequest
		asker string
		want  string
	}{
		{"in-band as the approver site", inBand, passkey.AskerApprover, "in-band challenge is an agent's"},
		{"in-band, unknown asker", inBand, "admin", `asker "admin"`},
		{"group, unknown asker", group, "Approver", `asker "Approver"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.req.Asker = tc.asker
			_, err := e.svc.IssueChallenge(ctx, tc.req)
			if !errors.Is(err, passkey.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want ErrInvalidArgument naming %s", err, tc.want)
			}
		})
	}
	kv, err := e.js.KeyValue(ctx, passkey.BucketChallenges)
	if err != nil {
		t.Fatal(err)
	}
	if s, err := kv.Status(ctx); err != nil || s.Values() != 0 {
		t.Fatalf("%v values stored (%v)", s.Values(), err)
	}
	for _, asker := range []string{"", passkey.AskerAgent} {
		inBand.Asker = asker
		if _, err := e.svc.IssueChallenge(ctx, inBand); err != nil {
			t.Fatalf("asker %q: %v", asker, err)
		}
	}
}

func TestChallengeMaxBytesTooSmall(t *testing.T) {
	e := newEnv(t)
	_, err := passkey.New(context.Background(), e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin},
		ChallengeMaxBytes: passkey.MinChallengeMaxBytes - 1})
	if err == nil || !strings.Contains(err.Error(), "ChallengeMaxBytes") {
		t.Fatalf("got %v", err)
	}
}

// issueUntilFull calls issue(0), issue(1), … until the challenges bucket
// refuses one for its capacity, and returns how many it admitted.
func issueUntilFull(t *testing.T, who string, issue func(i int) error) int {
	t.Helper()
	for i := 0; i <= 5000; i++ {
		err := issue(i)
		if errors.Is(err, passkey.ErrChallengeCapacity) {
			return i
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Fatalf("%s: no challenge refused in 5,001", who)
	return 0
}

// newSmallBucketEnv is newEnv with its service on a challenges bucket of
// MinChallengeMaxBytes.
func newSmallBucketEnv(t *testing.T) (*env, *passkey.Service) {
	t.Helper()
	e := newEnv(t)
	svc, err := passkey.New(context.Background(), e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin},
		Now: e.clock.Now, ChallengeMaxBytes: passkey.MinChallengeMaxBytes})
	if err != nil {
		t.Fatal(err)
	}
	e.svc = svc
	return e, svc
}
