package passkey_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/countersign/countersign/passkey"
)

// Approvers answers from a watch-fed directory, but never staler than a
// scan: an approver added by another replica, changed or removed in the
// bucket is in the very next listing.
func TestApproversNeverStale(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	other, err := passkey.New(ctx, e.js, passkey.Options{RPID: testRPID, RPOrigins: []string{testOrigin}})
	if err != nil {
		t.Fatal(err)
	}
	if got, err := e.svc.Approvers(ctx); err != nil || len(got) != 0 {
		t.Fatalf("empty bucket: %v, %v", got, err)
	}
	kv, err := e.js.KeyValue(ctx, passkey.BucketApprovers)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i := range 20 {
		a, _, err := other.AddApprover(ctx, fmt.Sprintf("approver-%d", i), []string{"approvers"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, a.ID)
		got, err := e.svc.Approvers(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != i+1 {
			t.Fatalf("after %d added elsewhere, listed %d", i+1, len(got))
		}
	}
	// A change made to the bucket directly is seen at once.
	entry, err := kv.Get(ctx, ids[0])
	if err != nil {
		t.Fatal(err)
	}
	changed := []byte(fmt.Sprintf(`{"id":%q,"name":"renamed","groups":["admins"],"createdAt":"2026-07-01T12:00:00Z","credentialIds":[]}`, ids[0]))
	if _, err := kv.Update(ctx, ids[0], changed, entry.Revision()); err != nil {
		t.Fatal(err)
	}
	got, err := e.svc.Approvers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := indexOf(got, ids[0]); i < 0 || got[i].Name != "renamed" {
		t.Fatalf("the change is not listed: %+v", got)
	}
	// A removed approver is gone from the next listing.
	if err := kv.Delete(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, ids[2]); err != nil {
		t.Fatal(err)
	}
	got, err = e.svc.Approvers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 18 || indexOf(got, ids[1]) >= 0 || indexOf(got, ids[2]) >= 0 {
		t.Fatalf("removed approvers still listed: %d", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i-1].ID >= got[i].ID {
			t.Fatal("not ordered by id")
		}
	}
	// Something in the bucket that is not an approver fails the listing,
	// as the scan always did.
	if _, err := kv.Put(ctx, "garbage", []byte("{")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Approvers(ctx); err == nil {
		t.Fatal("an undecodable approver was listed without an error")
	}
}

func indexOf(as []passkey.Approver, id string) int {
	for i, a := range as {
		if a.ID == id {
			return i
		}
	}
	return -1
}
