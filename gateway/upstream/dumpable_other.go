//go:build !linux

package upstream

// undumpable does nothing outside Linux (see dumpable_linux.go).
func undumpable() error { return nil }
