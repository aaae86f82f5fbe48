// Package abusetest holds HTTP-level regression tests for abuse of the
// serving process (slow request bodies, one agent starving another) against
// the real MCP endpoint and approver site, on an embedded NATS and a real
// loopback http.Server built like internal/app's. It starts no Temporal
// server (nothing it drives reaches a workflow), so it runs under -race;
// the same limits are exercised through the whole app in internal/app.
//
// The package has no non-test code besides this file.
package abusetest
