package audit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/countersign/countersign/internal/proccpu"
	"github.com/countersign/countersign/internal/testnats"
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

// BenchmarkAppend: one step appended to a task's chain in JetStream (sign,
// publish with dedup and expected-sequence headers after the chain's
// remembered tail), on chains of 1–10 records, connected in process as
// `countersign dev` is. cpu-µs/op is the whole process's (NATS server
// included).
func BenchmarkAppend(b *testing.B) {
	js, _ := testnats.StartInProcess(b)
	l, err := Open(context.Background(), js, Options{Keys: testKeys(b)})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	i := 0
	start := proccpu.Used()
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
	b.ReportMetric(proccpu.PerOp(start, i), "cpu-µs/op")
}
