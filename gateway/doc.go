// Package gateway holds the tool backends Countersign executes once a call is
// allowed: a registry of tools with their input schemas and describe
// functions, and, for `countersign dev`, demo tools over a durable ledger.
//
// # Invariants
//
//   - Arguments are validated against the tool's input schema before policy
//     sees them; they are never rewritten (no defaults), because the approver
//     signs the action hash of the arguments as received.
//   - [Registry.Execute] returns an error only when the outcome is unknown
//     (the backend could not be reached or did not answer). A tool that ran
//     and failed returns a result with IsError set.
//   - A tool's [Tool.Pin] names its source (an upstream's configured name, or
//     Countersign) and digests its endpoint and its input schema, never an
//     upstream's headers or environment. A held call's envelope carries the
//     pin of the tool it was made against, and its execution checks it
//     ([Registry.CheckPin], and again on the tool it runs: [Call.Pin]) so
//     as not to run it against another.
//   - Every execution carries an idempotency key (the task ID for approved
//     calls). Backends that honour it, like the demo ledger, apply one effect
//     per key however often they are called.
package gateway
