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
var pageNames = []string{"landing", "enroll", "approve", "error"}

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
	if status != http.StatusNotFound {
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
	if !validKey(r.PathValue("token"), maxTokenLen) {
		h.renderError(w, r, http.StatusNotFound)
		return
	}
	h.render(w, r, http.StatusOK, "enroll", h.base("enroll", "Set up your passkey"))
}

type approvePage struct {
	pageBase
	DisplayText  string
	Tool         string
	Requester    string
	Reason       string
	StatusClass  string
	StatusLabel  string
	Pending      bool
	ExpiresAt    string // RFC 3339, for the live countdown
	ExpiresLabel string
	TimeLeft     string
	Approved     int
	Needed       int
	Arguments    []argument
	Fingerprint  string
	ActionHash   string
	Decisions    []decisionLine
}

type argument struct {
	Name  string
	Value string
}

type decisionLine struct {
	Who      string
	Decision string // "approve" or "deny", for the CSS class
	Label    string
	At       string
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
// deciding, server-rendered; the script only drives the passkey ceremony.
func (h *Handler) approvePage(w http.ResponseWriter, r *http.Request) {
	rec, err := h.lookupRef(r.Context(), r.PathValue("ref"))
	if err != nil {
		if errors.Is(err, errApprovalNotFound) {
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
	data := approvePage{
		pageBase:     h.base("approve", "Approve: "+rec.Tool),
		DisplayText:  rec.DisplayText,
		Tool:         rec.Tool,
		Requester:    rec.Owner,
		Reason:       rec.Requirement.Reason,
		StatusClass:  "state-" + string(state),
		StatusLabel:  label,
		Pending:      h.pending(rec),
		ExpiresAt:    rec.ExpiresAt.UTC().Format(time.RFC3339),
		ExpiresLabel: rec.ExpiresAt.UTC().Format("Mon 2 Jan 2006, 15:04 MST"),
		TimeLeft:     timeLeft(rec.ExpiresAt.Sub(now)),
		Approved:     approvedCount(rec),
		Needed:       rec.Requirement.Quorum,
		Arguments:    arguments(rec.Arguments),
		Fingerprint:  fingerprint(rec.ActionHash),
		ActionHash:   rec.ActionHash,
	}
	for _, a := range rec.Approvals {
		label := "approved"
		if a.Decision != tasks.DecisionApprove {
			label = "denied"
		}
		data.Decisions = append(data.Decisions, decisionLine{Who: a.ApproverName, Decision: a.Decision,
			Label: label, At: a.At.UTC().Format("2 Jan 15:04 MST")})
	}
	h.render(w, r, http.StatusOK, "approve", data)
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
		return []argument{{Name: "(arguments)", Value: prettyJSON(raw)}}
	}
	names := make([]string, 0, len(obj))
	for k := range obj {
		names = append(names, k)
	}
	slices.Sort(names)
	out := make([]argument, 0, len(names))
	for _, k := range names {
		out = append(out, argument{Name: k, Value: prettyJSON(obj[k])})
	}
	return out
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
