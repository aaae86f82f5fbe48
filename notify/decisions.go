package notify

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/countersign/countersign/tasks"
)

// Subjects of the NATS decision service: request/reply mirrors of the
// approver API. Each request is a JSON object: the HTTP body of the
// endpoint plus "ref", the approval reference. The reply is exactly the
// HTTP response body, with the HTTP status in the [StatusHeader] header.
const (
	SubjectApproval  = "countersign.approver.v1.approval"  // {ref} → GET /approver/v1/approvals/{ref}
	SubjectChallenge = "countersign.approver.v1.challenge" // {ref, decision} → POST …/challenge
	SubjectDecision  = "countersign.approver.v1.decision"  // {ref, challengeId, decision, comment?, response} → POST …/decision
	// DecisionQueue is the queue group: replicas share the requests.
	DecisionQueue = "countersign-decisions"
	// StatusHeader carries the HTTP status of a reply.
	StatusHeader = "Countersign-Status"
)

// decisionTimeout bounds one request (a decision waits on the workflow).
const decisionTimeout = 40 * time.Second

// maxInflight bounds concurrent requests per process.
const maxInflight = 64

// DecisionOptions configures [NewDecisionService].
type DecisionOptions struct {
	// API is the approver API's HTTP handler (web.Handler). The service
	// hands it each request in-process, so the same parsing, limits and
	// verification apply as over HTTP.
	API http.Handler
	// Logger; nil discards.
	Logger *slog.Logger
}

// DecisionService answers approver API requests over NATS request/reply.
type DecisionService struct {
	api  http.Handler
	log  *slog.Logger
	subs []*nats.Subscription
	sem  chan struct{}
	wg   sync.WaitGroup
	ctx  context.Context
	stop context.CancelFunc
}

// NewDecisionService subscribes to the decision subjects on nc, in the
// [DecisionQueue] queue group.
func NewDecisionService(nc *nats.Conn, opts DecisionOptions) (*DecisionService, error) {
	if nc == nil || opts.API == nil {
		return nil, errors.New("notify: decision service needs a NATS connection and the approver API")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, stop := context.WithCancel(context.Background())
	d := &DecisionService{api: opts.API, log: log, sem: make(chan struct{}, maxInflight), ctx: ctx, stop: stop}
	for subj, ep := range map[string]endpoint{
		SubjectApproval:  {method: http.MethodGet, suffix: ""},
		SubjectChallenge: {method: http.MethodPost, suffix: "/challenge"},
		SubjectDecision:  {method: http.MethodPost, suffix: "/decision"},
	} {
		sub, err := nc.QueueSubscribe(subj, DecisionQueue, func(m *nats.Msg) { d.dispatch(m, ep) })
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("notify: subscribe %s: %w", subj, err)
		}
		d.subs = append(d.subs, sub)
	}
	return d, nil
}

type endpoint struct {
	method string
	suffix string
}

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
		status, body := d.handle(m.Data, ep)
		respond(m, status, body)
	}()
}

func errBody(code, message string) []byte {
	b, _ := json.Marshal(map[string]string{"error": code, "message": message})
	return b
}

func respond(m *nats.Msg, status int, body []byte) {
	r := nats.NewMsg(m.Reply)
	r.Header.Set(StatusHeader, strconv.Itoa(status))
	r.Data = body
	_ = m.RespondMsg(r)
}

// handle turns one NATS request into an in-process HTTP request.
func (d *DecisionService) handle(data []byte, ep endpoint) (int, []byte) {
	var fields map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&fields); err != nil || fields == nil {
		return http.StatusBadRequest, errBody("invalid_request", "the request must be a JSON object with \"ref\"")
	}
	if dec.More() {
		return http.StatusBadRequest, errBody("invalid_request", "the request must contain a single JSON object")
	}
	var ref string
	if raw, ok := fields["ref"]; !ok || json.Unmarshal(raw, &ref) != nil || ref == "" {
		return http.StatusBadRequest, errBody("invalid_request", "\"ref\" (the approval reference) is required and must be a string")
	}
	if !tasks.ValidID(ref) {
		return http.StatusNotFound, errBody("not_found", "no such approval")
	}
	delete(fields, "ref")
	var body []byte
	if ep.method == http.MethodPost {
		body, _ = json.Marshal(fields)
	} else if len(fields) > 0 {
		return http.StatusBadRequest, errBody("invalid_request", "only \"ref\" is accepted")
	}
	ctx, cancel := context.WithTimeout(d.ctx, decisionTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, ep.method, "/approver/v1/approvals/"+url.PathEscape(ref)+ep.suffix, bytes.NewReader(body))
	if err != nil {
		return http.StatusBadRequest, errBody("invalid_request", "malformed request")
	}
	req.RemoteAddr = "nats"
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	w := &memResponse{header: http.Header{}}
	d.api.ServeHTTP(w, req)
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.status, bytes.TrimRight(w.body.Bytes(), "\n")
}

// memResponse is an in-memory http.ResponseWriter.
type memResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *memResponse) Header() http.Header { return w.header }
func (w *memResponse) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *memResponse) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
