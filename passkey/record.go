package passkey

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
)

// Who can approve changes in three ways here: an approver is added, an
// approver is issued an enrollment invite, a passkey is enrolled. Each is
// given to Options.Record before it takes effect (before the approver, the
// invite or the credential is stored), and an error from Record refuses
// the change, which then leaves nothing behind: so every approver and every
// passkey that can sign has its record, signed in the audit log (package
// audit's admin chains; internal/app wires Record to them). A process that
// dies between the record and the store leaves a record of a change that
// did not happen, never a change without its record.

// Event kinds, the same words as the audit log's admin actions.
const (
	EventAdd    = "create" // an approver added (By: the admin, or the agent of an in-band approver)
	EventInvite = "invite" // an enrollment invite issued to an approver
	EventEnroll = "enroll" // a passkey enrolled (By: "approver:<id>" or "agent:<principal>")
)

// Event is one change to who can approve, as given to Options.Record.
type Event struct {
	Kind       string
	ApproverID string
	// CredentialID is the enrolled passkey's id (base64url), for
	// EventEnroll.
	CredentialID string
	// By is who made the change: the actor of the context (WithActor) for
	// an approver added or an invite, "approver:<id>" for a passkey
	// enrolled with an invite, "agent:<principal>" for one enrolled
	// in-band and for the in-band approver its first enrollment adds.
	By string
	// Key tells one invite of an approver from another (a hash of the
	// invite); 0 for the other kinds, which happen once to their target.
	Key uint64
}

type actorKey struct{}

// WithActor names who acts in ctx ("admin:<name>"), for the records of
// AddApprover and NewInvite.
func WithActor(ctx context.Context, by string) context.Context {
	return context.WithValue(ctx, actorKey{}, by)
}

func actorOf(ctx context.Context) string {
	if by, _ := ctx.Value(actorKey{}).(string); by != "" {
		return by
	}
	return "unknown"
}

// record gives e to Options.Record, if set.
func (s *Service) record(ctx context.Context, e Event) error {
	if s.recordFn == nil {
		return nil
	}
	if err := s.recordFn(ctx, e); err != nil {
		return fmt.Errorf("passkey: record %s of approver %s: %w", e.Kind, e.ApproverID, err)
	}
	return nil
}

// inviteChangeKey is the Event.Key of the invite stored under key.
func inviteChangeKey(key string) uint64 {
	sum := sha256.Sum256([]byte(key))
	return binary.BigEndian.Uint64(sum[:8])
}
