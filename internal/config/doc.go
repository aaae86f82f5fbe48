// Package config loads Countersign's YAML configuration file.
//
// # File format
//
// The file is one YAML mapping. Every top-level key is a section: upstreams,
// demo_tools and inline_wait below; the process settings addr, data_dir,
// audit_key_dir, public_url, server_id, log_level and policy (settings.go); and the
// sections temporal (temporal.go), nats (nats.go), slack (slack.go),
// limits (limits.go) and oauth (oauth.go), each documented on its type. Every setting but
// upstreams and demo_tools is the file's form of a command-line flag;
// internal/app applies the file under the rule flag > environment variable >
// file > default (app.Config.ApplyFile). Relative paths are relative to the
// file's directory. An empty file (or one holding only comments) is a valid,
// empty configuration. A key with an empty or null value is the same as an
// absent key.
//
//	upstreams:
//	  - name: fs                     # required; [a-z0-9-]{1,32}, unique
//	    command: ["npx", "-y", "@modelcontextprotocol/server-filesystem", "/srv/data"]
//	    env: {LOG_LEVEL: info}       # optional, stdio only
//	    prefix: files                # optional; default: the name
//	    approval: policy             # optional: always | never | policy (default)
//	  - name: everything
//	    url: http://127.0.0.1:3001/mcp
//	    headers: {Authorization: "Bearer ${EVERYTHING_TOKEN}"}   # optional, HTTP only
//	    timeout: 30s                 # optional; per call, default 60s
//	    required: true               # optional; default false: down fails /readyz
//	demo_tools: true                 # optional; default: true in dev, false in server
//	inline_wait: 20s                 # optional; default 0s
//
// upstreams lists the MCP servers whose tools Countersign fronts. Each entry
// has:
//
//   - name: the upstream's identifier, 1 to 32 characters of a-z, 0-9 and
//     "-"; unique in the file.
//   - command: a stdio upstream, started as a child process; a non-empty list
//     of strings (program, then arguments; no shell is involved). A program
//     given as a relative path (one with a "/", like ./server.sh) is
//     relative to the file's directory; a bare name (npx) is looked up in
//     PATH. Arguments are passed as written, and the child runs in
//     Countersign's working directory.
//   - url: a Streamable HTTP upstream; an http or https URL with a host and
//     without user:password (put credentials in headers).
//   - env: environment variables for a command upstream (string to
//     string). Only with command. The child does not inherit Countersign's
//     environment: it sees only PATH, HOME, USER, LOGNAME, LANG, LC_ALL,
//     LC_CTYPE, TZ, TMPDIR, SHELL and TERM (those that are set) plus env,
//     which overrides them. Pass anything else explicitly, e.g.
//     {HTTPS_PROXY: "${HTTPS_PROXY}"}.
//   - headers: extra HTTP request headers for a url upstream (string to
//     string). Only with url. Host, Content-Length, Content-Type,
//     Mcp-Session-Id and Mcp-Protocol-Version are set by the transport and
//     may not be given. Redirects are not followed, so the headers go to
//     the url only.
//   - prefix: the upstream's tools appear to agents as <prefix>__<tool> (see
//     [ToolName]); same character set as name; default the name; prefixes
//     are unique in the file.
//   - timeout: the limit for one tool call, a Go duration ("30s", "2m")
//     greater than 0 and at most 5m ([MaxTimeout], the limit on an approved
//     call's execution, claim included); default 60s.
//   - approval: always (every call needs a human approval), never (calls
//     pass through without approval) or policy (the policy decides;
//     the default).
//   - required: true or false (the default). By default an upstream that is
//     down is named in /readyz's body but does not fail readiness: the
//     other tools keep serving. With required: true its being down makes
//     /readyz answer 503, for a deployment where a replica without that
//     upstream is useless.
//
// Exactly one of command and url must be given.
//
// demo_tools turns the five built-in demo tools on or off. When absent the
// command decides: on in dev, off in server (see [File.DemoToolsOr]).
//
// inline_wait is how long a gated tools/call from a client that does not
// speak MCP tasks is held for the approval decision before it answers
// [approval-pending] (a Go duration from 0s to 10m; default 0s, answer at
// once). --inline-wait (or COUNTERSIGN_INLINE_WAIT), when given, wins over it.
//
// # Secrets
//
// Values of env and headers may refer to secrets instead of holding them;
// the references are resolved when the file is loaded:
//
//   - ${NAME} is replaced by the environment variable NAME
//     ([A-Za-z_][A-Za-z0-9_]*). It may be the whole value or part of it, as
//     in "Bearer ${TOKEN}". An unset variable is an error; a variable set to
//     the empty string expands to nothing.
//   - ${file:/path/to/secret} is replaced by the content of the file, with
//     trailing newlines removed (at most 64 KiB). A relative path is relative
//     to the directory of the configuration file. A missing or unreadable
//     file is an error.
//   - $${ stands for a literal "${". Any other "$" is literal; a "$"
//     followed by a name ($TOKEN) loads with a warning (File.Warnings),
//     as does a credential written inline (a value without ${…} under
//     Authorization, Proxy-Authorization, Cookie, or a name holding token,
//     secret, password, passwd, apikey, api-key, api_key or credential).
//
// Inside a flow mapping ({…}) a value holding ${…} must be quoted, as in
// the example above; YAML reads an unquoted { there as the start of a
// mapping.
//
// References are resolved only in secrets: env and header values,
// temporal.api_key, slack.token and slack.signing_secret; nowhere else.
// Error messages name the variable or file, never a value, and the printed
// forms of a loaded configuration ([File.String], [Upstream.String],
// [Temporal.String], [Slack.String], their JSON and log/slog forms,
// [File.Redacted]) show the secrets' names with the value "<redacted>".
//
// # Errors
//
// The file is checked as a whole: [Load] reports every problem it finds, not
// only the first, as one [*Error] whose message has a line per problem in
// the form "path:line: field: problem", for example
//
//	countersign.yaml:7: upstreams[1].timeout: must be at most 5m0s, the limit on an approved call's execution, not 2h0m0s
//	countersign.yaml:9: upstreams[1].tiemout: unknown field (known: name, command, url, env, headers, prefix, timeout, approval, required)
//
// Unknown and duplicate keys are errors.
package config
