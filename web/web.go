package web

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/internal/authn"
	"github.com/countersign/countersign/internal/ratelimit"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

// DefaultMaxBodyBytes caps a JSON request body when Options.MaxBodyBytes is 0.
const DefaultMaxBodyBytes = approverapi.DefaultMaxBodyBytes

// Approvals is what the site uses of *approvals.Service, the one place a
// task changes: the approver API and the approval page show and decide
// approvals through it, the inbox and the admin list read what waits.
type Approvals interface {
	View(ctx context.Context, ref string) (approvals.Approval, error)
	Pending(ctx context.Context) ([]tasks.Record, error)
	Challenge(ctx context.Context, ref, decision string) (passkey.Challenge, error)
	Decide(ctx context.Context, ref string, d tasks.DecisionUpdate) (approvals.Verdict, error)
}

// Options configures a [Handler]. Every field but Audit, MaxBodyBytes and
// Logger is required.
type Options struct {
	// PublicURL is the scheme://host[:port] approvers open, such as
	// "https://approvals.example.com" or "http://localhost:8080". It is the
	// base of enrollment and approval links and the only Origin accepted on
	// state-changing requests. It must not have a path: the site is mounted
	// at the root.
	PublicURL string
	// Approvals shows and decides approvals (*approvals.Service).
	Approvals Approvals
	// Passkeys serves what is not a task change: enrollment, the inbox's
	// login challenges and the admin API's approver management.
	Passkeys *passkey.Service
	Tokens   *authn.Tokens
	// Audit serves the admin audit API; nil answers it with 404.
	Audit *audit.Log
	// Transactions serves POST /admin/v1/transaction-tokens; nil answers it
	// with 404.
	Transactions TokenIssuer
	// MaxBodyBytes caps JSON request bodies. Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// Rates is where the inbox challenge limit is counted: one count for
	// every replica sharing its NATS. Nil counts in this process alone
	// (tests).
	Rates *ratelimit.Store
	// Logger receives structured logs. Nil discards them.
	Logger *slog.Logger
}

// Handler serves the approver site, the approver API and the admin API.
type Handler struct {
	publicURL string // base of links: PublicURL's origin, no trailing slash
	origin    string // scheme://host[:port], lowercase, default port dropped
	https     bool

	approvals Approvals
	passkeys  *passkey.Service
	tokens    *authn.Tokens
	audit     *audit.Log
	txtokens  TokenIssuer
	maxBody   int64
	log       *slog.Logger
	now       func() time.Time

	pages *pages
	mux   *http.ServeMux
	// inboxChallenges bounds how many passkey challenges one inbox can
	// mint: challenges are stored (NATS KV) and the endpoint needs no
	// authentication, so without it anyone holding an approver ID could
	// fill the store. (The approvals service bounds an approval's.)
	inboxChallenges ratelimit.Limiter
}

// Challenge issuing limit per inbox: an inbox link is an approver's, opened
// on a few devices; the same budget as an approval's, then one challenge
// every two seconds.
const (
	inboxChallengesPerMinute = 30
	inboxChallengeBurst      = 30
)

// New validates opts and builds the handler. Templates and static files are
// parsed here, so a broken asset fails at startup rather than on a request.
func New(opts Options) (*Handler, error) {
	switch {
	case opts.Approvals == nil:
		return nil, errors.New("web: Approvals is required")
	case opts.Passkeys == nil:
		return nil, errors.New("web: Passkeys is required")
	case opts.Tokens == nil:
		return nil, errors.New("web: Tokens is required")
	case opts.MaxBodyBytes < 0:
		return nil, errors.New("web: MaxBodyBytes must not be negative")
	}
	origin, err := parsePublicURL(opts.PublicURL)
	if err != nil {
		return nil, err
	}
	p, err := loadPages()
	if err != nil {
		return nil, err
	}
	h := &Handler{
		publicURL: origin,
		origin:    origin,
		https:     strings.HasPrefix(origin, "https://"),
		approvals: opts.Approvals,
		passkeys:  opts.Passkeys,
		tokens:    opts.Tokens,
		audit:     opts.Audit,
		txtokens:  opts.Transactions,
		maxBody:   opts.MaxBodyBytes,
		log:       opts.Logger,
		now:       time.Now,
		pages:     p,

		inboxChallenges: opts.Rates.Limiter("inbox-challenges", inboxChallengesPerMinute, inboxChallengeBurst),
	}
	if h.maxBody == 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	h.routes()
	return h, nil
}

// parsePublicURL checks the public URL and returns its origin, which is
// also the base of every link the handler hands out.
func parsePublicURL(raw string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", fmt.Errorf("web: PublicURL: %w", err)
	}
	scheme := strings.ToLower(u.Scheme)
	if scheme != "http" && scheme != "https" {
		return "", fmt.Errorf("web: PublicURL %q must be an http or https URL", raw)
	}
	if u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || (u.Path != "" && u.Path != "/") {
		return "", fmt.Errorf("web: PublicURL %q must be scheme://host[:port] with no path, query or credentials", raw)
	}
	return normalizeOrigin(u), nil
}

// normalizeOrigin renders u as a browser serializes an origin: lowercase
// scheme and host, default port omitted.
func normalizeOrigin(u *url.URL) string {
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	if strings.Contains(host, ":") { // IPv6 literal
		host = "[" + host + "]"
	}
	port := u.Port()
	if (scheme == "http" && port == "80") || (scheme == "https" && port == "443") {
		port = ""
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host
}

func (h *Handler) routes() {
	m := http.NewServeMux()

	// Admin API: bearer admin token.
	m.HandleFunc("POST /admin/v1/approvers", h.api(h.admin(h.addApprover)))
	m.HandleFunc("POST /admin/v1/approvers/{id}/invites", h.api(h.admin(h.newInvite)))
	m.HandleFunc("POST /admin/v1/agents", h.api(h.admin(h.addAgent)))
	m.HandleFunc("GET /admin/v1/approvers", h.api(h.admin(h.listApprovers)))
	m.HandleFunc("GET /admin/v1/approvals", h.api(h.admin(h.listApprovals)))
	m.HandleFunc("GET /admin/v1/audit", h.api(h.admin(h.exportAudit)))
	m.HandleFunc("GET /admin/v1/audit/{taskId}", h.api(h.admin(h.showAudit)))
	m.HandleFunc("POST /admin/v1/transaction-tokens", h.api(h.admin(h.issueToken)))
	m.HandleFunc("POST /admin/v1/transaction-tokens/keys", h.api(h.admin(h.rotateTokenKey)))
	h.routesManage(m)

	// Approver API: the passkey is the authority.
	m.HandleFunc("POST /approver/v1/enrollments/{token}/begin", h.api(h.beginEnrollment))
	m.HandleFunc("POST /approver/v1/enrollments/{token}/finish", h.api(h.finishEnrollment))
	m.HandleFunc("GET /approver/v1/approvals/{ref}", h.api(h.getApproval))
	m.HandleFunc("POST /approver/v1/approvals/{ref}/challenge", h.api(h.challenge))
	m.HandleFunc("POST /approver/v1/approvals/{ref}/decision", h.api(h.decide))
	m.HandleFunc("POST /approver/v1/inbox/{approver}/challenge", h.api(h.inboxChallenge))
	m.HandleFunc("POST /approver/v1/inbox/{approver}/list", h.api(h.inboxList))

	// Anything else under the API prefixes answers in JSON.
	m.HandleFunc("/admin/", h.api(h.apiFallback))
	m.HandleFunc("/approver/", h.api(h.apiFallback))

	// Pages.
	m.HandleFunc("GET /{$}", h.landingPage)
	m.HandleFunc("GET /enroll/{token}", h.enrollPage)
	m.HandleFunc("GET /approve/{ref}", h.approvePage)
	m.HandleFunc("GET /inbox/{approver}", h.inboxPage)
	m.HandleFunc("GET /static/{file}", h.static)
	// Browsers ask for an icon on every page; there is none, and a 404
	// would be a console error on each.
	m.HandleFunc("GET /favicon.ico", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=86400")
		w.WriteHeader(http.StatusNoContent)
	})
	m.HandleFunc("/", h.notFoundPage)
	h.mux = m
}

// ServeHTTP sets the security headers, refuses cross-origin state changes,
// recovers panics and dispatches to the routes.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rw := &responseWriter{ResponseWriter: w}
	defer h.recoverPanic(rw, r)
	setSecurityHeaders(rw.Header(), h.https)
	if !safeMethod(r.Method) {
		if err := h.checkOrigin(r); err != nil {
			h.writeError(rw, r, err)
			return
		}
	}
	h.mux.ServeHTTP(rw, r)
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// checkOrigin rejects a browser request made from another site. Requests
// without an Origin header (command-line clients) pass; the passkey, or the
// admin bearer token, is the authority either way, but a cross-site page
// has no business driving this API.
func (h *Handler) checkOrigin(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || normalizeOrigin(u) != h.origin {
			return errCrossOrigin
		}
		return nil
	}
	// Browsers that omit Origin still say where a request came from.
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return errCrossOrigin
	}
	return nil
}

// setSecurityHeaders applies to every response, pages and API alike.
func setSecurityHeaders(hdr http.Header, https bool) {
	hdr.Set("Content-Security-Policy", contentSecurityPolicy)
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("Referrer-Policy", "no-referrer")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Cross-Origin-Opener-Policy", "same-origin")
	hdr.Set("Cache-Control", "no-store")
	if https {
		hdr.Set("Strict-Transport-Security", "max-age=31536000")
	}
}

// contentSecurityPolicy allows only this origin's own script and style files.
const contentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'"

// responseWriter remembers whether the header was sent, so a recovered panic
// writes a 500 only when it still can.
type responseWriter struct {
	http.ResponseWriter
	wrote bool
}

func (w *responseWriter) WriteHeader(code int) {
	w.wrote = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *responseWriter) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (h *Handler) recoverPanic(w *responseWriter, r *http.Request) {
	v := recover()
	if v == nil {
		return
	}
	if v == http.ErrAbortHandler {
		panic(v) // net/http's own way to abort a response
	}
	h.log.ErrorContext(r.Context(), "web: panic", "route", r.Pattern, "panic", fmt.Sprint(v))
	if w.wrote {
		return
	}
	if isAPIPath(r.URL.Path) {
		writeJSON(w, http.StatusInternalServerError, errorBody{Error: codeInternal, Message: msgInternal})
		return
	}
	h.renderError(w, r, http.StatusInternalServerError)
}

func isAPIPath(p string) bool {
	return strings.HasPrefix(p, "/admin/") || strings.HasPrefix(p, "/approver/")
}
