// Package approvals is the one place that changes a task. Every door into
// the approval lifecycle is a thin adapter over [Service]: the MCP endpoint
// opens tasks and serves their owners (Open, Get, List, Await, Cancel,
// ProvideInput); the approver API and the NATS decision service show and
// decide approvals (View, Challenge, Decide); Slack denies without a passkey
// (DenyUnsigned); the admin API lists what waits (Pending). Each adapter maps
// its wire to these methods and their errors back to its wire, and declares
// the few methods it uses as its own interface.
//
// The service keeps no state of its own. A task's truth is its workflow,
// reached through an [Engine] (Temporal in production, an in-memory engine in
// adapter tests: package approvalstest); the read model is the task store
// (NATS KV), written at creation here and afterwards only by the workflow's
// outbox.
package approvals

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/internal/telemetry"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// Engine runs the approval workflows: *tasks.Orchestrator over Temporal.
// Every method but Start and Running answers *tasks.UpdateRejected when the
// workflow refuses the request without recording it, tasks.ErrWorkflowGone
// when the workflow no longer runs, and an error wrapping
// tasks.ErrUpdateInProgress when the answer did not arrive in time.
type Engine interface {
	Start(ctx context.Context, in tasks.ApprovalInput) error
	Running(ctx context.Context, taskID string) (bool, error)
	Decide(ctx context.Context, taskID string, d tasks.DecisionUpdate) (tasks.DecisionResult, error)
	RecordRejection(ctx context.Context, taskID string, r tasks.RejectedDecision) error
	DenyUnsigned(ctx context.Context, taskID string, d tasks.UnsignedDenial) (tasks.DecisionResult, error)
	Cancel(ctx context.Context, taskID string) (tasks.CancelResult, error)
	ProvideInput(ctx context.Context, taskID string, in tasks.InputUpdate) (tasks.InputResult, error)
}

// Passkeys issues and checks approval evidence: *passkey.Service.
type Passkeys interface {
	IssueChallenge(ctx context.Context, req passkey.ChallengeRequest) (passkey.Challenge, error)
	Verify(ctx context.Context, req passkey.VerifyRequest) (passkey.Verified, error)
	Approver(ctx context.Context, id string) (passkey.Approver, error)
}

// AuditChains reads a task's audit chain: *audit.Log.
type AuditChains interface {
	Chain(ctx context.Context, taskID string) ([][]byte, error)
}

// Defaults of [Options].
const (
	DefaultRatePerMinute          = 30
	DefaultBurst                  = 10
	DefaultMaxPendingPerPrincipal = 100
	DefaultPollInterval           = 2 * time.Second
	DefaultResultRetention        = tasks.DefaultResultRetention
)

// Challenge issuing limit per approval. An approval link goes to a whole
// channel: the burst lets a team of approvers open it at once (and retry on
// a flaky phone), then one challenge every two seconds.
const (
	challengesPerMinute = 30
	challengeBurst      = 30
)

// Options configures a [Service]. Store and Engine are required; Passkeys is
// required for the approver side (View needs none). Zero limits take the
// defaults above.
type Options struct {
	Store    *tasks.Store
	Engine   Engine
	Passkeys Passkeys
	// Audit, when set, is where View reads an approval's timeline from
	// (the signed chain); nil keeps the read model's timeline.
	Audit AuditChains

	// Rates is where the limits below are counted: one count for every
	// replica sharing its NATS. Nil counts in this process alone (tests).
	Rates *ratelimit.Store
	// RatePerMinute and Burst limit task creation per principal. Over the
	// limit a call is refused, not turned into a task (SEP-2848).
	RatePerMinute int
	Burst         int
	// MaxPendingPerPrincipal bounds the non-terminal tasks of one principal.
	MaxPendingPerPrincipal int
	// PollInterval is suggested to clients polling a task.
	PollInterval time.Duration
	// ResultRetention is how long a finished task stays readable; a task's
	// TTL is its approval TTL plus this.
	ResultRetention time.Duration

	Logger *slog.Logger
	// Telemetry records decisions and passkey verification failures; nil
	// records nothing.
	Telemetry *telemetry.Telemetry
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Service owns every change to a task. It is safe for concurrent use.
type Service struct {
	opts       Options
	store      *tasks.Store
	engine     Engine
	passkeys   Passkeys
	audit      AuditChains
	log        *slog.Logger
	metrics    *telemetry.Metrics
	now        func() time.Time
	creations  ratelimit.Limiter // task creations per principal
	challenges ratelimit.Limiter // challenges per approval
	starts     *starts           // workflow starts in flight (start.go)
}

// New validates opts and returns the service.
func New(opts Options) (*Service, error) {
	switch {
	case opts.Store == nil:
		return nil, errors.New("approvals: Store is required")
	case opts.Engine == nil:
		return nil, errors.New("approvals: Engine is required")
	case opts.RatePerMinute < 0, opts.Burst < 0, opts.MaxPendingPerPrincipal < 0,
		opts.PollInterval < 0, opts.ResultRetention < 0:
		return nil, errors.New("approvals: limits must not be negative")
	}
	if opts.RatePerMinute == 0 {
		opts.RatePerMinute = DefaultRatePerMinute
	}
	if opts.Burst == 0 {
		opts.Burst = DefaultBurst
	}
	if opts.MaxPendingPerPrincipal == 0 {
		opts.MaxPendingPerPrincipal = DefaultMaxPendingPerPrincipal
	}
	if opts.PollInterval == 0 {
		opts.PollInterval = DefaultPollInterval
	}
	if opts.ResultRetention == 0 {
		opts.ResultRetention = DefaultResultRetention
	}
	s := &Service{
		opts:       opts,
		store:      opts.Store,
		engine:     opts.Engine,
		passkeys:   opts.Passkeys,
		audit:      opts.Audit,
		log:        opts.Logger,
		metrics:    opts.Telemetry.M(),
		now:        opts.Now,
		creations:  opts.Rates.Limiter("task-creations", opts.RatePerMinute, opts.Burst),
		challenges: opts.Rates.Limiter("approval-challenges", challengesPerMinute, challengeBurst),
		starts:     newStarts(maxStartsInFlight),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// Errors. Adapters map them to their wire; anything else is an internal
// failure whose cause is logged, never sent.
var (
	// ErrNotFound: no such task for this owner (a task owned by someone
	// else is answered exactly as an unknown one), or no such approval.
	ErrNotFound = errors.New("approvals: not found")
	// ErrExpired: the task outlived its TTL.
	ErrExpired = errors.New("approvals: task expired")
	// ErrUnknownCursor: a List cursor that is not one of the owner's tasks.
	ErrUnknownCursor = errors.New("approvals: unknown cursor")
	// ErrNotPending: the approval takes no more decisions.
	ErrNotPending = errors.New("approvals: the approval is no longer pending")
	// ErrTooManyChallenges: the approval's challenge budget is spent for now.
	ErrTooManyChallenges = errors.New("approvals: too many challenges for this approval")
	// ErrLimitUnavailable: a rate limit could not be checked (its store is
	// unreachable or contended), so nothing was done; try again.
	ErrLimitUnavailable = errors.New("approvals: the rate limit could not be checked")
	// ErrInvalidDecision: a decision other than approve or deny.
	ErrInvalidDecision = errors.New("approvals: decision must be approve or deny")
	// ErrVerificationUnavailable: the evidence could not be checked (the
	// passkey store is unreachable); the same request may be sent again.
	ErrVerificationUnavailable = errors.New("approvals: the decision could not be verified")
	// ErrInProgress: the decision's outcome did not arrive in time; the
	// same request again is the same decision and gets its outcome.
	ErrInProgress = errors.New("approvals: the decision is still being processed")
	// ErrUnknownApprover: DenyUnsigned names an approver that does not exist.
	ErrUnknownApprover = errors.New("approvals: no such approver")
	// ErrNotEligible: the approver is not in the approval's group.
	ErrNotEligible = errors.New("approvals: the approver is not in the approval's group")
)

// Refused is a call the service turned away without creating a task (a
// limit, or limits it could not check). Reason is written for the caller
// and says that nothing ran and no approval was requested.
type Refused struct {
	Reason string
}

func (e *Refused) Error() string { return "approvals: refused: " + e.Reason }
