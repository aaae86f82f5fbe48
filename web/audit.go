package web

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/countersign/countersign/audit"
	"github.com/countersign/countersign/internal/approverapi"
)

var errAuditOff = notFound("the audit log is not available on this server")

type auditChain struct {
	TaskID  string            `json:"taskId"`
	Records []json.RawMessage `json:"records"`
}

// showAudit: GET /admin/v1/audit/{taskId} → 200 {taskId, records: [...]},
// the task's audit chain in order, each record exactly as signed.
func (h *Handler) showAudit(w http.ResponseWriter, r *http.Request) error {
	if h.audit == nil {
		return errAuditOff
	}
	id := r.PathValue("taskId")
	if !audit.ValidTaskID(id) {
		return badRequest("invalid task id")
	}
	lines, err := h.audit.Chain(r.Context(), id)
	switch {
	case errors.Is(err, audit.ErrNotFound):
		if strings.HasPrefix(id, "admin-") {
			// The listings name every agent's and approver's chain; one
			// added before additions were recorded has none until its
			// first disable, enable or revoke.
			return notFound("no audit records in chain " + id + ": an agent or approver added before Countersign recorded additions has none until its first disable, enable or revoke")
		}
		return notFound("no audit records for task " + id)
	case err != nil:
		return err
	}
	out := auditChain{TaskID: id, Records: make([]json.RawMessage, len(lines))}
	for i, l := range lines {
		out.Records[i] = l
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// exportAudit: GET /admin/v1/audit[?since=RFC3339] → 200 JSON Lines, one
// record per line, every chain that has a record at or after since (whole
// chains), each in order. A failure after the first line cuts the stream;
// the verifier then reports the unsealed chain.
func (h *Handler) exportAudit(w http.ResponseWriter, r *http.Request) error {
	if h.audit == nil {
		return errAuditOff
	}
	q := r.URL.Query()
	for k := range q {
		if k != "since" {
			return badRequest("unknown query parameter %q", approverapi.Clip(k))
		}
	}
	var since time.Time
	if s := q["since"]; len(s) > 1 {
		return badRequest("since must be given once")
	} else if len(s) == 1 && s[0] != "" {
		t, err := time.Parse(time.RFC3339, s[0])
		if err != nil {
			return badRequest("since must be an RFC 3339 time, such as 2026-01-02T15:04:05Z")
		}
		since = t
	}
	rc := http.NewResponseController(w)
	started := false
	n := 0
	err := h.audit.Export(r.Context(), since, func(line []byte) error {
		if !started {
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
			started = true
		}
		if _, err := w.Write(append(line, '\n')); err != nil {
			return err
		}
		if n++; n%100 == 0 {
			_ = rc.Flush()
		}
		return nil
	})
	if err != nil {
		if !started {
			return err
		}
		h.log.ErrorContext(r.Context(), "web: audit export cut short", "error", err)
		return nil
	}
	if !started {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
	}
	return nil
}
