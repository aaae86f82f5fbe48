package tasks

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Identical calls: what an approver is shown of the requester's other
// tasks for the very call they are asked to approve. An agent that made a
// call, never got its answer (it hung up during an inline wait, its client
// timed out) and made it again opens a second approval once the first has
// ended (the dedup slot joins only a pending one); approving the second
// runs the call twice. The agent can see its ended calls
// (countersign_pending), but a misled agent will not look: the approver
// is the last line. Nothing here changes a decision; it is information.
const (
	// IdenticalWindow is how long after its end an identical call is
	// listed; one that has not ended is always listed.
	IdenticalWindow = 24 * time.Hour
	// MaxIdenticalCalls bounds the identical calls listed.
	MaxIdenticalCalls = 10
)

// IdenticalCall is another task of the same owner for the same call: the
// same tool and the same action hash, so the same arguments for the same
// server. It names the task by its approval reference, the approvers'
// handle, never by its task ID (the agent's).
type IdenticalCall struct {
	Ref           string
	Status        Status
	Disposition   Disposition
	ApprovalState ApprovalState
	CreatedAt     time.Time
	// EndedAt is when the task ended (its last write); zero while it has
	// not.
	EndedAt time.Time
	// MayHaveRun: the call ran (approved-executed, execution-error), may
	// have run (outcome-unknown), or runs or may run without any further
	// approval (a task approved or verified that has not ended, or whose
	// execution was claimed).
	MayHaveRun bool
}

// identicalCall summarizes r for approvers.
func identicalCall(r Record) IdenticalCall {
	c := IdenticalCall{Ref: r.ApprovalRef, Status: r.Status, Disposition: r.Disposition,
		ApprovalState: r.ApprovalState, CreatedAt: r.CreatedAt}
	if r.Status.Terminal() {
		c.EndedAt = r.LastUpdatedAt
	}
	switch {
	case r.Disposition == ApprovedExecuted, r.Disposition == ExecutionError, r.Disposition == OutcomeUnknown:
		c.MayHaveRun = true
	case !r.Status.Terminal():
		c.MayHaveRun = !r.ExecutionClaimedAt.IsZero() || !r.AwaitsApproval()
	}
	return c
}

// Outcome says in one word how the call stands: its disposition once it
// has one, else its status once it ended (cancelled, failed), else its
// approval state (pending, approved).
func (c IdenticalCall) Outcome() string {
	switch {
	case c.Disposition != "":
		return string(c.Disposition)
	case c.Status.Terminal():
		return string(c.Status)
	}
	return string(c.ApprovalState)
}

// IdenticalCalls is what an approver is shown of a task's identical calls
// ([Store.IdenticalCalls]).
type IdenticalCalls struct {
	// Calls are the identical calls, newest first.
	Calls []IdenticalCall
	// Unknown: the look-up failed, so Calls says nothing.
	Unknown bool
}

// MayHaveRun reports whether one of the calls ran or may have run.
func (ic IdenticalCalls) MayHaveRun() bool {
	for _, c := range ic.Calls {
		if c.MayHaveRun {
			return true
		}
	}
	return false
}

// Warning is the line every view puts above the list: the words for an
// identical call that ran or may have run, or for a look-up that failed;
// "" otherwise.
func (ic IdenticalCalls) Warning() string {
	switch {
	case ic.Unknown:
		return "Countersign could not check whether this requester already made this same call: approve only if you know it did not run before."
	case ic.MayHaveRun():
		return "An identical call from this requester (same tool, same arguments) already ran or may have run. If you approve, it runs again."
	}
	return ""
}

// maxIdenticalReads bounds the records one [Store.IdenticalCalls] reads:
// an agent that made one call thousands of times costs no more than this.
const maxIdenticalReads = 200

// IdenticalCalls returns r's identical calls: the other tasks of r's owner
// with r's tool and action hash that have not ended or ended within
// [IdenticalWindow], newest first, at most [MaxIdenticalCalls]. It scans
// the index of that one call (owner and action hash, written at creation
// by [Store.Index]) and reads at most maxIdenticalReads of its records,
// newest first: its cost follows the times the call was made, not how many
// tasks the owner has. A task created before this index existed (by a
// version without it) is not in it, and not listed. On an error it returns
// the error and Unknown set, for the caller to show.
func (s *Store) IdenticalCalls(ctx context.Context, r Record) (IdenticalCalls, error) {
	var out IdenticalCalls
	if r.ActionHash == "" {
		return out, nil
	}
	fail := func(err error) (IdenticalCalls, error) {
		return IdenticalCalls{Unknown: true}, fmt.Errorf("tasks: identical calls of %s: %w", r.TaskID, err)
	}
	slots, read, err := s.indexSlots(ctx, callIndexPrefix(r.Owner, r.ActionHash))
	if err != nil {
		return fail(err)
	}
	slots = slices.DeleteFunc(slots, func(sl indexSlot) bool { return sl.id == r.TaskID })
	slots = slots[:min(len(slots), maxIdenticalReads)]
	now := s.now()
	since := now.Add(-IdenticalWindow)
	for i := 0; i < len(slots) && len(out.Calls) < MaxIdenticalCalls; i += MaxIdenticalCalls {
		batch := slots[i:min(i+MaxIdenticalCalls, len(slots))]
		if err := s.readSlots(ctx, batch, read); err != nil {
			return fail(err)
		}
		for _, sl := range batch {
			o, ok := read[sl.id]
			switch {
			case !ok, o.Owner != r.Owner, o.Tool != r.Tool, o.ActionHash != r.ActionHash, o.Expired(now),
				o.Status.Terminal() && o.LastUpdatedAt.Before(since):
				continue
			}
			if len(out.Calls) < MaxIdenticalCalls {
				out.Calls = append(out.Calls, identicalCall(o))
			}
		}
	}
	return out, nil
}
