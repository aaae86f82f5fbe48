package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// The lean tasks/get path.
//
// tasks/get is what an agent sends most: every poll of every pending task.
// Through the SDK's stateless handler each one builds and tears down a
// server session and decodes the message several times over (go-sdk v1.8.0
// decodes through a Decoder that allocates a 32 KiB buffer per call), which
// made a poll cost ~1.6 ms of CPU for a few hundred bytes (docs/benchmarks.md).
// serveTaskGet answers the common case itself, with the same handler
// (taskHandler, tasksGet), the same caller facts and the same encoding as
// the SDK path, so the answer is byte for byte the one the SDK would give
// (TestLeanTaskGetMatchesSDK).
//
// It is an optimisation, never a second set of rules: it answers only a
// well-formed request that the SDK would hand to the handler unchanged and
// only when the handler succeeds. Anything else (an unusual header, a
// version mismatch, a key the SDK's case-sensitive decoder would read
// differently, a task that is not the caller's, an error) returns false and
// goes through the SDK exactly as before.

// maxLeanNesting bounds the brackets a lean request may hold: the SDK
// refuses messages nested deeper than 1,000 levels, and a request with
// fewer brackets than that cannot be.
const maxLeanNesting = 1000

// serveTaskGet answers a tasks/get without the SDK when it can, and
// reports whether it did.
func (s *Server) serveTaskGet(w http.ResponseWriter, r *http.Request, body []byte, facts *requestFacts) bool {
	if facts.method != "tasks/get" || facts.stream || !leanHeaders(r) ||
		bytes.Count(body, []byte("{"))+bytes.Count(body, []byte("[")) >= maxLeanNesting {
		return false
	}
	var msg map[string]json.RawMessage
	if json.Unmarshal(body, &msg) != nil || !exactKeys(msg, "jsonrpc", "id", "method", "params") {
		return false
	}
	id, ok := sdkID(msg["id"])
	if !ok {
		return false
	}
	p, metaVersion, ok := leanTaskParams(msg["params"])
	if !ok {
		return false
	}
	var caps *mcp.ClientCapabilities
	switch header := r.Header.Get(headerProtocolVersion); {
	case header == modernVersion:
		// 2026-07-28: the _meta version must equal the header, the method
		// header the body's (Mcp-Name was checked by inspect), and the
		// _meta client facts must be what the SDK accepts.
		if metaVersion != header || r.Header.Get("Mcp-Method") != facts.method {
			return false
		}
		if caps, ok = sdkClientMeta(p.Meta); !ok {
			return false
		}
	case metaVersion == "" && (header == "" || header < modernVersion && slices.Contains(mcp.SupportedProtocolVersions(), header)):
		// 2025-11-25 and before: no per-request version.
	default:
		return false
	}

	req := &mcp.ServerRequest[*taskParams]{Params: p}
	info := &callInfo{principal: facts.principal, subject: facts.subject, era: eraOf(req), httpCtx: facts.httpCtx}
	if info.era == tasks.Era2026 {
		// declaresTasks(req), from the capabilities decoded above (the
		// SDK's decoding of them allocates 32 KiB).
		_, info.tasksDeclared = caps.Extensions[tasks.ExtTasks]
	}
	ctx := context.WithValue(context.WithValue(r.Context(), factsKey{}, facts), callInfoKey{}, info)
	res, err := s.taskHandler(facts.method, s.tasksGet)(ctx, nil, p)
	if err != nil {
		return false // the SDK path answers the error as it always has
	}
	if info.era == tasks.Era2026 {
		// The SDK names the server in every 2026-07-28 result (SEP-2575).
		meta := res.GetMeta()
		if meta == nil {
			meta = map[string]any{}
		}
		if _, ok := meta[mcp.MetaKeyServerInfo]; !ok {
			meta[mcp.MetaKeyServerInfo] = s.impl
			res.SetMeta(meta)
		}
	}
	out, err := encodeResponse(id, res)
	if err != nil {
		return false
	}
	h := w.Header()
	h.Set("Cache-Control", "no-cache, no-transform")
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(out)
	s.leanGets.Add(1)
	return true
}

// leanHeaders reports whether the SDK's handler would accept the request's
// HTTP framing as it is: DNS-rebinding protection, Content-Type, Accept, no
// Last-Event-ID. Where in doubt it says no.
func leanHeaders(r *http.Request) bool {
	if local, ok := r.Context().Value(http.LocalAddrContextKey).(net.Addr); ok && local != nil &&
		isLoopback(local.String()) && !isLoopback(r.Host) {
		return false
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return false
	}
	if len(r.Header.Values("Last-Event-ID")) > 0 {
		return false
	}
	var jsonOK, streamOK bool
	for _, v := range r.Header.Values("Accept") {
		for part := range strings.SplitSeq(v, ",") {
			base, _, _ := strings.Cut(part, ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json":
				jsonOK = true
			case "text/event-stream":
				streamOK = true
			}
		}
	}
	return jsonOK && streamOK
}

// isLoopback reports whether a host (with or without a port) is localhost
// or a loopback address, as the SDK's DNS-rebinding check decides it.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = strings.Trim(addr, "[]")
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// sdkID returns a request id as the SDK's JSON-RPC layer keeps it (a
// string, or a number as an int64) for the answer, or false if the message
// is not a call the SDK would answer.
func sdkID(raw json.RawMessage) (any, bool) {
	var v any
	if len(raw) == 0 || json.Unmarshal(raw, &v) != nil {
		return nil, false
	}
	switch v := v.(type) {
	case string:
		return v, true
	case float64:
		return int64(v), true
	}
	return nil, false
}

// leanTaskParams decodes tasks/get params as the SDK would (taskParams),
// with the _meta protocol version. It says no to anything the SDK might
// read differently: params that are not an object, a taskId that is not
// a non-empty string, a _meta that is not an object, a version that is
// not a string.
func leanTaskParams(raw json.RawMessage) (*taskParams, string, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil || !exactKeys(m, "_meta", "taskId", "inputResponses") {
		return nil, "", false
	}
	p := &taskParams{}
	if json.Unmarshal(m["taskId"], &p.TaskID) != nil || p.TaskID == "" {
		return nil, "", false
	}
	if meta, ok := m["_meta"]; ok && !bytes.Equal(bytes.TrimSpace(meta), []byte("null")) {
		if json.Unmarshal(meta, &p.Meta) != nil || p.Meta == nil {
			return nil, "", false
		}
	}
	version := ""
	if v, ok := p.Meta[mcp.MetaKeyProtocolVersion]; ok {
		if version, ok = v.(string); !ok {
			return nil, "", false
		}
	}
	return p, version, true
}

// sdkClientMeta returns a 2026-07-28 request's _meta client capabilities
// if they (required) and its client info (optional) decode as the SDK
// decodes them before it calls a handler; a request it would refuse with
// -32602 is left to it.
func sdkClientMeta(meta mcp.Meta) (*mcp.ClientCapabilities, bool) {
	if v, ok := meta[mcp.MetaKeyClientInfo]; ok && (v == nil || !remarshals(v, &mcp.Implementation{})) {
		return nil, false
	}
	// The SDK's 2026-07-28 capabilities: the 2025 ones, with roots a
	// pointer.
	var caps struct {
		mcp.ClientCapabilities
		//lint:ignore SA1019 the SDK still decodes roots in 2026-07-28 capabilities (SEP-2577 deprecates, not removes, them); a request it refuses must not be answered here
		Roots *mcp.RootCapabilities `json:"roots,omitempty"`
	}
	if v, ok := meta[mcp.MetaKeyClientCapabilities]; !ok || v == nil || !remarshals(v, &caps) {
		return nil, false
	}
	return &caps.ClientCapabilities, true
}

// remarshals reports whether v, a decoded JSON value, decodes into out.
func remarshals(v, out any) bool {
	b, err := json.Marshal(v)
	return err == nil && json.Unmarshal(b, out) == nil
}

// encodeResponse encodes a JSON-RPC response as the SDK's JSON-RPC layer
// does: HTML characters unescaped, no trailing newline.
func encodeResponse(id any, res mcp.Result) ([]byte, error) {
	result, err := marshalUnescaped(res)
	if err != nil {
		return nil, err
	}
	return marshalUnescaped(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      any             `json:"id,omitempty"`
		Result  json.RawMessage `json:"result,omitempty"`
	}{"2.0", id, result})
}

func marshalUnescaped(v any) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
