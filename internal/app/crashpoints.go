//go:build crashpoints

package app

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/countersign/countersign/activities"
)

// This file is compiled only into a crash-trial build
// (`go build -tags crashpoints ./cmd/countersign`), which internal/e2e
// TestCrashTrials makes and runs as `countersign dev`. A release binary has
// none of it: no code there reads these variables or sets
// activities.Activities.Crash.
//
//	COUNTERSIGN_CRASHPOINTS            "point=probability,…", e.g. "claim=0.5": at each armed
//	                                   point (activities.CrashPoints) the process, with that
//	                                   probability, kills itself (SIGKILL)
//	COUNTERSIGN_CRASHPOINTS_LOG        every point a task passes is appended to this file, one
//	                                   line "UNIXNANO POINT TASK_ID passed|fired", written before
//	                                   the process goes on (or dies): the trials count tool calls
//	                                   with it, which the idempotent demo ledger would hide
//	COUNTERSIGN_CRASHPOINTS_HEARTBEAT  Config.ExecuteHeartbeatTimeout (a duration), so a trial's
//	                                   dead worker is seen in seconds
const (
	crashPointsEnv          = "COUNTERSIGN_CRASHPOINTS"
	crashPointsLogEnv       = "COUNTERSIGN_CRASHPOINTS_LOG"
	crashPointsHeartbeatEnv = "COUNTERSIGN_CRASHPOINTS_HEARTBEAT"
)

// armCrashPoints reads the crash-trial variables: it sets
// cfg.ExecuteHeartbeatTimeout and returns the Crash hook (nil without
// COUNTERSIGN_CRASHPOINTS_LOG).
func armCrashPoints(cfg *Config) (func(activities.CrashPoint, string), error) {
	if v := os.Getenv(crashPointsHeartbeatEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return nil, fmt.Errorf("%s=%q: %v", crashPointsHeartbeatEnv, v, err)
		}
		cfg.ExecuteHeartbeatTimeout = d
	}
	probs, err := parseCrashPoints(os.Getenv(crashPointsEnv))
	if err != nil {
		return nil, err
	}
	logPath := os.Getenv(crashPointsLogEnv)
	if logPath == "" {
		if len(probs) > 0 {
			return nil, fmt.Errorf("%s needs %s", crashPointsEnv, crashPointsLogEnv)
		}
		return nil, nil
	}
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", crashPointsLogEnv, err)
	}
	var mu sync.Mutex
	return func(point activities.CrashPoint, taskID string) {
		mu.Lock()
		defer mu.Unlock()
		fire := rand.Float64() < probs[point]
		what := "passed"
		if fire {
			what = "fired"
		}
		// One write(2) per line: a SIGKILL cannot cut it, and the page
		// cache keeps it (only a host crash would lose it).
		_, _ = fmt.Fprintf(f, "%d %s %s %s\n", time.Now().UnixNano(), point, taskID, what)
		if fire {
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the lock stays held: nothing passes another point
		}
	}, nil
}

// parseCrashPoints parses COUNTERSIGN_CRASHPOINTS.
func parseCrashPoints(spec string) (map[activities.CrashPoint]float64, error) {
	out := map[activities.CrashPoint]float64{}
	for item := range strings.SplitSeq(spec, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		name, prob, ok := strings.Cut(item, "=")
		p, err := strconv.ParseFloat(prob, 64)
		known := false
		for _, n := range activities.CrashPoints {
			known = known || string(n) == name
		}
		if !ok || err != nil || p < 0 || p > 1 || !known {
			return nil, fmt.Errorf("%s: %q: want POINT=PROBABILITY with POINT one of %v and 0 <= PROBABILITY <= 1", crashPointsEnv, item, activities.CrashPoints)
		}
		out[activities.CrashPoint(name)] = p
	}
	return out, nil
}
