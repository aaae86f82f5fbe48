// Package devstack runs an embedded, durable Temporal server for
// `countersign dev` and for tests that need a real Temporal server whose state
// survives a restart.
//
// It is for development and testing only. Production runs `countersign server`
// and `countersign worker` against a Temporal cluster or Temporal Cloud. This is
// the only package that may import go.temporal.io/server: linking the server
// costs ~40 s of cold build time, so other packages and test binaries stay small.
//
// # What runs
//
// One process hosts the four Temporal services (frontend, history, matching,
// worker) on fixed ports (loopback, except the frontend, which listens on
// Options.Host), with static membership
// (temporal.WithStaticHosts) instead of ringpop. All state lives in one SQLite
// file, DataDir/temporal.db, used for both the main store and visibility. The
// ports are chosen once and kept in DataDir/ports.json, so a restart comes back
// on the same addresses. With ringpop's random ports a signal after a restart
// took 52 s; with static hosts on fixed ports it takes a fraction of a second.
//
// On first start the schema is created in one SQLite transaction (a crash
// halfway leaves an empty file, and the next start sets it up again) and the
// namespace is registered with 7 days of retention. Later starts find the schema
// and leave it alone; registering the namespace again is a no-op.
//
// Only one Server may use a DataDir at a time: Start takes an flock on
// DataDir/temporal.lock and fails with ErrDataDirInUse if another server,
// in this process or another, holds it. A taken frontend port fails with
// ErrPortInUse; a taken internal port is replaced and ports.json rewritten,
// since only the frontend address is seen outside the process.
//
// # Access
//
// Every gRPC port (frontend and internode alike) requires mutual TLS 1.3.
// Start makes a CA (ECDSA P-256) and keeps it only in memory, with the server
// and client leaf certificates it issues (24 hours, reissued when less than 6
// hours are left; the CA lasts a year). Nothing is written to disk: nothing
// that outlives the process depends on the certificates, so each start makes
// new ones. Clients use Server.ClientTLS; a process that does not hold it
// (another local user, a browser-driven request, the temporal CLI) fails the
// handshake. The server gets the configurations through
// temporal.WithTLSConfigFactory and encryption.FixedTLSConfigProvider, the
// in-memory equivalent of config.RootTLS with base64 CertData/KeyData. The
// server certificate names TLSServerName, loopback and Options.Host, and
// ClientTLS verifies TLSServerName whatever address is dialled.
//
// # Durability
//
// SQLite always runs with journal_mode=WAL. Options.Synchronous picks the
// fsync policy:
//
//   - "FULL" (default): every commit is synced to disk before Temporal sees it
//     succeed. Acknowledged starts, updates and completions survive a process
//     crash and a power loss. p50 ~4–5 ms per workflow start and per Update
//     round trip on a 2-core machine.
//   - "NORMAL": the WAL is synced only at checkpoints. Acknowledged work
//     survives a process crash (kill -9, panic), but the last transactions
//     before a power loss or kernel crash can be lost; the file itself stays
//     consistent. p50 ~2.3–3.5 ms per start.
//
// # Tuning
//
// An untuned single-shard Temporal looks broken in ways that are really rate
// limits. Start sets these dynamic config values:
//
//   - history.{transfer,timer,visibility,outbound}ProcessorMaxPollRPS = 1000
//     (default 20: with one shard, work reached the worker at most ~20 times a
//     second and a workflow resumed ~47 ms after a signal);
//   - matching.numTaskqueueReadPartitions = matching.numTaskqueueWritePartitions
//     = 1 (default 4: a burst of starts built a backlog that drained at
//     29–57/s);
//   - system.enableEagerWorkflowStart, frontend.enableUpdateWorkflowExecution
//     and frontend.enableUpdateWorkflowExecutionAsyncAccepted = true (the
//     defaults in v1.32, pinned so an upgrade cannot silently turn them off);
//   - history.hostLevelCacheMaxSize = 2,000 (default 128,000 workflows'
//     mutable state: at 10,000 pending tasks it held them all in memory).
//
// Clients should start workflows with client.StartWorkflowOptions
// EnableEagerStart when a worker runs in the same process, and cap the
// process's sticky workflow cache (worker.SetStickyWorkflowCacheSize, e.g.
// 1,000) before Start: the server's own worker service creates the SDK's
// process-wide cache, whose size is fixed when it is created.
//
// Metrics, pprof and the frontend HTTP API are off. Temporal's own logs go to
// Options.Logger at warn level and above; while the server starts and after
// Stop begins, only errors pass (the services warn about each other's ports
// while they come up and go down).
//
// # Known limits
//
// Temporal's SQLite plugin keeps one connection per database open for the life
// of the process, even after Stop: restarting in the same process reuses it,
// and it is released when the process exits.
//
// A workflow whose workflow task was in flight when the process died resumes
// only after that task's timeout (10 s by default) on the next start. This
// is Temporal's behaviour, not the server's ports or membership.
package devstack
