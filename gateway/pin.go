package gateway

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"

	"github.com/countersign/countersign/internal/canon"
	"github.com/countersign/countersign/tasks"
)

// OwnSource is the source a pin names for Countersign's own tools.
const OwnSource = "countersign"

// Endpoint is where an upstream is reached: the URL of a Streamable HTTP
// upstream, or the command line (program and arguments) of a stdio one. It
// identifies the upstream in its tools' pins, so it never holds the headers
// or environment values an upstream is configured with: those carry
// secrets, and rotating a secret must not change a tool's identity.
type Endpoint struct {
	URL     string   `json:"url,omitempty"`
	Command []string `json:"command,omitempty"`
}

// Pin identifies the tool as it is served now, for a call's envelope
// (tasks.Envelope.ToolPin); [Registry.CheckPin] compares it with the tool
// served when the call is about to run. Its Origin is the SHA-256 of the
// JCS form of {"source","url","command","tool"}: the upstream's configured
// name (or [OwnSource]), its [Endpoint] and the tool's name there; its
// Schema the SHA-256 of the JCS form of the input schema (of the schema's
// bytes as they are, should JCS refuse them).
//
// A tool looked up in a [Registry] has its pin computed already.
func (t Tool) Pin() tasks.ToolPin {
	if t.pin != nil {
		return *t.pin
	}
	origin := struct {
		Source  string   `json:"source"`
		URL     string   `json:"url,omitempty"`
		Command []string `json:"command,omitempty"`
		Tool    string   `json:"tool"`
	}{Source: OwnSource, Tool: t.Name}
	if t.Upstream != "" {
		origin.Source, origin.URL, origin.Command, origin.Tool = t.Upstream, t.Endpoint.URL, t.Endpoint.Command, t.UpstreamTool
	}
	b, _ := json.Marshal(origin) // strings only: cannot fail
	return tasks.ToolPin{Source: origin.Source, Origin: digest(b), Schema: digest(t.InputSchema)}
}

// digest is the hex SHA-256 of the JCS form of raw, or of raw itself when
// JCS refuses it (a number out of range): the same bytes always give the
// same digest.
func digest(raw []byte) string {
	if c, err := canon.Canonicalize(raw); err == nil {
		raw = c
	}
	d := sha256.Sum256(raw)
	return hex.EncodeToString(d[:])
}

// ToolChangedError says how a tool differs from the pin a call was made
// with. Its message is safe to show to the caller and the approvers.
type ToolChangedError struct {
	Tool   string
	Reason string
}

func (e *ToolChangedError) Error() string {
	return fmt.Sprintf("The tool changed after the call was made: %s.", e.Reason)
}

// CheckPin reports whether the tool served as name now is the one pin
// identifies: nil if so, [ErrUnknownTool] if no tool has that name, and a
// [*ToolChangedError] naming what differs otherwise.
func (r *Registry) CheckPin(name string, pin tasks.ToolPin) error {
	e, ok := r.snap.Load().tools[name]
	if !ok {
		return ErrUnknownTool
	}
	return checkPin(name, e.tool, pin)
}

// checkPin is [Registry.CheckPin] for the tool t served as name.
func checkPin(name string, t Tool, pin tasks.ToolPin) error {
	now := t.Pin()
	var reason string
	switch {
	case now.Source != pin.Source:
		reason = fmt.Sprintf("%s was served by %s and is now served by %s", name, pinSource(pin.Source), pinSource(now.Source))
	case now.Origin != pin.Origin:
		reason = fmt.Sprintf("%s now serves %s from another endpoint (its URL or command changed)", pinSource(now.Source), name)
	case now.Schema != pin.Schema:
		reason = fmt.Sprintf("%s now serves %s with another input schema", pinSource(now.Source), name)
	default:
		return nil
	}
	return &ToolChangedError{Tool: name, Reason: reason}
}

// pinSource names a pin's source in a sentence.
func pinSource(s string) string {
	if s == OwnSource {
		return "Countersign itself"
	}
	return "upstream " + s
}
