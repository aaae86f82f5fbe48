package oauth

import (
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// MetadataPath is the well-known path of the protected-resource metadata
// (RFC 9728 §3). For a resource with a path (/mcp) the document is also
// served at MetadataPath + that path, the URL the challenges name.
const MetadataPath = "/.well-known/oauth-protected-resource"

// Metadata is the protected-resource metadata document (RFC 9728 §2).
type Metadata struct {
	Resource               string   `json:"resource"`
	AuthorizationServers   []string `json:"authorization_servers"`
	ScopesSupported        []string `json:"scopes_supported,omitempty"`
	BearerMethodsSupported []string `json:"bearer_methods_supported"`
	ResourceName           string   `json:"resource_name,omitempty"`
	// Algorithms the resource accepts for access tokens' signatures.
	SigningAlgs []string `json:"resource_signing_alg_values_supported,omitempty"`
}

// Metadata is this resource's metadata document.
func (v *Verifier) Metadata() Metadata {
	return Metadata{
		Resource:               v.opts.Resource,
		AuthorizationServers:   []string{v.opts.Issuer},
		ScopesSupported:        v.opts.ScopesSupported,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "Countersign",
		SigningAlgs:            v.opts.Algorithms,
	}
}

// MetadataURL is the URL of the metadata document the challenges name:
// the well-known path inserted before the resource's path (RFC 9728 §3.1).
func (v *Verifier) MetadataURL() string {
	u, _ := url.Parse(v.opts.Resource) // checked by validate
	return u.Scheme + "://" + u.Host + MetadataPath + strings.TrimSuffix(u.EscapedPath(), "/")
}

// MetadataPaths are the paths the metadata document is served at: the
// bare well-known path and, for a resource with a path, the path-suffixed
// form.
func (v *Verifier) MetadataPaths() []string {
	u, _ := url.Parse(v.opts.Resource)
	paths := []string{MetadataPath}
	if p := strings.TrimSuffix(u.EscapedPath(), "/"); p != "" {
		paths = append(paths, MetadataPath+p)
	}
	return paths
}

// MetadataHandler serves the metadata document (GET and HEAD), to any
// origin: browser-based MCP clients read it too.
func (v *Verifier) MetadataHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		switch r.Method {
		case http.MethodGet, http.MethodHead:
		case http.MethodOptions:
			h.Set("Access-Control-Allow-Methods", "GET, HEAD, OPTIONS")
			w.WriteHeader(http.StatusNoContent)
			return
		default:
			h.Set("Allow", "GET, HEAD, OPTIONS")
			http.Error(w, "Method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.Set("Content-Type", "application/json")
		h.Set("Cache-Control", "public, max-age=300")
		if r.Method == http.MethodGet {
			_, _ = w.Write(v.metadata)
		}
	})
}

// Challenge is the answer to a request whose token is missing (err nil) or
// rejected (err from Verify, or any error for a token that is not an
// OAuth token at all): the HTTP status and the WWW-Authenticate value,
// which always names the metadata document (RFC 9728 §5.1) and, when the
// resource requires scopes, them (MCP "Scope Selection Strategy").
func (v *Verifier) Challenge(err error) (status int, header string) {
	params := []string{}
	status = http.StatusUnauthorized
	var e *Error
	switch {
	case err == nil:
	case errors.As(err, &e) && e.Code == CodeInsufficientScope:
		status = http.StatusForbidden
		params = append(params, param("error", CodeInsufficientScope))
		params = append(params, param("error_description", e.Description))
	case errors.As(err, &e):
		params = append(params, param("error", CodeInvalidToken))
		params = append(params, param("error_description", e.Description))
	default:
		params = append(params, param("error", CodeInvalidToken))
		params = append(params, param("error_description", "the access token is not valid"))
	}
	if len(v.opts.RequiredScopes) > 0 {
		params = append(params, param("scope", strings.Join(v.opts.RequiredScopes, " ")))
	}
	params = append(params, param("resource_metadata", v.MetadataURL()))
	return status, "Bearer " + strings.Join(params, ", ")
}

// param is one auth-param with a quoted value, reduced to the characters
// RFC 6750 §3 allows there.
func param(name, value string) string {
	var b strings.Builder
	for i := 0; i < len(value); i++ {
		c := value[i]
		if c >= 0x20 && c <= 0x7e && c != '"' && c != '\\' {
			b.WriteByte(c)
		}
	}
	return name + `="` + b.String() + `"`
}
