package app

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestBadPolicyStartsNothing: a policy that does not load stops dev before
// NATS or Temporal start, so the data dir holds nothing of them, and the
// error names the directory.
func TestBadPolicyStartsNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	missing := filepath.Join(t.TempDir(), "no-policy")
	_, err := New(context.Background(), Config{DataDir: dir, Addr: freeAddr(t), PolicyDir: missing}, ModeDev, nil, io.Discard)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("New with a missing policy dir: %v, want an error naming %s", err, missing)
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the data dir holds %v after the policy failed to load; want nothing", names)
	}
}
