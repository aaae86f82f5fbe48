package activities

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.temporal.io/sdk/temporal"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/tasks"
)

// ErrTypeAudit: an audit record cannot be written from this input (it will
// not get better with retries).
const ErrTypeAudit = "audit_invalid"

// Assertion is an accepted decision's evidence, for the audit record: the
// credential's COSE public key and the raw WebAuthn assertion.
type Assertion struct {
	CredentialID      string `json:"credentialId"`
	PublicKey         []byte `json:"publicKey"`
	ChallengeID       string `json:"challengeId"`
	AuthenticatorData []byte `json:"authenticatorData"`
	ClientDataJSON    []byte `json:"clientDataJson"`
	Signature         []byte `json:"signature"`
	SignCount         uint32 `json:"signCount"`
}

// AuditDecision is one decision to record.
type AuditDecision struct {
	Decision     string     `json:"decision"`
	Accepted     bool       `json:"accepted"`
	Reason       string     `json:"reason,omitempty"`
	ChallengeID  string     `json:"challengeId,omitempty"`
	Comment      string     `json:"comment,omitempty"`
	ApproverID   string     `json:"approverId,omitempty"`
	ApproverName string     `json:"approverName,omitempty"`
	Assertion    *Assertion `json:"assertion,omitempty"`
	// Via is set for a deny that another channel authenticated without a
	// passkey (tasks.UnsignedDenial).
	Via string `json:"via,omitempty"`
}

// AuditKind is the kind of a step the workflow records through RecordAudit:
// the audit package's record kinds, typed for the workflow, which does not
// import audit (it does I/O). The terminal kinds are the timeline's
// (tasks.EventKind) and reach the chain through Complete.
type AuditKind string

// The kinds RecordAudit records.
const (
	StepRequested     AuditKind = audit.KindRequested
	StepNotified      AuditKind = audit.KindNotified
	StepNotifyFailed  AuditKind = audit.KindNotifyFail
	StepDecision      AuditKind = audit.KindDecision
	StepReevaluated   AuditKind = audit.KindReevaluated
	StepClaimed       AuditKind = audit.KindClaimed
	StepCancelRefused AuditKind = audit.KindCancelRefused
)

// RecordAuditInput appends one step to the task's audit chain. Exactly one
// of the payloads fits Kind: Input for requested, Decision for decision,
// Policy for reevaluated and claimed; notified and notify-failed carry none.
type RecordAuditInput struct {
	Version  int                  `json:"version"`
	TaskID   string               `json:"taskId"`
	StepID   string               `json:"stepId"`
	Kind     AuditKind            `json:"kind"`
	At       time.Time            `json:"at"`
	Input    *tasks.ApprovalInput `json:"input,omitempty"`
	Decision *AuditDecision       `json:"decision,omitempty"`
	Policy   *ReevaluateOutput    `json:"policy,omitempty"`
}

// RecordAudit appends one step to the task's audit chain. It is idempotent
// per StepID: a retry returns without writing again. With no audit log
// configured it does nothing; on a sealed chain it writes nothing.
func (a *Activities) RecordAudit(ctx context.Context, in RecordAuditInput) error {
	if err := checkVersion(in.Version); err != nil {
		return err
	}
	if a.Audit == nil {
		return nil
	}
	body, err := a.auditBody(in)
	if err != nil {
		return temporal.NewNonRetryableApplicationError("activities: audit "+string(in.Kind)+": "+err.Error(), ErrTypeAudit, err)
	}
	_, err = a.Audit.Append(ctx, in.TaskID, audit.Step{ID: in.StepID, Kind: string(in.Kind), At: in.At, Body: body})
	switch {
	case err == nil:
		return nil
	case errors.Is(err, audit.ErrSealed):
		a.log().Warn("activities: audit chain already sealed; step not recorded", "task_id", in.TaskID, "kind", in.Kind)
		return nil
	case errors.Is(err, audit.ErrInvalidTaskID), errors.Is(err, audit.ErrReadOnly), errors.Is(err, audit.ErrBrokenChain):
		return temporal.NewNonRetryableApplicationError("activities: audit: "+err.Error(), ErrTypeAudit, err)
	}
	return fmt.Errorf("activities: audit %s %s: %w", in.Kind, in.TaskID, err)
}

func (a *Activities) auditBody(in RecordAuditInput) (any, error) {
	switch in.Kind {
	case audit.KindRequested:
		if in.Input == nil {
			return nil, errors.New("no approval input")
		}
		env := in.Input.Envelope
		e, err := audit.NewEnvelope(env.Tool, env.Arguments, env.ActionHash, env.Principal, env.Resource, env.ServerID, env.CreatedAt, a.Audit.Redact())
		if err != nil {
			return nil, err
		}
		r := in.Input.Requirement
		return audit.Requested{
			Envelope:      e,
			PolicyVersion: env.PolicyVersion,
			Requirement: audit.Requirement{Group: r.Group, Quorum: r.Quorum, TTLSeconds: int64(r.TTL / time.Second),
				AuthenticatorClass: r.AuthenticatorClass, Reason: r.Reason},
			ApprovalRef: in.Input.ApprovalRef,
			DisplayText: in.Input.DisplayText,
			ExpiresAt:   in.Input.ExpiresAt.UTC(),
		}, nil
	case audit.KindDecision:
		d := in.Decision
		if d == nil {
			return nil, errors.New("no decision")
		}
		out := audit.Decision{Decision: d.Decision, Accepted: d.Accepted, Reason: d.Reason, ChallengeID: d.ChallengeID}
		if d.Accepted && d.Via != "" {
			out.Unsigned = &audit.Unsigned{ApproverID: d.ApproverID, ApproverName: d.ApproverName, Via: d.Via, Comment: d.Comment}
			return out, nil
		}
		if d.Accepted {
			if d.Assertion == nil {
				return nil, errors.New("accepted decision without its assertion")
			}
			as := d.Assertion
			var cd struct {
				Challenge string `json:"challenge"`
			}
			if err := json.Unmarshal(as.ClientDataJSON, &cd); err != nil {
				return nil, fmt.Errorf("clientDataJSON: %w", err)
			}
			if _, err := base64.RawURLEncoding.DecodeString(cd.Challenge); err != nil {
				return nil, errors.New("clientDataJSON challenge is not base64url")
			}
			out.Approval = &audit.Approval{
				Decision: d.Decision, ApproverID: d.ApproverID, ApproverName: d.ApproverName,
				CredentialID: as.CredentialID, PublicKey: as.PublicKey, ChallengeID: as.ChallengeID,
				Challenge: cd.Challenge, AuthenticatorData: as.AuthenticatorData, ClientDataJSON: as.ClientDataJSON,
				Signature: as.Signature, SignCount: as.SignCount, Comment: d.Comment, At: in.At.UTC(),
			}
		}
		return out, nil
	case audit.KindReevaluated, audit.KindClaimed:
		if in.Policy == nil {
			return nil, errors.New("no policy decision")
		}
		p := in.Policy
		return audit.Policy{Allow: p.Allow, Effect: p.Effect, Reason: p.Reason, PolicyVersion: p.PolicyVersion}, nil
	case audit.KindNotified, audit.KindNotifyFail, audit.KindCancelRefused:
		return struct{}{}, nil
	}
	return nil, fmt.Errorf("kind %q is not recorded through RecordAudit", in.Kind)
}

// sealAudit writes the terminal and outcome records of a task that ends
// and returns the receipt for its _meta; nil when the task is not audited.
// A chain that cannot be sealed (a step missing) is logged and the task
// completes without a receipt: the audit never blocks the task's end. An
// unreachable stream is an error, retried like the read-model write.
func (a *Activities) sealAudit(ctx context.Context, in CompleteInput) (*audit.Receipt, error) {
	if !in.Audit || a.Audit == nil {
		return nil, nil
	}
	end := audit.End{Kind: string(in.Event.Kind), At: in.Event.At, Status: string(in.Status),
		Disposition: string(in.Disposition), Detail: in.Detail}
	if in.ToolResult != nil {
		d, err := audit.Digest(in.ToolResult)
		if err != nil {
			d, _ = audit.Digest(map[string]any{"unencodable": true})
		}
		end.ResultDigest = d
	}
	rc, err := a.Audit.Seal(ctx, in.TaskID, end)
	if errors.Is(err, audit.ErrBrokenChain) || errors.Is(err, audit.ErrInvalidTaskID) || errors.Is(err, audit.ErrReadOnly) {
		a.log().Error("activities: audit chain not sealed; completing without a receipt", "task_id", in.TaskID, "error", err)
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("activities: audit seal %s: %w", in.TaskID, err)
	}
	return &rc, nil
}
