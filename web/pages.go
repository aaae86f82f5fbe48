package web

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/countersign/countersign/approvals"
	"github.com/countersign/countersign/internal/approverapi"
	"github.com/countersign/countersign/passkey"
	"github.com/countersign/countersign/tasks"
)

//go:embed templates/*.html static/*
var assets embed.FS

// pages holds the parsed templates and the static files.
type pages struct {
	tmpl    map[string]*template.Template
	static  map[string]staticFile
	version string // content hash of the static files, for cache busting
}

type staticFile struct {
	body  []byte
	ctype string
	etag  string
}

// pageNames are the templates/*.html files that are pages; layout.html wraps
// each of them.
var pageNames = []string{"landing", "enroll", "approve", "inbox", "error"}

func loadPages() (*pages, error) {
	p := &pages{tmpl: map[string]*template.Template{}, static: map[string]staticFile{}}
	for _, name := range pageNames {
		t, err := template.New(name).Funcs(template.FuncMap{"reveal": reveal}).
			ParseFS(assets, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("web: template %s: %w", name, err)
		}
		p.tmpl[name] = t
	}
	entries, err := fs.ReadDir(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("web: static files: %w", err)
	}
	all := sha256.New()
	for _, e := range entries {
		b, err := fs.ReadFile(assets, "static/"+e.Name())
		if err != nil {
			return nil, fmt.Errorf("web: static file %s: %w", e.Name(), err)
		}
		sum := sha256.Sum256(b)
		ctype := mime.TypeByExtension(path.Ext(e.Name()))
		if ctype == "" {
			return nil, fmt.Errorf("web: static file %s: unknown type", e.Name())
		}
		p.static[e.Name()] = staticFile{body: b, ctype: ctype, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		all.Write(sum[:])
	}
	p.version = hex.EncodeToString(all.Sum(nil)[:6])
	return p, nil
}

// pageBase is what layout.html needs.
type pageBase struct {
	Title   string
	Page    string // data-page on <body>: which script behaviour applies
	Version string
}

func (h *Handler) base(page, title string) pageBase {
	return pageBase{Title: title, Page: page, Version: h.pages.version}
}

// render executes a page into a buffer first, so a template failure is a
// clean 500 rather than half a page.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	var buf bytes.Buffer
	if err := h.pages.tmpl[name].ExecuteTemplate(&buf, "layout", data); err != nil {
		h.log.ErrorContext(r.Context(), "web: render page", "page", name, "error", err)
		if name != "error" {
			h.renderError(w, r, http.StatusInternalServerError)
		} else {
			http.Error(w, msgInternal, http.StatusInternalServerError)
		}
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

type errorPage struct {
	pageBase
	Heading string
	Message string
}

func (h *Handler) renderError(w http.ResponseWriter, r *http.Request, status int) {
	data := errorPage{pageBase: h.base("error", "Not found"), Heading: "Page not found",
		Message: "This link is not valid. Check that you opened it exactly as you received it."}
	switch status {
	case http.StatusNotFound:
	case http.StatusForbidden:
		data = errorPage{pageBase: h.base("error", "Not allowed"), Heading: "Not allowed",
			Message: "An admin has disabled or revoked this approver. Ask an admin if you think this is a mistake."}
	default:
		data = errorPage{pageBase: h.base("error", "Error"), Heading: "Something went wrong",
			Message: "The server could not show this page. Try again in a moment."}
	}
	h.render(w, r, status, "error", data)
}

func (h *Handler) landingPage(w http.ResponseWriter, r *http.Request) {
	h.render(w, r, http.StatusOK, "landing", h.base("landing", "Approvals"))
}

func (h *Handler) notFoundPage(w http.ResponseWriter, r *http.Request) {
	h.renderError(w, r, http.StatusNotFound)
}

// enrollPage: GET /enroll/{token}. The token stays in the URL only; the
// script reads it from there, so the page itself carries no secret.
func (h *Handler) enrollPage(w http.ResponseWriter, r *http.Request) {
	if !approverapi.ValidKey(r.PathValue("token"), maxTokenLen) {
		h.renderError(w, r, http.StatusNotFound)
		return
	}
	h.render(w, r, http.StatusOK, "enroll", h.base("enroll", "Set up your passkey"))
}

// maxHeadline is the most characters of a task's display text the
// approval page shows as its headline. An upstream tool's display text
// holds all its arguments (up to passkey.MaxDisplayText bytes): a file's
// whole content in large type would push the decision buttons screens
// down on a phone. The arguments are shown in full below it.
const maxHeadline = 240

// headline is s cut to maxHeadline characters, and whether it was cut.
func headline(s string) (string, bool) {
	if utf8.RuneCountInString(s) <= maxHeadline {
		return s, false
	}
	return strings.TrimRightFunc(string([]rune(s)[:maxHeadline]), unicode.IsSpace) + "…", true
}

type approvePage struct {
	pageBase
	DisplayText  string // at most maxHeadline characters (headline)
	LongDisplay  bool   // set in smaller type
	DisplayCut   bool   // DisplayText was shortened
	Tool         string
	Requester    string
	Reason       string
	State        string // the approval state, for data-state and CSS
	StatusClass  string
	StatusLabel  string
	Pending      bool
	ExpiresAt    string // RFC 3339, for the live countdown
	ExpiresLabel string
	TimeLeft     string
	Approved     int
	Needed       int
	Pips         []bool // one per approval needed, true when given
	Arguments    []argument
	Fingerprint  string
	ActionHash   string
	Outcome      *outcome // set once the approval is no longer pending
	Timeline     []step
	Identical    *identicalPanel // nil: no identical call, and the look-up worked
}

// identicalPanel lists the requester's identical calls (same tool, same
// action hash), looked up when the page is served.
type identicalPanel struct {
	Requester    string
	WarningTitle string
	Warning      string
	Calls        []identicalRow
}

// identicalRow is one identical call, as a step of the panel's list.
type identicalRow struct {
	Kind    string // bad (ran or may have run), current (not ended), muted
	Title   string
	Ref     string
	Detail  string
	At      string // RFC 3339: its end, or its creation while it runs
	AtLabel string
}

type argument struct {
	Name    string
	Value   string
	Long    bool   // folded in a <details>, with Preview as its summary
	Preview string // the first line, clipped
}

// outcome is the panel a decided approval shows instead of the buttons.
type outcome struct {
	Kind  string // ok, bad, muted: the panel's colour
	Title string
	Text  string
}

// step is one entry of the vertical timeline.
type step struct {
	Kind     string // done, ok, bad, warn, current, upcoming
	Title    string
	Detail   string
	At       string // RFC 3339, empty for steps still to come
	AtLabel  string
	Upcoming bool
}

var statusLabels = map[tasks.ApprovalState]string{
	tasks.ApprovalPending:   "Waiting for approval",
	tasks.ApprovalApproved:  "Approved, running now",
	tasks.ApprovalExecuted:  "Approved and done",
	tasks.ApprovalDenied:    "Denied",
	tasks.ApprovalExpired:   "Expired",
	tasks.ApprovalCancelled: "Cancelled",
	tasks.ApprovalFailed:    "Approved, but it failed",
}

// approvePage: GET /approve/{ref}. Everything an approver must read before
// deciding, server-rendered; the script drives the passkey ceremony and
// refreshes the live parts.
func (h *Handler) approvePage(w http.ResponseWriter, r *http.Request) {
	a, err := h.approvals.View(r.Context(), r.PathValue("ref")) // with the audit chain's timeline
	rec := a.Record
	if err != nil {
		if errors.Is(err, approvals.ErrNotFound) {
			h.renderError(w, r, http.StatusNotFound)
			return
		}
		h.log.ErrorContext(r.Context(), "web: approval page", "route", r.Pattern, "error", err)
		h.renderError(w, r, http.StatusInternalServerError)
		return
	}
	now := h.now()
	state := rec.ApprovalState
	if state == tasks.ApprovalPending && !now.Before(rec.ExpiresAt) {
		state = tasks.ApprovalExpired // the workflow will say so shortly
	}
	label, ok := statusLabels[state]
	if !ok {
		label = string(state)
	}
	display, cut := headline(rec.DisplayText)
	data := approvePage{
		DisplayText:  display,
		DisplayCut:   cut,
		pageBase:     h.base("approve", "Approve: "+rec.Tool),
		LongDisplay:  utf8.RuneCountInString(rec.DisplayText) > 90,
		Tool:         rec.Tool,
		Requester:    rec.Owner,
		Reason:       rec.Requirement.Reason,
		State:        string(state),
		StatusClass:  "state-" + string(state),
		StatusLabel:  label,
		Pending:      h.pending(rec),
		ExpiresAt:    rec.ExpiresAt.UTC().Format(time.RFC3339),
		ExpiresLabel: rec.ExpiresAt.UTC().Format("Mon 2 Jan 2006, 15:04 MST"),
		TimeLeft:     timeLeft(rec.ExpiresAt.Sub(now)),
		Approved:     rec.Approved(),
		Needed:       rec.Requirement.Quorum,
		Arguments:    arguments(rec.Arguments),
		Fingerprint:  fingerprint(rec.ActionHash),
		ActionHash:   rec.ActionHash,
		Timeline:     timeline(rec, state),
		Identical:    identical(rec.Owner, a.Identical),
	}
	for i := range max(data.Needed, data.Approved) {
		data.Pips = append(data.Pips, i < data.Approved)
	}
	if !data.Pending {
		data.Outcome = outcomeOf(rec, state)
	}
	h.render(w, r, http.StatusOK, "approve", data)
}

// identical is the panel of the requester's identical calls; nil when there
// are none to show.
func identical(requester string, ic tasks.IdenticalCalls) *identicalPanel {
	if len(ic.Calls) == 0 && !ic.Unknown {
		return nil
	}
	p := &identicalPanel{Requester: requester, Warning: ic.Warning()}
	switch {
	case ic.Unknown:
		p.WarningTitle = "Identical calls not checked"
	case ic.MayHaveRun():
		p.WarningTitle = "This call may already have run"
	}
	for _, c := range ic.Calls {
		row := identicalRow{Kind: "muted", Ref: c.Ref, Title: statusLabels[c.ApprovalState], Detail: "Ended: " + c.Outcome()}
		if row.Title == "" {
			row.Title = string(c.ApprovalState)
		}
		at := c.EndedAt
		if at.IsZero() {
			row.Kind, row.Detail, at = "current", "Not ended yet: "+c.Outcome(), c.CreatedAt
		}
		if c.MayHaveRun {
			row.Kind = "bad"
		}
		row.At, row.AtLabel = at.UTC().Format(time.RFC3339), at.UTC().Format("2 Jan 15:04:05 MST")
		p.Calls = append(p.Calls, row)
	}
	return p
}

// pending reports whether an approval can still take a decision, as far as
// the read model knows; the workflow has the last word.
func (h *Handler) pending(rec tasks.Record) bool {
	return rec.AwaitsApproval() && h.now().Before(rec.ExpiresAt)
}

// outcomeOf describes a decided approval for the panel that replaces the
// buttons.
func outcomeOf(rec tasks.Record, state tasks.ApprovalState) *outcome {
	final := lastEvent(rec)
	switch state {
	case tasks.ApprovalApproved:
		return &outcome{Kind: "ok", Title: "Approved", Text: "Enough approvers agreed. Policy is checked once more, then " + rec.Tool + " runs once."}
	case tasks.ApprovalExecuted:
		return &outcome{Kind: "ok", Title: "Approved and done", Text: rec.Tool + " ran once, with exactly the arguments shown here."}
	case tasks.ApprovalDenied:
		text := "The call did not run."
		if final.Kind == tasks.EventDenied && final.Text() != "" {
			text = sentence(final.Text()) + " The call did not run."
		}
		return &outcome{Kind: "bad", Title: "Denied", Text: text}
	case tasks.ApprovalExpired:
		return &outcome{Kind: "bad", Title: "Expired", Text: "Not enough approvers decided in time. The call did not run."}
	case tasks.ApprovalCancelled:
		return &outcome{Kind: "muted", Title: "Cancelled", Text: "The agent withdrew the request before it ran. The call did not run."}
	case tasks.ApprovalFailed:
		text := rec.Tool + " was started but reported an error or did not report back."
		if final.Text() != "" {
			text = sentence(final.Text())
		}
		return &outcome{Kind: "bad", Title: "Approved, but it failed", Text: text}
	}
	return &outcome{Kind: "muted", Title: "No longer waiting", Text: "This request is no longer waiting for a decision."}
}

// sentence ends s with a full stop unless it ends a sentence already (an
// approver's comment may or may not).
func sentence(s string) string {
	if strings.HasSuffix(s, ".") || strings.HasSuffix(s, "!") || strings.HasSuffix(s, "?") {
		return s
	}
	return s + "."
}

func lastEvent(rec tasks.Record) tasks.Event {
	if len(rec.Timeline) == 0 {
		return tasks.Event{}
	}
	return rec.Timeline[len(rec.Timeline)-1]
}

// refusals names, for the timeline, why the workflow refused a decision.
var refusals = map[string]string{
	passkey.ReasonChallengeConsumed:           "a confirmation was replayed",
	passkey.ReasonChallengeExpired:            "the confirmation had expired",
	passkey.ReasonChallengeUnknown:            "the confirmation was not recognised",
	passkey.ReasonChallengeWrongTask:          "the confirmation was for another request",
	passkey.ReasonChallengeWrongDecision:      "the confirmation was for the other decision",
	passkey.ReasonUnknownCredential:           "an unknown passkey was used",
	passkey.ReasonSignatureVerificationFailed: "a passkey signature did not verify",
	passkey.ReasonSignatureCounterRegression:  "a passkey looked cloned",
	passkey.ReasonArgumentHashMismatch:        "the confirmation did not match this call",
	passkey.ReasonApproverNotEligible:         "someone not eligible tried to decide",
	passkey.ReasonSelfApproval:                "the requester tried to approve their own call",
	passkey.ReasonCredentialRevoked:           "a revoked passkey was used",
	passkey.ReasonCredentialDisabled:          "a disabled passkey was used",
	passkey.ReasonApproverRevoked:             "a revoked approver tried to decide",
	passkey.ReasonApproverDisabled:            "a disabled approver tried to decide",
	tasks.ReasonAlreadyApproved:               "an approver tried to approve twice",
}

// timeline turns the read model's events into the steps of a vertical
// stepper: what happened, then what is still to come.
func timeline(rec tasks.Record, state tasks.ApprovalState) []step {
	var out []step
	claimed := false
	for _, e := range rec.Timeline {
		s := step{Kind: "done", At: e.At.UTC().Format(time.RFC3339), AtLabel: e.At.UTC().Format("2 Jan 15:04:05 MST")}
		switch e.Kind {
		case tasks.EventRequested:
			s.Title = "Requested by " + rec.Owner
			s.Detail = e.Text()
		case tasks.EventNotified:
			s.Title = "Approvers notified"
		case tasks.EventNotifyFailed:
			s.Kind, s.Title = "warn", "Notification failed"
			s.Detail = "Approvers can still decide through this page."
		case tasks.EventApproval:
			s.Kind, s.Title = "ok", upperFirst(e.Text())
		case tasks.EventRejectedDecision:
			reason := e.RejectionReason()
			s.Kind, s.Title = "warn", "A decision was refused"
			if text, ok := refusals[reason]; ok {
				s.Detail = upperFirst(text) + "; nothing changed."
			} else {
				s.Detail = "Reason: " + reason + "; nothing changed."
			}
		case tasks.EventClaimed:
			claimed = true
			s.Title = "Policy re-checked: allowed"
			s.Detail = "The call is claimed and runs once."
		case tasks.EventExecuted:
			s.Kind, s.Title, s.Detail = "ok", "Executed", e.Text()
		case tasks.EventExecutionError:
			s.Kind, s.Title, s.Detail = "bad", "Ran with an error", e.Text()
		case tasks.EventOutcomeUnknown:
			s.Kind, s.Title, s.Detail = "bad", "Outcome unknown", e.Text()
		case tasks.EventDenied:
			s.Kind, s.Title, s.Detail = "bad", "Denied", e.Text()
		case tasks.EventExpired:
			s.Kind, s.Title, s.Detail = "bad", "Expired", "No decision in time; the call did not run."
		case tasks.EventCancelled:
			s.Kind, s.Title, s.Detail = "muted", "Cancelled", e.Text()
		case tasks.EventFailed:
			s.Kind, s.Title, s.Detail = "bad", "Failed", e.Text()
		default:
			s.Title = upperFirst(strings.ReplaceAll(string(e.Kind), "-", " "))
			s.Detail = e.Text()
		}
		s.Detail = strings.ReplaceAll(s.Detail, rec.TaskID, "[task]")
		out = append(out, s)
	}
	// What is still to come.
	switch state {
	case tasks.ApprovalPending:
		left := rec.Requirement.Quorum - rec.Approved()
		title := "Waiting for 1 more approval"
		if left > 1 {
			title = fmt.Sprintf("Waiting for %d more approvals", left)
		}
		out = append(out,
			step{Kind: "current", Title: title, Detail: "Any eligible approver can decide with their passkey.", Upcoming: true},
			step{Kind: "upcoming", Title: "Policy re-checked", Upcoming: true},
			step{Kind: "upcoming", Title: "Run " + rec.Tool + " once", Upcoming: true})
	case tasks.ApprovalApproved:
		if !claimed {
			out = append(out, step{Kind: "current", Title: "Re-checking policy", Upcoming: true})
		}
		out = append(out, step{Kind: "upcoming", Title: "Run " + rec.Tool + " once", Upcoming: !claimed})
		if claimed {
			out[len(out)-1].Kind = "current"
			out[len(out)-1].Title = "Running " + rec.Tool
		}
	}
	return out
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToUpper(r)) + s[n:]
}

// static: GET /static/{file}. Links carry ?v=<content hash>; a request with
// the current hash may be cached for good, anything else revalidates.
func (h *Handler) static(w http.ResponseWriter, r *http.Request) {
	f, ok := h.pages.static[r.PathValue("file")]
	if !ok {
		h.renderError(w, r, http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", f.ctype)
	w.Header().Set("ETag", f.etag)
	if r.URL.Query().Get("v") == h.pages.version {
		w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
	} else {
		w.Header().Set("Cache-Control", "no-cache")
	}
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(f.body))
}

// arguments lists a call's top-level arguments, sorted by name, each value
// as indented JSON so that a string "100" and a number 100 look different.
func arguments(raw json.RawMessage) []argument {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	var obj map[string]json.RawMessage
	if raw[0] != '{' || json.Unmarshal(raw, &obj) != nil {
		return []argument{fold(argument{Name: "(arguments)", Value: prettyJSON(raw)})}
	}
	names := make([]string, 0, len(obj))
	for k := range obj {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make([]argument, 0, len(names))
	for _, k := range names {
		out = append(out, fold(argument{Name: k, Value: prettyJSON(obj[k])}))
	}
	return out
}

// Values longer than these are folded behind their first line.
const (
	foldChars = 160
	foldLines = 4
)

func fold(a argument) argument {
	if utf8.RuneCountInString(a.Value) <= foldChars && strings.Count(a.Value, "\n") < foldLines {
		return a
	}
	a.Long = true
	first, _, _ := strings.Cut(a.Value, "\n")
	if utf8.RuneCountInString(first) > 60 {
		first = string([]rune(first)[:60])
	}
	a.Preview = first + " …"
	return a
}

// prettyJSON re-encodes a value, indented, with its string escapes decoded
// (a "\u003c" shows as "<", a "\u202e" as the character, which reveal then
// makes visible) and numbers exactly as sent.
func prettyJSON(raw []byte) string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return string(raw)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return string(raw)
	}
	return strings.TrimSuffix(buf.String(), "\n")
}

// fingerprint shows the first 8 groups of 4 hex digits of the action hash,
// for comparison with the fingerprint in the notification.
func fingerprint(hash string) string {
	var groups []string
	for i := 0; i+4 <= len(hash) && len(groups) < 8; i += 4 {
		groups = append(groups, hash[i:i+4])
	}
	return strings.Join(groups, " ")
}

// timeLeft renders a duration for humans; the script keeps it current.
func timeLeft(d time.Duration) string {
	switch {
	case d <= 0:
		return "expired"
	case d < time.Minute:
		return "less than a minute"
	case d < time.Hour:
		return fmt.Sprintf("%d min", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%d h %d min", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%d days", int(d/(24*time.Hour)))
}

// reveal makes invisible and direction-changing characters visible (as
// <U+202E> and the like), so an argument cannot hide or reorder text on the
// page an approver trusts. Newlines and tabs stay.
func reveal(s string) string {
	if strings.IndexFunc(s, hidden) < 0 {
		return s
	}
	var b strings.Builder
	for _, r := range s {
		if hidden(r) {
			fmt.Fprintf(&b, "<U+%04X>", r)
			continue
		}
		b.WriteRune(r)
	}
	return b.String()
}

func hidden(r rune) bool {
	if r == '\n' || r == '\t' {
		return false
	}
	return unicode.Is(unicode.Cf, r) || unicode.IsControl(r) || unicode.Is(unicode.Zl, r) ||
		unicode.Is(unicode.Zp, r) || r == unicode.ReplacementChar
}
