// Package browsertest drives the approver site in a real headless Chromium
// against a real `countersign dev` (embedded Temporal and NATS, started in
// process), with the Chrome DevTools Protocol's WebAuthn virtual
// authenticator standing in for the approver's phone. Agent calls are raw
// MCP over HTTP.
//
// Chromium is required: the tests fail, never skip, when it is missing.
// Install it with `apt-get install -y chromium` (Debian) or point
// COUNTERSIGN_CHROMIUM at a Chrome or Chromium binary.
//
// UPDATE_SCREENSHOTS=1 rewrites docs/screenshots/*.png from the pages the
// tests visit; without it the tests write nothing to the tree.
package browsertest
