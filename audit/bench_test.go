package audit

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// BenchmarkVerifyChain: one executed task's chain (9 records, 2 WebAuthn
// assertions) verified offline.
func BenchmarkVerifyChain(b *testing.B) {
	k := testKeys(b)
	c := executedChain(b, k, "tsk_bench")
	keys := k.PublicKeys()
	b.ResetTimer()
	for b.Loop() {
		if !Verify(c.lines, keys, VerifyOptions{}).OK {
			b.Fatal("does not verify")
		}
	}
	b.ReportMetric(float64(len(c.lines)), "records/op")
}

// BenchmarkAppend: one step appended to a task's chain in JetStream (read
// the chain, sign, publish with dedup and expected-sequence headers), on
// chains of 1–10 records.
func BenchmarkAppend(b *testing.B) {
	l, _ := openLogB(b)
	ctx := context.Background()
	i := 0
	for b.Loop() {
		task := fmt.Sprintf("tsk_b%d", i/10)
		var err error
		if i%10 == 0 {
			req, _ := requestedStep(b, time.Now())
			_, err = l.Append(ctx, task, req)
		} else {
			_, err = l.Append(ctx, task, Step{ID: fmt.Sprint(i), Kind: KindNotified, At: time.Now(), Body: struct{}{}})
		}
		if err != nil {
			b.Fatal(err)
		}
		i++
	}
}
