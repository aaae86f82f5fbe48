// Package e2e tests Countersign end to end: a real `countersign dev` (the
// embedded Temporal server on SQLite and embedded NATS with JetStream, on a
// temporary data dir), driven over HTTP through the MCP endpoint and the
// approver API, with software passkeys (virtualwebauthn) signing real
// WebAuthn assertions. Nothing is mocked.
package e2e
