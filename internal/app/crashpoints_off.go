//go:build !crashpoints

package app

import "github.com/countersign/countersign/activities"

// armCrashPoints: a release build has no crash points (crashpoints.go is
// compiled only with `-tags crashpoints`).
func armCrashPoints(*Config) (func(activities.CrashPoint, string), error) { return nil, nil }
