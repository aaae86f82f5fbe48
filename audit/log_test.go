package audit

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/internal/testnats"
)

func openLog(t *testing.T) (*Log, *Keyring) { return openLogB(t) }

func openLogB(t testing.TB) (*Log, *Keyring) {
	t.Helper()
	js, _ := testnats.Start(t)
	k := testKeys(t)
	l, err := Open(context.Background(), js, Options{Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	return l, k
}

func requestedStep(t testing.TB, at time.Time) (Step, canon.ActionHash) {
	args := json.RawMessage(`{"to":"acct-1","amount":5000,"currency":"USD"}`)
	h, _ := canon.Hash("transfer_funds", args, "srv")
	env, err := NewEnvelope("transfer_funds", args, h.String(), "agent", "tool:transfer_funds", "srv", at, false)
	if err != nil {
		t.Fatal(err)
	}
	return Step{ID: StepRequested, Kind: KindRequested, At: at, Body: Requested{Envelope: env, PolicyVersion: "pv",
		Requirement: Requirement{Group: "g", Quorum: 1}, ExpiresAt: at.Add(time.Hour)}}, h
}

func TestLogAppendIsIdempotentAndNeverForks(t *testing.T) {
	l, k := openLog(t)
	ctx := context.Background()
	at := time.Now().UTC()
	const task = "tsk_log1"
	req, h := requestedStep(t, at)
	// Ten approvers race below; all ten are needed, so every approval
	// counts (the verifier rejects approvals accepted past the quorum).
	body := req.Body.(Requested)
	body.Requirement.Quorum = 10
	req.Body = body
	if _, err := l.Append(ctx, task, Step{ID: "notify", Kind: KindNotified, At: at, Body: struct{}{}}); err == nil {
		t.Fatal("a chain may not start without its requested record")
	}
	r1, err := l.Append(ctx, task, req)
	if err != nil {
		t.Fatal(err)
	}
	// A retried step writes nothing and answers the same receipt.
	r2, err := l.Append(ctx, task, req)
	if err != nil || r2 != r1 {
		t.Fatalf("retry: %v %+v vs %+v", err, r2, r1)
	}
	// Concurrent writers (several steps, each retried at once) make one
	// linear chain with each step once.
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 10 {
		a := newPasskey(t, fmt.Sprintf("cred%d", i)).approve(t, fmt.Sprintf("ap%d", i), "approve", h, at)
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, err := l.Append(ctx, task, Step{ID: fmt.Sprintf("decision/%d", i), Kind: KindDecision, At: at,
					Body: Decision{Decision: "approve", Accepted: true, Approval: &a}})
				errs <- err
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Append(ctx, task, Step{ID: "reevaluated", Kind: KindReevaluated, At: at, Body: Policy{Allow: true, PolicyVersion: "pv"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, task, Step{ID: "claimed", Kind: KindClaimed, At: at, Body: Policy{Allow: true, PolicyVersion: "pv"}}); err != nil {
		t.Fatal(err)
	}
	end := End{Kind: KindExecuted, At: at, Status: "completed", Disposition: "approved-executed", ResultDigest: "00"}
	rc, err := l.Seal(ctx, task, end)
	if err != nil {
		t.Fatal(err)
	}
	rc2, err := l.Seal(ctx, task, end)
	if err != nil || rc2 != rc {
		t.Fatalf("second seal: %v %+v vs %+v", err, rc2, rc)
	}
	if rc.RecordRef != task+"/14" {
		t.Errorf("receipt ref %q, want %s/14", rc.RecordRef, task)
	}
	if _, err := l.Append(ctx, task, Step{ID: "late", Kind: KindNotified, At: at, Body: struct{}{}}); err != ErrSealed {
		t.Fatalf("append after seal: %v, want ErrSealed", err)
	}
	lines, err := l.Chain(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != 15 {
		t.Fatalf("chain has %d records, want 15", len(lines))
	}
	if Hash(lines[14]) != rc.Hash {
		t.Error("receipt hash is not the outcome record's hash")
	}
	rep := Verify(lines, k.PublicKeys(), VerifyOptions{})
	if !rep.OK {
		b, _ := json.MarshalIndent(rep, "", " ")
		t.Fatalf("stored chain does not verify:\n%s", b)
	}
	if rep.Tasks[0].Approvals != 10 {
		t.Errorf("approvals %d, want 10", rep.Tasks[0].Approvals)
	}
}

func TestLogStreamDeniesDeleteAndPurge(t *testing.T) {
	l, _ := openLog(t)
	ctx := context.Background()
	req, _ := requestedStep(t, time.Now())
	if _, err := l.Append(ctx, "tsk_del", req); err != nil {
		t.Fatal(err)
	}
	if err := l.stream.DeleteMsg(ctx, 1); err == nil {
		t.Error("a record could be deleted")
	}
	if err := l.stream.Purge(ctx); err == nil {
		t.Error("the stream could be purged")
	}
	if _, err := l.Chain(ctx, "tsk_del"); err != nil {
		t.Fatal(err)
	}
}

func TestLogExport(t *testing.T) {
	l, k := openLog(t)
	ctx := context.Background()
	var got [][]byte
	if err := l.Export(ctx, time.Time{}, func(b []byte) error { got = append(got, b); return nil }); err != nil || len(got) != 0 {
		t.Fatalf("empty export: %v, %d lines", err, len(got))
	}
	old := time.Now().UTC()
	for i, task := range []string{"tsk_e1", "tsk_e2", "tsk_e3"} {
		if i == 2 {
			time.Sleep(20 * time.Millisecond)
			old = time.Now().UTC()
			time.Sleep(20 * time.Millisecond)
		}
		req, _ := requestedStep(t, time.Now())
		if _, err := l.Append(ctx, task, req); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Seal(ctx, task, End{Kind: KindExpired, At: time.Now(), Status: "completed", Disposition: "denied-not-executed"}); err != nil {
			t.Fatal(err)
		}
	}
	got = nil
	if err := l.Export(ctx, time.Time{}, func(b []byte) error { got = append(got, b); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 9 {
		t.Fatalf("export: %d lines, want 9", len(got))
	}
	if rep := Verify(got, k.PublicKeys(), VerifyOptions{}); !rep.OK || len(rep.Tasks) != 3 {
		t.Fatalf("export does not verify: %+v", rep)
	}
	got = nil
	if err := l.Export(ctx, old, func(b []byte) error { got = append(got, b); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("export since: %d lines, want 3 (one whole chain)", len(got))
	}
	got = nil
	if err := l.Export(ctx, time.Now().Add(time.Hour), func(b []byte) error { got = append(got, b); return nil }); err != nil || len(got) != 0 {
		t.Fatalf("export since the future: %v, %d lines", err, len(got))
	}
}

// TestLogReplicasAppendThroughStaleTails: two Logs on one stream (two
// replicas) append to the same chains, at once and in turn, each retrying
// steps the other wrote after its own last append. Each Log's cached tail
// is then stale; the chain must still be one linear chain with each step
// once, every answer for a step must be that record's receipt, and a
// sealed chain must refuse either Log.
func TestLogReplicasAppendThroughStaleTails(t *testing.T) {
	js, _ := testnats.Start(t)
	k := testKeys(t)
	ctx := context.Background()
	var logs [2]*Log
	for i := range logs {
		l, err := Open(ctx, js, Options{Keys: k})
		if err != nil {
			t.Fatal(err)
		}
		logs[i] = l
	}
	at := time.Now().UTC()
	for round := range 20 {
		task := fmt.Sprintf("tsk_tail%d", round)
		a, b := logs[round%2], logs[1-round%2]
		req, _ := requestedStep(t, at)
		want := map[string]Receipt{}
		check := func(step string, rc Receipt, err error) {
			t.Helper()
			if err != nil {
				t.Fatalf("round %d, step %s: %v", round, step, err)
			}
			if old, ok := want[step]; ok && old != rc {
				t.Fatalf("round %d, step %s: receipt %+v, earlier %+v", round, step, rc, old)
			}
			want[step] = rc
		}
		notified := func(id string) Step { return Step{ID: id, Kind: KindNotified, At: at, Body: struct{}{}} }
		rc, err := a.Append(ctx, task, req)
		check(StepRequested, rc, err)
		rc, err = b.Append(ctx, task, req)
		check(StepRequested, rc, err)
		// Both Logs now hold a tail; each append below makes the other's stale.
		for i := range 4 {
			id := fmt.Sprintf("turn/%d", i)
			rc, err = a.Append(ctx, task, notified(id))
			check(id, rc, err)
			rc, err = b.Append(ctx, task, notified(id))
			check(id, rc, err)
			a, b = b, a
		}
		// At once: every step from both Logs, twice.
		var mu sync.Mutex
		var wg sync.WaitGroup
		for i := range 16 {
			l := logs[i%2]
			id := fmt.Sprintf("burst/%d", i/4)
			wg.Go(func() {
				rc, err := l.Append(ctx, task, notified(id))
				mu.Lock()
				defer mu.Unlock()
				check(id, rc, err)
			})
		}
		wg.Wait()
		// A step the other Log wrote, retried through a Log whose tail does
		// not hold it.
		rc, err = a.Append(ctx, task, notified("late/a"))
		check("late/a", rc, err)
		rc, err = b.Append(ctx, task, notified("late/b"))
		check("late/b", rc, err)
		rc, err = a.Append(ctx, task, notified("late/b"))
		check("late/b", rc, err)
		rc, err = b.Append(ctx, task, notified("late/a"))
		check("late/a", rc, err)
		// The requested record again, from a Log that has never seen the
		// chain (it tries it as the first record; the chain has 11).
		fresh, err := Open(ctx, js, Options{Keys: k})
		if err != nil {
			t.Fatal(err)
		}
		rc, err = fresh.Append(ctx, task, req)
		check(StepRequested, rc, err)
		rc, err = fresh.Append(ctx, task, notified("fresh"))
		check("fresh", rc, err)
		end := End{Kind: KindFailed, At: at, Status: "failed"}
		if _, err := b.Seal(ctx, task, end); err != nil {
			t.Fatalf("round %d: seal: %v", round, err)
		}
		for _, l := range logs {
			if _, err := l.Append(ctx, task, notified("after")); err != ErrSealed {
				t.Fatalf("round %d: append after the seal: %v, want ErrSealed", round, err)
			}
		}
		lines, err := a.Chain(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(want) + 2; len(lines) != n { // + the end and the outcome
			t.Fatalf("round %d: %d records, want %d", round, len(lines), n)
		}
		for i, line := range lines[:len(lines)-2] {
			var r Record
			if err := json.Unmarshal(line, &r); err != nil {
				t.Fatal(err)
			}
			if rc := want[r.StepID]; rc.Hash != Hash(line) || rc.RecordRef != fmt.Sprintf("%s/%d", task, i) {
				t.Fatalf("round %d: record %d (%s) is not the receipt %+v", round, i, r.StepID, rc)
			}
		}
		if rep := Verify(lines, k.PublicKeys(), VerifyOptions{}); !rep.OK {
			out, _ := json.MarshalIndent(rep, "", " ")
			t.Fatalf("round %d: chain does not verify:\n%s", round, out)
		}
	}
}

// A Log counts as written only the records it can verify. Whoever may
// publish to the stream but holds no key must not be able to make a step
// look written (a claim, an end) or a chain look sealed, so that the real
// record is never appended and the caller gets a receipt for a record that
// is not its own: a record of another chain makes the chain one nobody can
// append to (ErrBrokenChain), and a record the Log cannot verify stays in
// the chain, for the verifier to report, with the Log's own records after it.
func TestLogAppendCountsOnlyRecordsItVerifies(t *testing.T) {
	js, _ := testnats.Start(t)
	k := testKeys(t)
	ctx := context.Background()
	l, err := Open(ctx, js, Options{Keys: k})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().UTC()
	req, _ := requestedStep(t, at)
	policy := Policy{Allow: true, PolicyVersion: "pv"}
	end := End{Kind: KindExecuted, At: at, Status: "completed", Disposition: "approved-executed", ResultDigest: "00"}
	claim := Step{ID: "claimed", Kind: KindClaimed, At: at, Body: policy}

	// A sealed chain whose signed records an attacker replays.
	if _, err := l.Append(ctx, "tsk_donor", req); err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{KindReevaluated, KindClaimed} {
		if _, err := l.Append(ctx, "tsk_donor", Step{ID: kind, Kind: kind, At: at, Body: policy}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Seal(ctx, "tsk_donor", end); err != nil {
		t.Fatal(err)
	}
	donor, err := l.Chain(ctx, "tsk_donor")
	if err != nil {
		t.Fatal(err)
	}
	// forged is a record of task at seq 1 after prev, of kind (also its
	// step), signed by keyID with the signature sig makes.
	forged := func(task, prev, kind, keyID string, sig func(unsigned []byte) []byte) []byte {
		body, _ := json.Marshal(policy)
		r := Record{Version: RecordVersion, TaskID: task, Seq: 1, Kind: kind, StepID: kind, At: at, Prev: prev, KeyID: keyID, Body: body}
		unsigned, err := canonical(r)
		if err != nil {
			t.Fatal(err)
		}
		r.Sig = base64.RawURLEncoding.EncodeToString(sig(unsigned))
		line, err := canonical(r)
		if err != nil {
			t.Fatal(err)
		}
		return line
	}
	zero := func([]byte) []byte { return make([]byte, ed25519.SignatureSize) }
	other := testKeys(t)
	byOther := func(u []byte) []byte { return other.signWith(other.CurrentID(), u) }

	t.Run("another chain's records", func(t *testing.T) {
		for task, line := range map[string][]byte{"tsk_outcome": donor[len(donor)-1], "tsk_claim": donor[2]} {
			if _, err := l.Append(ctx, task, req); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, SubjectPrefix+task, line); err != nil {
				t.Fatal(err)
			}
			if rc, err := l.Append(ctx, task, claim); !errors.Is(err, ErrBrokenChain) {
				t.Errorf("%s: claim after another task's record: %v, %+v, want ErrBrokenChain", task, err, rc)
			}
			if rc, err := l.Seal(ctx, task, end); !errors.Is(err, ErrBrokenChain) {
				t.Errorf("%s: seal after another task's record: %v, %+v, want ErrBrokenChain", task, err, rc)
			}
		}
	})
	for _, tc := range []struct {
		name, task string
		inject     func(task, prev string) []byte
	}{
		{"a forged claim", "tsk_forged_claim", func(task, prev string) []byte { return forged(task, prev, KindClaimed, k.CurrentID(), zero) }},
		{"a forged outcome", "tsk_forged_outcome", func(task, prev string) []byte { return forged(task, prev, KindOutcome, k.CurrentID(), zero) }},
		{"a claim by a key the Log does not have", "tsk_foreign_claim", func(task, prev string) []byte {
			return forged(task, prev, KindClaimed, other.CurrentID(), byOther)
		}},
		{"an outcome by a key the Log does not have", "tsk_foreign_outcome", func(task, prev string) []byte {
			return forged(task, prev, KindOutcome, other.CurrentID(), byOther)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			task := tc.task
			rc, err := l.Append(ctx, task, req)
			if err != nil {
				t.Fatal(err)
			}
			injected := tc.inject(task, rc.Hash)
			if _, err := js.Publish(ctx, SubjectPrefix+task, injected); err != nil {
				t.Fatal(err)
			}
			own := func(what string, rc Receipt, err error, seq int) {
				t.Helper()
				if err != nil {
					t.Fatalf("%s after a record the Log cannot verify: %v", what, err)
				}
				if rc.Hash == Hash(injected) || rc.KeyID != k.CurrentID() || rc.RecordRef != fmt.Sprintf("%s/%d", task, seq) {
					t.Fatalf("%s: receipt %+v, want the Log's own record %s/%d", what, rc, task, seq)
				}
			}
			rc, err = l.Append(ctx, task, claim)
			own("claim", rc, err, 2)
			rc, err = l.Seal(ctx, task, end)
			own("seal", rc, err, 4)
			// The injected record stays for the verifier to report.
			lines, err := l.Chain(ctx, task)
			if err != nil {
				t.Fatal(err)
			}
			if rep := Verify(lines, k.PublicKeys(), VerifyOptions{}); rep.OK || rep.Tasks[0].Failures[0].Rule != RuleRecordIntegrity {
				t.Fatalf("chain with the injected record: %+v", rep)
			}
		})
	}

	// A key another process made current after this Log opened its keyring
	// (the same directory) is read when a record names it: its records
	// count, and a step it wrote is not written again.
	k2, err := OpenKeyring(k.dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k2.Rotate(); err != nil {
		t.Fatal(err)
	}
	l2, err := Open(ctx, js, Options{Keys: k2})
	if err != nil {
		t.Fatal(err)
	}
	rc2, err := l2.Append(ctx, "tsk_rotated", req)
	if err != nil {
		t.Fatal(err)
	}
	if rc, err := l.Append(ctx, "tsk_rotated", req); err != nil || rc != rc2 {
		t.Fatalf("step written with a key added to the directory, appended again: %v, %+v, want %+v", err, rc, rc2)
	}
}

// Two processes whose key directories update at different moments (two
// pods' copies of one Secret): a record signed with a key one of them does
// not hold yet counts once its directory has the key. Its earlier failure
// to verify is not remembered.
func TestLogCountsARecordOnceItsKeyArrives(t *testing.T) {
	js, _ := testnats.Start(t)
	ctx := context.Background()
	k1 := testKeys(t)
	dir2 := t.TempDir()
	copyDir := func(from, to string) {
		t.Helper()
		files, err := filepath.Glob(filepath.Join(from, "*"))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(to, filepath.Base(f)), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	copyDir(k1.dir, dir2)
	k2, err := OpenKeyring(dir2)
	if err != nil {
		t.Fatal(err)
	}
	l1, err := Open(ctx, js, Options{Keys: k1})
	if err != nil {
		t.Fatal(err)
	}
	l2, err := Open(ctx, js, Options{Keys: k2})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := k1.Rotate(); err != nil { // only the first directory has the new key
		t.Fatal(err)
	}
	req, _ := requestedStep(t, time.Now().UTC())
	rc1, err := l1.Append(ctx, "tsk_keyarrives", req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l2.Chain(ctx, "tsk_keyarrives"); err != nil {
		t.Fatal(err)
	}
	if _, err := l2.checkedChain(ctx, "tsk_keyarrives"); err != nil { // reads it without the key
		t.Fatal(err)
	}
	copyDir(k1.dir, dir2) // the second directory catches up
	if _, _, err := k2.Refresh(); err != nil {
		t.Fatal(err)
	}
	rc2, err := l2.Append(ctx, "tsk_keyarrives", req)
	if err != nil || rc2 != rc1 {
		t.Fatalf("the step, appended again once the key arrived: %v, %+v; want the first writer's %+v", err, rc2, rc1)
	}
}
