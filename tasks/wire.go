package tasks

import (
	"encoding/json"
	"time"
)

// Task is the SEP-2663 (2026-07-28) task object. ttlMs is a pointer because
// null means unlimited.
type Task struct {
	TaskID         string `json:"taskId"`
	Status         Status `json:"status"`
	StatusMessage  string `json:"statusMessage,omitempty"`
	CreatedAt      string `json:"createdAt"`
	LastUpdatedAt  string `json:"lastUpdatedAt"`
	TTLMs          *int64 `json:"ttlMs"`
	PollIntervalMs *int64 `json:"pollIntervalMs,omitempty"`
}

// DetailedTask is the SEP-2663 tasks/get payload: the task plus its result
// (completed) or error (failed).
type DetailedTask struct {
	Task
	Result json.RawMessage `json:"result,omitempty"`
	Error  *RPCError       `json:"error,omitempty"`
	// InputRequests: what an input_required task waits for.
	InputRequests map[string]json.RawMessage `json:"inputRequests,omitempty"`
}

// LegacyTask is the 2025-11-25 experimental task object (SEP-1686).
type LegacyTask struct {
	TaskID        string `json:"taskId"`
	Status        Status `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           *int64 `json:"ttl"`
	PollInterval  *int64 `json:"pollInterval,omitempty"`
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func millis(d time.Duration) *int64 {
	if d <= 0 {
		return nil
	}
	ms := d.Milliseconds()
	return &ms
}

// Wire returns the 2026-07-28 task object of r.
func (r Record) Wire() Task {
	return Task{
		TaskID:         r.TaskID,
		Status:         r.Status,
		StatusMessage:  r.StatusMessage,
		CreatedAt:      stamp(r.CreatedAt),
		LastUpdatedAt:  stamp(r.LastUpdatedAt),
		TTLMs:          millis(r.TTL),
		PollIntervalMs: millis(r.PollInterval),
	}
}

// WireDetailed returns the 2026-07-28 tasks/get payload of r.
func (r Record) WireDetailed() DetailedTask {
	d := DetailedTask{Task: r.Wire()}
	switch r.Status {
	case StatusInputRequired:
		d.InputRequests = r.InputRequests
	case StatusCompleted:
		d.Result = r.Result
	case StatusFailed:
		d.Error = r.Error
		if d.Error == nil {
			d.Error = &RPCError{Code: -32603, Message: "task failed"}
		}
	}
	return d
}

// Legacy returns the 2025-11-25 task object of r.
func (r Record) Legacy() LegacyTask {
	return LegacyTask{
		TaskID:        r.TaskID,
		Status:        r.Status,
		StatusMessage: r.StatusMessage,
		CreatedAt:     stamp(r.CreatedAt),
		LastUpdatedAt: stamp(r.LastUpdatedAt),
		TTL:           millis(r.TTL),
		PollInterval:  millis(r.PollInterval),
	}
}

// AwaitsApproval reports whether the task waits for approvers. A task run
// without approval (an allowed call on an asynchronous tool, quorum 0) never
// does, whatever its status.
func (r Record) AwaitsApproval() bool {
	return r.ApprovalState == ApprovalPending && r.Requirement.Quorum > 0 && !r.Status.Terminal()
}

// Expired reports whether the task outlived its TTL at now.
func (r Record) Expired(now time.Time) bool {
	return r.TTL > 0 && now.After(r.CreatedAt.Add(r.TTL))
}

// Approved is the number of accepted approve decisions the read model holds:
// the "approvals so far" every view shows.
func (r Record) Approved() (n int) {
	for _, a := range r.Approvals {
		if a.Decision == DecisionApprove {
			n++
		}
	}
	return n
}
