package pdp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/big"
	"time"

	"github.com/open-policy-agent/opa/v1/rego"
)

// Query is the Rego rule every policy set must define.
const Query = "data.countersign.authz.decision"

// DefaultMaxApprovalTTL caps the approval TTL a policy may ask for when
// [Options.MaxApprovalTTL] is zero.
const DefaultMaxApprovalTTL = 7 * 24 * time.Hour

// ReasonUndefined is the reason of the deny decision returned when the policy
// does not define a decision for the input.
const ReasonUndefined = "no policy decision (undefined means deny)"

// Authenticator classes a requestable decision may demand.
const (
	AuthenticatorPlatform      = "platform"
	AuthenticatorCrossPlatform = "cross-platform"
)

var (
	// ErrNoPolicy is returned by [New] for a policy directory without .rego files.
	ErrNoPolicy = errors.New("pdp: no .rego policy files found")
	// ErrInvalidInput is returned by [Engine.Evaluate] when the input cannot be
	// given to the policy, for example arguments that are not a JSON object.
	ErrInvalidInput = errors.New("pdp: invalid input")
)

// Entity is an AuthZEN subject or resource.
type Entity struct {
	Type       string         `json:"type"`
	ID         string         `json:"id"`
	Properties map[string]any `json:"properties,omitempty"`
}

// Resource is the AuthZEN resource of a tool call: {type: "tool", id: the
// tool's name as Countersign serves it}. For a tool of an upstream MCP
// server it also names the upstream, the tool's name there and the
// upstream's annotations, which are hints the upstream chose, not facts:
// a policy that trusts readOnlyHint trusts the upstream. Approval is the
// upstream's configured override ("always", "never", or "" to let policy
// decide), which the default policy honours.
type Resource struct {
	Type        string          `json:"type"`
	ID          string          `json:"id"`
	Properties  map[string]any  `json:"properties,omitempty"`
	Upstream    string          `json:"upstream,omitempty"`
	Tool        string          `json:"tool,omitempty"`
	Annotations json.RawMessage `json:"annotations,omitempty"`
	Approval    string          `json:"approval,omitempty"`
}

// Action is an AuthZEN action.
type Action struct {
	Name       string         `json:"name"`
	Properties map[string]any `json:"properties,omitempty"`
}

// Approval is one verified approval, given to the policy on re-evaluation.
type Approval struct {
	ApproverID   string    `json:"approver_id"`
	Name         string    `json:"name"`
	Groups       []string  `json:"groups"`
	CredentialID string    `json:"credential_id"`
	ApprovedAt   time.Time `json:"approved_at"`
}

// Context is the AuthZEN context of one tool call.
type Context struct {
	Arguments  json.RawMessage `json:"arguments"`   // raw JSON object of the tool arguments
	ActionHash string          `json:"action_hash"` // hex
	Time       time.Time       `json:"time"`
	Approvals  []Approval      `json:"approvals,omitempty"` // set on re-evaluation after quorum
}

// Input is an AuthZEN-shaped evaluation request. For a tool call the subject is
// {type: "agent", id: principal}, the action {name: "tools/call"} and the
// resource {type: "tool", id: tool name}. An OAuth agent's subject also has
// properties: {auth: "oauth", issuer, sub, client_id, scopes: [...],
// claims: {...}} (internal/oauth, Verifier.Properties), the same on the
// re-evaluation after approval (tasks.Envelope.Subject); a static-token
// agent's has none.
type Input struct {
	Subject  Entity   `json:"subject"`
	Action   Action   `json:"action"`
	Resource Resource `json:"resource"`
	Context  Context  `json:"context"`
}

// Effect is the outcome of a decision.
type Effect string

// Effects.
const (
	EffectAllow       Effect = "allow"
	EffectDeny        Effect = "deny"
	EffectRequestable Effect = "requestable"
	// EffectToken: the call runs once, now, only if it carries a valid
	// single-use transaction token bound to its principal, tool and
	// arguments (package txtoken); without one it is refused, and nothing
	// runs. The decision carries only a reason.
	EffectToken Effect = "token"
	// EffectVerify asks for SEP-2672 in-band verified approval: the
	// caller's own passkey signs this exact call (approval/challenge/create,
	// then the assertion in the tools/call _meta), and the call runs at once
	// when the evidence verifies. AuthenticatorClass is the tool's class
	// (default "cross-platform", the SEP's default).
	EffectVerify Effect = "verify"
)

// InBandGroup is the group of the approvers that in-band enrollment
// creates (passkey.InBandGroup): any agent can put a passkey into it with
// its bearer token alone, so a decision naming it as approver_group would
// let every agent decide every other agent's tasks. Such a decision is
// refused like any malformed one (the call is denied).
const InBandGroup = "in-band"

// ActionIssueToken is the action name of a request for a transaction token
// (the input's action.name; tool calls are "tools/call"). The subject,
// resource and context are those of the call the token would authorize.
// Only an allow decision lets the subject obtain one itself; an operator's
// issuance through the admin API is not asked.
const ActionIssueToken = "transaction-token/issue"

// Decision is the validated result of one evaluation. The approval fields are
// set only when Effect is [EffectRequestable]; AuthenticatorClass is also set
// for [EffectVerify]. PolicyVersion is always set.
type Decision struct {
	Effect             Effect        `json:"effect"`
	Reason             string        `json:"reason"`
	ApproverGroup      string        `json:"approver_group,omitempty"`
	Quorum             int           `json:"quorum,omitempty"`
	ApprovalTTL        time.Duration `json:"approval_ttl,omitempty"`
	AuthenticatorClass string        `json:"authenticator_class,omitempty"` // "platform" | "cross-platform"
	SlackChannel       string        `json:"slack_channel,omitempty"`
	PolicyVersion      string        `json:"policy_version"` // "sha256:<hex>"
}

// DefaultEvalTimeout bounds one evaluation when [Options.EvalTimeout] is
// zero: far above what a policy of rules over one call needs (well under a
// millisecond), short enough that a pathological policy, or one whose
// http.send hangs, denies the call instead of holding the request.
const DefaultEvalTimeout = 5 * time.Second

// Options configures an [Engine]. The zero value loads the embedded default
// policy, logs nothing, caps approval TTLs at [DefaultMaxApprovalTTL] and
// evaluations at [DefaultEvalTimeout].
type Options struct {
	Dir            string        // policy directory; empty = embedded default policy
	Logger         *slog.Logger  // nil = discard
	MaxApprovalTTL time.Duration // 0 = DefaultMaxApprovalTTL
	EvalTimeout    time.Duration // 0 = DefaultEvalTimeout
}

// Engine evaluates tool calls against one compiled policy set. It is
// immutable and safe for concurrent use.
type Engine struct {
	query   rego.PreparedEvalQuery
	version string
	maxTTL  time.Duration
	timeout time.Duration
	log     *slog.Logger
}

// New loads, compiles and prepares the policy set, so that a bad policy fails
// here rather than on the first request.
func New(ctx context.Context, opts Options) (*Engine, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	maxTTL := opts.MaxApprovalTTL
	if maxTTL <= 0 {
		maxTTL = DefaultMaxApprovalTTL
	}
	timeout := opts.EvalTimeout
	if timeout <= 0 {
		timeout = DefaultEvalTimeout
	}
	set, err := load(opts.Dir)
	if err != nil {
		return nil, err
	}
	q, err := set.prepare(ctx)
	if err != nil {
		return nil, err
	}
	log.Info("policy loaded", "policy_dir", opts.Dir, "policy_files", len(set.modules)+set.dataFiles, "policy_version", set.version)
	return &Engine{query: q, version: set.version, maxTTL: maxTTL, timeout: timeout, log: log}, nil
}

// Version returns the loaded policy set's content hash, "sha256:<hex>".
func (e *Engine) Version() string { return e.version }

// Evaluate decides one call. An undefined decision is a deny decision, not an
// error; a decision that breaks the contract is a deny decision naming the
// problem. An error means the policy could not be evaluated; the caller must
// treat it as deny. An evaluation that takes longer than
// [Options.EvalTimeout] is stopped and is such an error, wrapping
// context.DeadlineExceeded.
func (e *Engine) Evaluate(ctx context.Context, in Input) (Decision, error) {
	doc, err := policyInput(in)
	if err != nil {
		return Decision{}, err
	}
	opts := []rego.EvalOption{rego.EvalInput(doc)}
	if !in.Context.Time.IsZero() {
		opts = append(opts, rego.EvalTime(in.Context.Time))
	}
	ectx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	rs, err := e.query.Eval(ectx, opts...)
	if err != nil {
		if ctx.Err() == nil && ectx.Err() != nil {
			return Decision{}, fmt.Errorf("pdp: evaluate: the policy took longer than %v (--policy-timeout), stopped: %w", e.timeout, context.DeadlineExceeded)
		}
		return Decision{}, fmt.Errorf("pdp: evaluate: %w", err)
	}
	d := e.decide(rs)
	e.log.Debug("policy decision", "tool", in.Resource.ID, "decision", d.Effect, "policy_version", d.PolicyVersion)
	return d, nil
}

// policyInput is the JSON form of in, decoded with json.Number so that large
// amounts keep their exact value in Rego.
func policyInput(in Input) (any, error) {
	if len(bytes.TrimSpace(in.Context.Arguments)) == 0 {
		in.Context.Arguments = json.RawMessage("{}")
	}
	b, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidInput, err)
	}
	c := doc["context"].(map[string]any)
	if _, ok := c["arguments"].(map[string]any); !ok {
		return nil, fmt.Errorf("%w: arguments must be a JSON object", ErrInvalidInput)
	}
	return doc, nil
}

func (e *Engine) decide(rs rego.ResultSet) Decision {
	if len(rs) == 0 || len(rs[0].Expressions) == 0 {
		return Decision{Effect: EffectDeny, Reason: ReasonUndefined, PolicyVersion: e.version}
	}
	d, err := e.parse(rs[0].Expressions[0].Value)
	if err != nil {
		e.log.Warn("malformed policy decision", "policy_version", e.version, "error", err)
		return Decision{Effect: EffectDeny, Reason: "malformed policy decision: " + err.Error(), PolicyVersion: e.version}
	}
	return d
}

// parse validates a decision object against the Rego contract.
func (e *Engine) parse(v any) (Decision, error) {
	obj, ok := v.(map[string]any)
	if !ok {
		return Decision{}, errors.New("decision is not an object")
	}
	d := Decision{PolicyVersion: e.version}
	var err error
	if d.Reason, err = str(obj, "reason", false); err != nil {
		return Decision{}, err
	}
	effect, err := str(obj, "effect", true)
	if err != nil {
		return Decision{}, err
	}
	switch d.Effect = Effect(effect); d.Effect {
	case EffectAllow, EffectDeny:
		return d, nil
	case EffectToken:
		return d, nil
	case EffectRequestable:
	case EffectVerify:
		return d, parseVerify(obj, &d)
	default:
		return Decision{}, fmt.Errorf("unknown effect %q", effect)
	}

	if d.ApproverGroup, err = str(obj, "approver_group", true); err != nil {
		return Decision{}, err
	}
	if d.ApproverGroup == InBandGroup {
		return Decision{}, fmt.Errorf("approver_group %q is the group of in-band enrolled passkeys, which any agent can join; name a group of approvers", InBandGroup)
	}
	quorum, err := positiveInt(obj, "quorum")
	if err != nil {
		return Decision{}, err
	}
	d.Quorum = int(quorum)
	ttl, err := positiveInt(obj, "approval_ttl_seconds")
	if err != nil {
		return Decision{}, err
	}
	d.ApprovalTTL = e.maxTTL
	if ttl < int64(e.maxTTL/time.Second) {
		d.ApprovalTTL = time.Duration(ttl) * time.Second
	}
	if d.AuthenticatorClass, err = str(obj, "authenticator_class", false); err != nil {
		return Decision{}, err
	}
	switch d.AuthenticatorClass {
	case "":
		d.AuthenticatorClass = AuthenticatorPlatform
	case AuthenticatorPlatform, AuthenticatorCrossPlatform:
	default:
		return Decision{}, fmt.Errorf("unknown authenticator_class %q", d.AuthenticatorClass)
	}
	if d.SlackChannel, err = str(obj, "slack_channel", false); err != nil {
		return Decision{}, err
	}
	return d, nil
}

// parseVerify reads a verify decision's one field, authenticator_class,
// whose default is SEP-2672's: "cross-platform".
func parseVerify(obj map[string]any, d *Decision) error {
	class, err := str(obj, "authenticator_class", false)
	if err != nil {
		return err
	}
	switch class {
	case "":
		class = AuthenticatorCrossPlatform
	case AuthenticatorPlatform, AuthenticatorCrossPlatform:
	default:
		return fmt.Errorf("unknown authenticator_class %q", class)
	}
	d.AuthenticatorClass = class
	return nil
}

// str returns obj[key] as a string; a missing key is an error only if required.
func str(obj map[string]any, key string, required bool) (string, error) {
	v, ok := obj[key]
	if !ok && !required {
		return "", nil
	}
	s, isStr := v.(string)
	switch {
	case required && s == "":
		return "", fmt.Errorf("%s must be a non-empty string", key)
	case !isStr:
		return "", fmt.Errorf("%s must be a string", key)
	}
	return s, nil
}

// positiveInt returns obj[key] as an integer ≥ 1, saturating at MaxInt64.
func positiveInt(obj map[string]any, key string) (int64, error) {
	n, _ := obj[key].(json.Number)
	r, ok := new(big.Rat).SetString(string(n))
	if !ok || !r.IsInt() || r.Sign() < 1 {
		return 0, fmt.Errorf("%s must be an integer ≥ 1", key)
	}
	if !r.Num().IsInt64() {
		return math.MaxInt64, nil
	}
	return r.Num().Int64(), nil
}
