//go:build !unix

package devstack

// lockDataDir is a no-op where flock is unavailable; the frontend port check
// still stops a second server that reuses ports.json.
func lockDataDir(string) (func(), error) { return func() {}, nil }
