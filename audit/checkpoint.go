package audit

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// Checkpoints. A chain's records are linked and signed, so an export shows
// any record changed, inserted or reordered; but a chain's last records,
// or a whole chain, can be left out without a trace in the export alone
// (a task's chain is sealed by its outcome, so a task's is seen unless
// --allow-incomplete; an admin or token chain has no seal). A checkpoint
// is the head of every chain of an export that verified: its length and
// the hash of its last record. Kept outside Countersign's reach (WORM
// storage, another team), it anchors the chains: a later export verified
// against it must hold every chain it saw, at least as long, with the same
// record at its head, and since every record names the hash of the one
// before it, the same records before it too ([RuleCheckpoint]).

// RuleCheckpoint: every chain a checkpoint saw is in the export, at least
// as long as then, with the record the checkpoint saw at its head.
const RuleCheckpoint = "checkpoint"

// CheckpointVersion is the version of the checkpoint format this package
// writes and reads.
const CheckpointVersion = 1

// MaxCheckpointBytes bounds a checkpoint [ReadCheckpoint] reads: about a
// million chains.
const MaxCheckpointBytes = 256 << 20

// Checkpoint is the head of every chain of an export ([NewCheckpoint]).
type Checkpoint struct {
	Version   int         `json:"version"`
	CreatedAt time.Time   `json:"createdAt"`
	Chains    []ChainHead `json:"chains"`
}

// ChainHead is one chain's length and the hash ([Hash]) of its last
// record, the one with seq Records-1.
type ChainHead struct {
	Chain   string `json:"chain"`
	Records int    `json:"records"`
	Head    string `json:"head"`
}

// ErrExportFailed is returned by [NewCheckpoint] when the export does not
// verify: a checkpoint anchors only chains that do.
var ErrExportFailed = errors.New("audit: the export does not verify")

// NewCheckpoint verifies lines as [Verify] does with opts (without a
// checkpoint of its own) and returns the head of every chain, in the
// export's order, with the report. It fails with ErrExportFailed, and no
// checkpoint, when the report is not OK.
func NewCheckpoint(lines [][]byte, pubkeys []ed25519.PublicKey, opts VerifyOptions, now time.Time) (Checkpoint, Report, error) {
	opts.Checkpoints = nil
	rep := Verify(lines, pubkeys, opts)
	if !rep.OK {
		return Checkpoint{}, rep, ErrExportFailed
	}
	cp := Checkpoint{Version: CheckpointVersion, CreatedAt: now.UTC()}
	at := map[string]int{}
	for _, line := range lines {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var r struct {
			TaskID string `json:"taskId"`
			Seq    int    `json:"seq"`
		}
		if err := json.Unmarshal(line, &r); err != nil {
			return Checkpoint{}, rep, fmt.Errorf("audit: checkpoint: %w", err) // Verify read it: not reached
		}
		i, ok := at[r.TaskID]
		if !ok {
			i = len(cp.Chains)
			at[r.TaskID] = i
			cp.Chains = append(cp.Chains, ChainHead{Chain: r.TaskID})
		}
		if r.Seq+1 > cp.Chains[i].Records {
			cp.Chains[i].Records, cp.Chains[i].Head = r.Seq+1, Hash(line)
		}
	}
	return cp, rep, nil
}

// ReadCheckpoint reads a checkpoint written by [NewCheckpoint] (as JSON),
// refusing unknown fields, another version, a malformed or repeated chain,
// and more than MaxCheckpointBytes.
func ReadCheckpoint(r io.Reader) (*Checkpoint, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxCheckpointBytes+1))
	if err != nil {
		return nil, fmt.Errorf("audit: read checkpoint: %w", err)
	}
	if len(b) > MaxCheckpointBytes {
		return nil, fmt.Errorf("audit: checkpoint: larger than %d bytes", MaxCheckpointBytes)
	}
	var cp Checkpoint
	if err := strictUnmarshal(b, &cp); err != nil {
		return nil, fmt.Errorf("audit: checkpoint: %w", err)
	}
	if cp.Version != CheckpointVersion {
		return nil, fmt.Errorf("audit: checkpoint: version %d, this verifier reads %d", cp.Version, CheckpointVersion)
	}
	if cp.CreatedAt.IsZero() {
		return nil, errors.New("audit: checkpoint: no createdAt")
	}
	cp.CreatedAt = cp.CreatedAt.UTC()
	seen := make(map[string]bool, len(cp.Chains))
	for i, h := range cp.Chains {
		switch raw, err := hex.DecodeString(h.Head); {
		case !ValidTaskID(h.Chain):
			return nil, fmt.Errorf("audit: checkpoint: chain %d: malformed chain id %.40q", i, h.Chain)
		case seen[h.Chain]:
			return nil, fmt.Errorf("audit: checkpoint: chain %s is listed twice", h.Chain)
		case h.Records < 1 || h.Records > MaxChainLen:
			return nil, fmt.Errorf("audit: checkpoint: chain %s: %d records, want 1 to %d", h.Chain, h.Records, MaxChainLen)
		case err != nil || len(raw) != 32 || h.Head != hex.EncodeToString(raw):
			return nil, fmt.Errorf("audit: checkpoint: chain %s: head is not a lowercase hex SHA-256", h.Chain)
		}
		seen[h.Chain] = true
	}
	return &cp, nil
}

// checkpointFailures returns what chain (its records and their hashes, in
// export order; nil when the export lacks it) breaks of RuleCheckpoint
// against head, seen by the checkpoint made at.
func checkpointFailures(head ChainHead, at time.Time, recs []Record, hashes []string) []Failure {
	when := at.UTC().Format(time.RFC3339)
	for i, r := range recs {
		if r.Seq != head.Records-1 {
			continue
		}
		if hashes[i] != head.Head {
			return []Failure{{Rule: RuleCheckpoint, Record: i, Kind: r.Kind,
				Message: fmt.Sprintf("record %d is not the one the checkpoint of %s saw at the chain's head: the chain was rewritten", r.Seq, when)}}
		}
		return nil
	}
	return []Failure{{Rule: RuleCheckpoint, Record: -1,
		Message: fmt.Sprintf("the chain has %d records, the checkpoint of %s saw %d: records were removed", len(recs), when, head.Records)}}
}
