package audit

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// export joins chains' lines in order.
func export(chains ...*memChain) [][]byte {
	var lines [][]byte
	for _, c := range chains {
		lines = append(lines, c.lines...)
	}
	return lines
}

// TestCheckpoint: a checkpoint of an export holds every chain's length and
// head; a later export of the same log verifies against it when its chains
// only grew, and fails RuleCheckpoint when a chain lost records at its end,
// was rewritten (re-sealed with the audit key) or is missing.
func TestCheckpoint(t *testing.T) {
	k := testKeys(t)
	keys := k.PublicKeys()
	done := executedChain(t, k, "tsk_done")
	open := approvedChain(t, k, "tsk_open", 1, "alice")
	now := time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC)
	incomplete := VerifyOptions{AllowIncomplete: true}

	cp, rep, err := NewCheckpoint(export(done, open), keys, incomplete, now)
	if err != nil {
		t.Fatalf("checkpoint: %v (%+v)", err, rep)
	}
	want := []ChainHead{
		{Chain: "tsk_done", Records: len(done.lines), Head: Hash(done.lines[len(done.lines)-1])},
		{Chain: "tsk_open", Records: len(open.lines), Head: Hash(open.lines[len(open.lines)-1])},
	}
	if cp.Version != CheckpointVersion || !cp.CreatedAt.Equal(now) || !reflect.DeepEqual(cp.Chains, want) {
		t.Fatalf("checkpoint %+v, want chains %+v", cp, want)
	}
	// Written and read back, as the CLI does.
	b, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	read, err := ReadCheckpoint(bytes.NewReader(b))
	if err != nil || !reflect.DeepEqual(*read, cp) {
		t.Fatalf("read back %+v, %v", read, err)
	}
	with := func(opts VerifyOptions) VerifyOptions {
		opts.Checkpoints = []*Checkpoint{read}
		return opts
	}

	// The open task goes on and ends: the chain grew.
	grown := *open
	grown.lines = slices.Clone(open.lines)
	grown.claim()
	grown.seal(KindExecuted, "completed", "approved-executed")
	if rep := Verify(export(done, &grown), keys, with(VerifyOptions{})); !rep.OK {
		t.Fatalf("grown chains against the checkpoint: %+v", rep)
	}

	failsCheckpoint := func(name string, lines [][]byte, opts VerifyOptions, want string) {
		t.Helper()
		rep := Verify(lines, keys, opts)
		b, _ := json.Marshal(rep)
		if rep.OK || !strings.Contains(string(b), "["+RuleCheckpoint+"]") || !strings.Contains(string(b), want) {
			t.Errorf("%s: %s", name, b)
		}
		if !Verify(lines, keys, VerifyOptions{AllowIncomplete: true}).OK {
			t.Errorf("%s: fails without the checkpoint too; the test shows nothing", name)
		}
	}
	// The open chain's last record is left out: alone it is a pending task.
	failsCheckpoint("tail dropped", export(done, &memChain{lines: open.lines[:len(open.lines)-1]}), with(incomplete),
		"the chain has 2 records, the checkpoint of 2026-11-28T02:00:00Z saw 3: records were removed")
	// A whole chain left out.
	failsCheckpoint("chain dropped", export(&grown), with(incomplete),
		"chain tsk_done, 9 records at the checkpoint of 2026-11-28T02:00:00Z, is missing from the export")
	// Rewritten with the audit key: a deny in place of the approval.
	forged := newMemChain(t, k, "tsk_open", 1)
	forged.add("notify", KindNotified, struct{}{})
	forged.decide(newPasskey(t, "cred-alice"), "alice", "deny")
	failsCheckpoint("chain rewritten", export(done, forged), with(incomplete),
		"record 2 is not the one the checkpoint of 2026-11-28T02:00:00Z saw at the chain's head: the chain was rewritten")

	// A checkpoint anchors only an export that verifies.
	tampered := export(done, open)
	tampered[1] = bytes.Replace(tampered[1], []byte(`"notified"`), []byte(`"notify-failed"`), 1)
	if _, rep, err := NewCheckpoint(tampered, keys, incomplete, now); !errors.Is(err, ErrExportFailed) || rep.OK {
		t.Fatalf("checkpoint of a tampered export: %v", err)
	}
	if _, _, err := NewCheckpoint(export(done, open), keys, VerifyOptions{}, now); !errors.Is(err, ErrExportFailed) {
		t.Fatalf("checkpoint of a pending chain without AllowIncomplete: %v", err)
	}
}

func TestReadCheckpointRefusesMalformed(t *testing.T) {
	head := strings.Repeat("ab", 32)
	ok := `{"version":1,"createdAt":"2026-11-28T02:00:00Z","chains":[{"chain":"tsk_a","records":3,"head":"` + head + `"}]}`
	if _, err := ReadCheckpoint(strings.NewReader(ok)); err != nil {
		t.Fatalf("a good checkpoint: %v", err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"not JSON", `{`, "checkpoint"},
		{"unknown field", strings.Replace(ok, `"version"`, `"extra":1,"version"`, 1), "unknown field"},
		{"trailing data", ok + `{}`, "trailing data"},
		{"other version", strings.Replace(ok, `"version":1`, `"version":2`, 1), "version 2"},
		{"no time", strings.Replace(ok, `"createdAt":"2026-11-28T02:00:00Z",`, ``, 1), "no createdAt"},
		{"bad chain id", strings.Replace(ok, `tsk_a`, `TSK A`, 1), "malformed chain id"},
		{"twice", strings.Replace(ok, `}]}`, `},{"chain":"tsk_a","records":3,"head":"`+head+`"}]}`, 1), "listed twice"},
		{"no records", strings.Replace(ok, `"records":3`, `"records":0`, 1), "0 records"},
		{"too many records", strings.Replace(ok, `"records":3`, `"records":1001`, 1), "1001 records"},
		{"short head", strings.Replace(ok, head, head[:62], 1), "head is not"},
		{"upper-case head", strings.Replace(ok, head, strings.ToUpper(head), 1), "head is not"},
	} {
		if _, err := ReadCheckpoint(strings.NewReader(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// FuzzReadCheckpoint: whatever a checkpoint file holds, ReadCheckpoint
// refuses it or returns one that writes back to itself, and Verify
// against it never panics and never passes an export missing a chain it
// names.
func FuzzReadCheckpoint(f *testing.F) {
	k := testKeys(f)
	c := executedChain(f, k, "tsk_fuzz")
	keys := k.PublicKeys()
	cp, _, err := NewCheckpoint(c.lines, keys, VerifyOptions{}, time.Date(2026, 11, 28, 2, 0, 0, 0, time.UTC))
	if err != nil {
		f.Fatal(err)
	}
	seed, _ := json.Marshal(cp)
	f.Add(seed)
	f.Add([]byte(`{"version":1,"createdAt":"2026-11-28T03:00:00+01:00","chains":[]}`))
	f.Add([]byte(`{"version":1,"createdAt":"2026-11-28T02:00:00Z","chains":[{"chain":"tsk_other","records":1,"head":"` + strings.Repeat("0", 64) + `"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := ReadCheckpoint(bytes.NewReader(b))
		if err != nil {
			return
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		if back, err := ReadCheckpoint(bytes.NewReader(again)); err != nil || !reflect.DeepEqual(back, got) {
			t.Fatalf("written back: %v", err)
		}
		rep := Verify(c.lines, keys, VerifyOptions{Checkpoints: []*Checkpoint{got}})
		for _, h := range got.Chains {
			if h.Chain != "tsk_fuzz" && rep.OK {
				t.Fatalf("the export lacks chain %s the checkpoint names, and verifies", h.Chain)
			}
		}
	})
}
