package app

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/testnats"
)

// TestAuditKeyRotationWithoutRestart: `countersign audit rotate-key` on a
// running dev's key directory takes effect within the poll: the next
// record is signed with the new key, and audit-key.pub holds both keys.
// A key added without a switch is published and not used; a broken
// directory afterwards changes nothing.
func TestAuditKeyRotationWithoutRestart(t *testing.T) {
	defer func(d time.Duration) { auditKeyPoll = d }(auditKeyPoll)
	auditKeyPoll = 50 * time.Millisecond
	dir := t.TempDir()
	ctx := context.Background()
	logs := &syncBuffer{}
	a, err := New(ctx, Config{DataDir: dir, Addr: freeAddr(t), SQLiteSync: "NORMAL"}, ModeDev, slog.New(slog.NewTextHandler(logs, nil)), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown(ctx)
	record := func(n uint64) audit.Receipt {
		t.Helper()
		_, rc, err := a.Audit.RecordAdmin(ctx, audit.AdminAction{Action: audit.AdminDisable, Status: "disabled",
			Target: audit.AdminTarget{Type: audit.TargetAgent, ID: "rotation-test"}, By: "admin:test"}, n)
		if err != nil {
			t.Fatal(err)
		}
		return rc
	}
	first := record(1).KeyID

	rotator, err := audit.OpenKeyring(filepath.Join(dir, AuditKeyDir))
	if err != nil {
		t.Fatal(err)
	}
	second, err := rotator.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for a.auditKeys.CurrentID() != second {
		if time.Now().After(deadline) {
			t.Fatalf("still signing with %s 5 s after the rotation to %s", a.auditKeys.CurrentID(), second)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := record(2).KeyID; got != second || got == first {
		t.Fatalf("record after the rotation signed with %s, want %s (was %s)", got, second, first)
	}
	pubKeys := func() int {
		b, err := os.ReadFile(filepath.Join(dir, AuditPubKeyFile))
		if err != nil {
			return 0
		}
		keys, err := audit.ParsePublicKeys(b)
		if err != nil {
			return 0
		}
		return len(keys)
	}
	for pubKeys() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d keys after the rotation, want both", AuditPubKeyFile, pubKeys())
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A key added ahead of its switch (the first step of the README's
	// two-step rotation): published at once, not used yet.
	edir := t.TempDir()
	elsewhere, err := audit.OpenKeyring(edir)
	if err != nil {
		t.Fatal(err)
	}
	third, err := elsewhere.Rotate()
	if err != nil {
		t.Fatal(err)
	}
	pemFile := third + ".pem"
	b, err := os.ReadFile(filepath.Join(edir, pemFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, AuditKeyDir, pemFile), b, 0o600); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for pubKeys() != 3 {
		if time.Now().After(deadline) {
			t.Fatalf("%s holds %d keys 5 s after a key was added, want 3", AuditPubKeyFile, pubKeys())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := record(3).KeyID; got != second {
		t.Fatalf("record after a key was added (not made current) signed with %s, want %s", got, second)
	}

	// A current file naming a key the directory lacks: signing goes on
	// with the key in use, and the process says why.
	if err := os.WriteFile(filepath.Join(dir, AuditKeyDir, "current"), []byte("ed25519-00000000000000000000000000000000\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for !strings.Contains(logs.String(), "cannot read the key directory again") {
		if time.Now().After(deadline) {
			t.Fatalf("no warning 5 s after the key directory broke; log:\n%s", logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := record(4).KeyID; got != second {
		t.Fatalf("record with a broken key directory signed with %s, want %s", got, second)
	}
}

// syncBuffer is a bytes.Buffer safe for a logger and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestAuditKeyCreatedWarns: a worker or server whose key directory holds no
// key makes one and warns that every process must share the directory; one
// that finds the deployment's key says which key it signs with, quietly.
func TestAuditKeyCreatedWarns(t *testing.T) {
	js, _ := testnats.Start(t)
	dir := t.TempDir()
	start := func(mode Mode) string {
		t.Helper()
		logs := &syncBuffer{}
		a := &App{cfg: Config{DataDir: dir}, mode: mode, log: slog.New(slog.NewTextHandler(logs, nil))}
		if err := a.startAudit(context.Background(), js); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	first := start(ModeWorker)
	if !strings.Contains(first, "level=WARN") || !strings.Contains(first, "give every one the same --audit-key-dir") ||
		!strings.Contains(first, filepath.Join(dir, AuditKeyDir)) {
		t.Fatalf("a worker that made its key: %s", first)
	}
	for _, mode := range []Mode{ModeWorker, ModeServer} {
		if again := start(mode); strings.Contains(again, "level=WARN") || !strings.Contains(again, "audit: signing key") {
			t.Fatalf("a process that found the key: %s", again)
		}
	}
}
