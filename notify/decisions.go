package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// Subjects of the NATS decision service: request/reply mirrors of the
// approver API. Each request is a JSON object: the HTTP body of the
// endpoint plus "ref", the approval reference. The reply is exactly the
// HTTP response body, with the HTTP status in the [StatusHeader] header.
// Both edges speak the wire of package internal/approverapi over the same
// approvals service; neither calls the other.
const (
	SubjectApproval  = "countersign.approver.v1.approval"  // {ref} → GET /approver/v1/approvals/{ref}
	SubjectChallenge = "countersign.approver.v1.challenge" // {ref, decision} → POST …/challenge
	SubjectDecision  = "countersign.approver.v1.decision"  // {ref, challengeId, decision, comment?, response} → POST …/decision
	// DecisionQueue is the queue group: replicas share the requests.
	DecisionQueue = "countersign-decisions"
	// StatusHeader carries the HTTP status of a reply.
	StatusHeader = "Countersign-Status"
)

// decisionTimeout bounds one request (a decision waits on the workflow,
// up to approverapi.DecideTimeout).
const decisionTimeout = 40 * time.Second

// maxInflight bounds concurrent requests per process.
const maxInflight = 64

// Approvals is what the decision service uses of *approvals.Service.
type Approvals interface {
	View(ctx context.Context, ref string) (approvals.Approval, error)
	Challenge(ctx context.Context, ref, decision string) (passkey.Challenge, error)
	Decide(ctx context.Context, ref string, d tasks.DecisionUpdate) (approvals.Verdict, error)
}

// DecisionOptions configures [NewDecisionService].
type DecisionOptions struct {
	// Approvals shows and decides approvals (*approvals.Service, the one
	// the approver site uses). Required.
	Approvals Approvals
	// MaxBodyBytes caps a request's body (without "ref"), as the site caps
	// HTTP bodies. Zero means approverapi.DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Logger; nil discards.
	Logger *slog.Logger
}

// DecisionService answers approver API requests over NATS request/reply.
type DecisionService struct {
	approvals Approvals
	maxBody   int64
	log       *slog.Logger
	subs      []*nats.Subscription
	sem       chan struct{}
	wg        sync.WaitGroup
	ctx       context.Context
	stop      context.CancelFunc
}

// NewDecisionService subscribes to the decision subjects on nc, in the
// [DecisionQueue] queue group.
func NewDecisionService(nc *nats.Conn, opts DecisionOptions) (*DecisionService, error) {
	if nc == nil || opts.Approvals == nil {
		return nil, errors.New("notify: decision service needs a NATS connection and the approvals service")
	}
	if opts.MaxBodyBytes < 0 {
		return nil, errors.New("notify: MaxBodyBytes must not be negative")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxBody := opts.MaxBodyBytes
	if maxBody == 0 {
		maxBody = approverapi.DefaultMaxBodyBytes
	}
	ctx, stop := context.WithCancel(context.Background())
	d := &DecisionService{approvals: opts.Approvals, maxBody: maxBody, log: log, sem: make(chan struct{}, maxInflight), ctx: ctx, stop: stop}
	for subj, handle := range map[string]endpoint{
		SubjectApproval:  d.view,
		SubjectChallenge: d.challenge,
		SubjectDecision:  d.decide,
	} {
		sub, err := nc.QueueSubscribe(subj, DecisionQueue, func(m *nats.Msg) { d.dispatch(m, handle) })
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("notify: subscribe %s: %w", subj, err)
		}
		d.subs = append(d.subs, sub)
	}
	return d, nil
}

// endpoint answers one request: ref and the other fields of its object.
// err, when not nil, is the failure the reply answers, for the log.
type endpoint func(ctx context.Context, ref string, fields map[string]json.RawMessage) (approverapi.Reply, error)

// Close unsubscribes and waits for requests in flight. It is idempotent.
func (d *DecisionService) Close() {
	for _, s := range d.subs {
		_ = s.Unsubscribe()
	}
	d.subs = nil
	d.wg.Wait()
	d.stop()
}

func (d *DecisionService) dispatch(m *nats.Msg, ep endpoint) {
	if m.Reply == "" {
		d.log.Debug("notify: decision request without reply subject dropped", "subject", m.Subject)
		return
	}
	select {
	case d.sem <- struct{}{}:
	default:
		respond(m, http.StatusServiceUnavailable, errBody("busy", "too many requests in flight; try again"))
		return
	}
	d.wg.Add(1)
	go func() {
		defer func() { <-d.sem; d.wg.Done() }()
		status, body := d.handle(m.Subject, m.Data, ep)
		respond(m, status, body)
	}()
}

func errBody(code, message string) []byte {
	b, _ := json.Marshal(approverapi.ErrorBody{Error: code, Message: message})
	return b
}

func respond(m *nats.Msg, status int, body []byte) {
	r := nats.NewMsg(m.Reply)
	r.Header.Set(StatusHeader, strconv.Itoa(status))
	r.Data = body
	_ = m.RespondMsg(r)
}

// handle answers one request: the envelope ({ref, …}) is checked here, the
// rest by the endpoint. A panic is a 500, as over HTTP.
func (d *DecisionService) handle(subject string, data []byte, ep endpoint) (status int, body []byte) {
	defer func() {
		if v := recover(); v != nil {
			d.log.Error("notify: decision service: panic", "subject", subject, "panic", fmt.Sprint(v))
			status, body = http.StatusInternalServerError, errBody(approverapi.CodeInternal, approverapi.MsgInternal)
		}
	}()
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return http.StatusBadRequest, errBody(approverapi.CodeInvalidRequest, "the request must be a JSON object with \"ref\"")
	}
	if dec.More() {
		return http.StatusBadRequest, errBody(approverapi.CodeInvalidRequest, "the request must contain a single JSON object")
	}
	var ref string
	if raw, ok := fields["ref"]; !ok || json.Unmarshal(raw, &ref) != nil || ref == "" {
		return http.StatusBadRequest, errBody(approverapi.CodeInvalidRequest, "\"ref\" (the approval reference) is required and must be a string")
	}
	delete(fields, "ref")
	ctx, cancel := context.WithTimeout(d.ctx, decisionTimeout)
	defer cancel()
	var rep approverapi.Reply
	var err error
	if !tasks.ValidID(ref) {
		// Refused before the body is read, as over HTTP.
		rep, err = approverapi.ErrorReply(approvals.ErrNotFound), approvals.ErrNotFound
	} else {
		rep, err = ep(ctx, ref, fields)
	}
	if err != nil && rep.Status == http.StatusInternalServerError {
		d.log.Error("notify: decision service: internal error", "subject", subject, "error", err)
	} else if err != nil {
		d.log.Debug("notify: decision service: request refused", "subject", subject, "status", rep.Status, "error", err)
	}
	b, merr := json.Marshal(rep.Body)
	if merr != nil {
		d.log.Error("notify: decision service: encode reply", "subject", subject, "error", merr)
		return http.StatusInternalServerError, errBody(approverapi.CodeInternal, approverapi.MsgInternal)
	}
	return rep.Status, b
}

// body decodes the request's fields but "ref" into dst as the site decodes
// an HTTP body: bounded, strict (approverapi.Decode).
func (d *DecisionService) body(fields map[string]json.RawMessage, dst any) error {
	b, err := json.Marshal(fields)
	if err != nil {
		return approverapi.BadRequest("malformed request")
	}
	if int64(len(b)) > d.maxBody {
		return approverapi.BodyTooLarge(d.maxBody)
	}
	return approverapi.Decode(b, dst)
}

// view: {ref} → GET /approver/v1/approvals/{ref}.
func (d *DecisionService) view(ctx context.Context, ref string, fields map[string]json.RawMessage) (approverapi.Reply, error) {
	if len(fields) > 0 {
		err := approverapi.BadRequest("only \"ref\" is accepted")
		return approverapi.ErrorReply(err), err
	}
	a, err := d.approvals.View(ctx, ref)
	return approverapi.ViewReply(a, err), err
}

// challenge: {ref, decision} → POST /approver/v1/approvals/{ref}/challenge.
func (d *DecisionService) challenge(ctx context.Context, ref string, fields map[string]json.RawMessage) (approverapi.Reply, error) {
	var req approverapi.ChallengeRequest
	if err := d.body(fields, &req); err != nil {
		return approverapi.ErrorReply(err), err
	}
	ch, err := d.approvals.Challenge(ctx, ref, req.Decision)
	return approverapi.ChallengeReply(ch, req.Decision, err), err
}

// decide: {ref, challengeId, decision, comment?, response} → POST
// /approver/v1/approvals/{ref}/decision.
func (d *DecisionService) decide(ctx context.Context, ref string, fields map[string]json.RawMessage) (approverapi.Reply, error) {
	var req approverapi.DecisionRequest
	err := d.body(fields, &req)
	if err == nil {
		err = req.Validate()
	}
	if err != nil {
		return approverapi.ErrorReply(err), err
	}
	ctx, cancel := context.WithTimeout(ctx, approverapi.DecideTimeout)
	defer cancel()
	v, err := d.approvals.Decide(ctx, ref, req.Update())
	return approverapi.DecisionReply(v, err), err
}
