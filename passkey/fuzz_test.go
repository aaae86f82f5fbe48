package passkey_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/passkey"
)

// FuzzVerifyResponse feeds arbitrary bytes as the assertion for a live
// challenge. Verify must never panic, never succeed (no input is a valid
// signature over this challenge), and always answer with a reason rather
// than an infrastructure error.
func FuzzVerifyResponse(f *testing.F) {
	w := newWorldTB(f)
	c := w.issue(f, "fuzz-task", "finance", passkey.ClassPlatform)
	other := w.issue(f, "fuzz-task", "finance", passkey.ClassPlatform)

	// Seeds: real assertions for another challenge (so mutations reach the
	// signature check with an enrolled credential), and broken shapes.
	f.Add([]byte(w.alice.sign(f, w.rp, other.Ch)))
	f.Add([]byte(w.dave.sign(f, w.rp, other.Ch)))
	evil := w.rp
	evil.Origin = "https://evil.example"
	f.Add([]byte(w.alice.sign(f, evil, c.Ch)))
	k := *w.alice
	k.Auth.Options.UserNotVerified = true
	f.Add([]byte(k.sign(f, w.rp, c.Ch)))
	for _, s := range []string{
		``, `null`, `{}`, `[]`, `{"id":""}`, `"x"`, `{"id":"AAAA","rawId":"AAAA","type":"public-key"}`,
		`{"id":"AAAA","rawId":"AAAA","type":"public-key","response":{"clientDataJSON":"e30","authenticatorData":"","signature":""}}`,
	} {
		f.Add([]byte(s))
	}

	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		req := c.verifyReq(json.RawMessage(data))
		req.AuthenticatorClass = passkey.ClassPlatform
		v, err := w.svc.Verify(ctx, req)
		if err == nil {
			t.Fatalf("arbitrary response verified: approver %s", v.ApproverID)
		}
		if passkey.ReasonOf(err) == "" {
			t.Fatalf("non-reason error for arbitrary input: %v", err)
		}
	})
}

func BenchmarkVerify(b *testing.B) {
	w := newWorldTB(b)
	ctx := context.Background()
	b.ReportAllocs()
	var cpu time.Duration // Verify's alone, not the setup's
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		c := w.issue(b, "bench", "finance", "")
		req := c.verifyReq(w.alice.sign(b, w.rp, c.Ch))
		b.StartTimer()
		start := proccpu.Used()
		if _, err := w.svc.Verify(ctx, req); err != nil {
			b.Fatal(err)
		}
		cpu += proccpu.Used() - start
	}
	b.ReportMetric(float64(cpu.Nanoseconds())/1e3/float64(b.N), "cpu-µs/op")
}

func BenchmarkIssueChallenge(b *testing.B) {
	w := newWorldTB(b)
	ctx := context.Background()
	req := passkey.ChallengeRequest{
		TaskID: "bench", Tool: "delete_resource", ActionHash: hashOf(b, "delete_resource", `{}`),
		Group: "finance", DisplayText: "Delete",
	}
	b.ReportAllocs()
	start, n := proccpu.Used(), 0
	for b.Loop() {
		if _, err := w.svc.IssueChallenge(ctx, req); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(proccpu.PerOp(start, n), "cpu-µs/op")
}

// BenchmarkRejectBadSignature measures the cost an attacker can impose with
// a well-formed but invalid assertion (it never consumes or writes).
func BenchmarkRejectBadSignature(b *testing.B) {
	w := newWorldTB(b)
	ctx := context.Background()
	c := w.issue(b, "bench", "finance", "")
	other := w.issue(b, "bench", "finance", "")
	req := c.verifyReq(w.alice.sign(b, w.rp, other.Ch))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := w.svc.Verify(ctx, req); passkey.ReasonOf(err) != passkey.ReasonSignatureVerificationFailed {
			b.Fatal(err)
		}
	}
}
