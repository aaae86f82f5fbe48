package audit

import (
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// A keyring picks up a rotation made by another process sharing its
// directory: the new key signs from then on, the old keys stay, and a
// directory that is broken or half-written changes nothing.
func TestKeyringRefreshFollowsRotation(t *testing.T) {
	dir := t.TempDir()
	k, err := OpenKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	first := k.CurrentID()
	if id, changed, err := k.Refresh(); err != nil || changed || id != first {
		t.Fatalf("refresh with nothing new = %s, %v, %v", id, changed, err)
	}

	other, err := OpenKeyring(dir) // another process, or `countersign audit rotate-key`
	if err != nil {
		t.Fatal(err)
	}
	second, err := other.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	if k.CurrentID() != first {
		t.Fatal("the keyring switched keys before it was refreshed")
	}
	if id, changed, err := k.Refresh(); err != nil || !changed || id != second {
		t.Fatalf("refresh after a rotation = %s, %v, %v; want %s, changed", id, changed, err, second)
	}
	keyID := k.CurrentID()
	sig := k.signWith(keyID, []byte("msg"))
	pubs := k.publicKeys()
	if keyID != second || !ed25519.Verify(pubs[second], []byte("msg"), sig) {
		t.Fatalf("signed with %s after the refresh, want %s", keyID, second)
	}
	if _, ok := pubs[first]; !ok {
		t.Fatal("the old key's public half is gone after the refresh")
	}

	// A current file naming a key that is not (yet) in the directory: a
	// copy half made. The keyring keeps signing with its key.
	if err := os.WriteFile(filepath.Join(dir, currentFile), []byte("ed25519-00000000000000000000000000000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if id, changed, err := k.Refresh(); err == nil || changed || id != second || !strings.Contains(err.Error(), "is not in") {
		t.Fatalf("refresh with a dangling current file = %s, %v, %v", id, changed, err)
	}
	// No current file at all.
	if err := os.Remove(filepath.Join(dir, currentFile)); err != nil {
		t.Fatal(err)
	}
	if id, changed, err := k.Refresh(); err == nil || changed || id != second {
		t.Fatalf("refresh without a current file = %s, %v, %v", id, changed, err)
	}
	// A file that does not parse.
	if err := os.WriteFile(filepath.Join(dir, currentFile), []byte(first+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "junk.pem"), []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if id, changed, err := k.Refresh(); err == nil || changed || id != second {
		t.Fatalf("refresh with a broken key file = %s, %v, %v", id, changed, err)
	}
	if keyID := k.CurrentID(); keyID != second {
		t.Fatalf("signed with %s after failed refreshes, want %s", keyID, second)
	}
	// Fixed, the current file is followed back to the first key.
	if err := os.Remove(filepath.Join(dir, "junk.pem")); err != nil {
		t.Fatal(err)
	}
	if id, changed, err := k.Refresh(); err != nil || !changed || id != first {
		t.Fatalf("refresh back to the first key = %s, %v, %v", id, changed, err)
	}
}

// Records sealed while the key rotates again and again (another process
// rotating, this one refreshing) each name the key that signed them.
func TestSealDuringRotations(t *testing.T) {
	dir := t.TempDir()
	k, err := OpenKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	other, err := OpenKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := other.Rotate(); err != nil {
				t.Error(err)
				return
			}
			if _, _, err := k.Refresh(); err != nil {
				t.Error(err)
				return
			}
		}
	})
	used := map[string]bool{}
	for i := range 300 {
		line, r, err := seal(Record{TaskID: "tsk_rotating", Seq: i, Kind: KindRequested, StepID: fmt.Sprint("s", i),
			At: time.Unix(1_700_000_000, 0).UTC(), Body: json.RawMessage(`{}`)}, k)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := ParseRecord(line, k.publicKeys()); err != nil {
			t.Fatalf("record %d (key %s): %v", i, r.KeyID, err)
		}
		used[r.KeyID] = true
	}
	close(stop)
	wg.Wait()
	if len(used) < 2 {
		t.Fatalf("300 records used %d keys: the rotations did not interleave", len(used))
	}
}

// TestKeyringCreated: OpenKeyring says when it made the signing key, the
// directory holding none, and not when it found one.
func TestKeyringCreated(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	k, err := OpenKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !k.Created() {
		t.Fatal("a new directory's keyring does not say it made its key")
	}
	again, err := OpenKeyring(dir)
	if err != nil {
		t.Fatal(err)
	}
	if again.Created() || again.CurrentID() != k.CurrentID() {
		t.Fatalf("reopened: created %v, key %s, want the existing %s", again.Created(), again.CurrentID(), k.CurrentID())
	}
	if _, err := again.Rotate(); err != nil {
		t.Fatal(err)
	}
	if again.Created() {
		t.Fatal("a rotation counts as the directory having had no key")
	}
}
