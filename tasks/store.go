package tasks

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Sentinel errors.
var (
	ErrTaskNotFound = errors.New("tasks: task not found")
	ErrTaskExists   = errors.New("tasks: task already exists")
	ErrTerminal     = errors.New("tasks: task is terminal")
	// ErrExecutionClaimed: the task's execution was claimed before
	// ([Store.ClaimExecution]); its tool is not run again.
	ErrExecutionClaimed = errors.New("tasks: task's execution already claimed")
	// ErrPendingCapReached: the owner already holds as many pending
	// reservations as the cap allows (see [Store.ReservePending]).
	ErrPendingCapReached = errors.New("tasks: pending task cap reached")
)

// Bucket is the NATS KV bucket holding task records and their indexes.
const Bucket = "countersign_tasks"

// Key layout inside [Bucket]:
//
//	t.<taskID>            Record (JSON)
//	r.<approvalRef>       taskID
//	o.<owner>.<taskID>    the task's CreatedAt, RFC 3339 (every task of an
//	                      owner, for tasks/list; "" in keys written before
//	                      the index held it)
//	p.<owner>.<taskID>    reservation state (non-terminal tasks of an owner):
//	                      "held" (a pending-cap reservation), "releasing"
//	                      (its release is under way) or "" (indexed only)
//	n.<owner>             decimal count of the owner's pending reservations
//	d.<dedupKey>          taskID (the pending task for an identical call)
//
// <owner> is a hash of the principal so that any principal name is a safe key.
// The p and n keys together are the pending cap; doc.go states their
// invariant.
const casRetries = 16

// Values of a p.<owner>.<taskID> key.
const (
	pendingHeld      = "held"
	pendingReleasing = "releasing"
)

// counterRetries bounds the compare-and-set loop on an n.<owner> counter,
// which every reservation and release of that owner contends for.
const counterRetries = 256

// DefaultResultRetention is how long a finished task (and its result) stays
// readable after it ends, unless configured otherwise: the MCP endpoint adds
// it to a new task's TTL, and the Complete activity extends the TTL to cover
// it.
const DefaultResultRetention = 7 * 24 * time.Hour

// StoreOptions configures a [Store].
type StoreOptions struct {
	// Replicas of the bucket in a clustered NATS; 0 means 1.
	Replicas int
	Logger   *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Store keeps task records in NATS JetStream key-value, writing with
// compare-and-set so concurrent writers never lose an update.
type Store struct {
	kv jetstream.KeyValue
	// stream is the bucket's stream, for what the key-value API does not
	// offer: the retention sweep's bounded scan and its deletes that
	// leave no marker (retention.go).
	stream jetstream.Stream
	log    *slog.Logger
	now    func() time.Time
	// beforeRecordPurge, set by tests, runs in the sweep between a
	// record's index keys and the record itself.
	beforeRecordPurge func(Record)
}

// NewStore opens (creating if needed) the task bucket.
func NewStore(ctx context.Context, js jetstream.JetStream, opts StoreOptions) (*Store, error) {
	replicas := opts.Replicas
	if replicas == 0 {
		replicas = 1
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      Bucket,
		Description: "Countersign task read model",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("tasks: open bucket %s: %w", Bucket, err)
	}
	stream, err := js.Stream(ctx, "KV_"+Bucket)
	if err != nil {
		return nil, fmt.Errorf("tasks: open stream of bucket %s: %w", Bucket, err)
	}
	s := &Store{kv: kv, stream: stream, log: opts.Logger, now: opts.Now}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	return s, nil
}

// OwnerKey is the key-safe form of a principal.
func OwnerKey(principal string) string {
	sum := sha256.Sum256([]byte(principal))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:16]))
}

// DedupKey identifies "the same call from the same principal": the action
// hash already binds tool, canonical arguments and server.
func DedupKey(principal, actionHash string) string {
	sum := sha256.Sum256([]byte(principal + "\x00" + actionHash))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:20]))
}

// Create stores a new record and its indexes. It fails with [ErrTaskExists]
// if the ID is taken.
//
// The record and its indexes go out at once: one round trip to the store
// instead of two, on every gated call's path. Every reader of an index
// skips an entry whose record is missing, so an index written before its
// record, or left by a creation that failed, shows nothing; [Store.Delete]
// removes them. Should the ID be taken, the indexes this call wrote for it
// are dropped again unless they are the existing record's own.
func (s *Store) Create(ctx context.Context, r Record) error {
	if !ValidID(r.TaskID) {
		return fmt.Errorf("tasks: invalid task id %q", r.TaskID)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("tasks: encode: %w", err)
	}
	var indexErr error
	var wg sync.WaitGroup
	wg.Go(func() { indexErr = s.Index(ctx, r) })
	_, err = s.kv.Create(ctx, "t."+r.TaskID, b)
	wg.Wait()
	if errors.Is(err, jetstream.ErrKeyExists) {
		s.unindexTaken(ctx, r)
		return ErrTaskExists
	}
	if err != nil {
		return fmt.Errorf("tasks: create %s: %w", r.TaskID, err)
	}
	return indexErr
}

// unindexTaken drops the owner and reference index entries Create wrote
// for a record whose ID turned out to be taken, keeping those that are the
// existing record's own. (The pending key is the reservation's, and stays.)
func (s *Store) unindexTaken(ctx context.Context, r Record) {
	ctx = context.WithoutCancel(ctx)
	cur, err := s.Get(ctx, r.TaskID)
	if err != nil {
		s.log.Warn("tasks: read the record whose id was taken", "task_id", r.TaskID, "err", err)
		return
	}
	if cur.Owner != r.Owner {
		if err := s.kv.Delete(ctx, "o."+OwnerKey(r.Owner)+"."+r.TaskID); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("tasks: drop owner index", "task_id", r.TaskID, "err", err)
		}
		// A pending key without a value is an index entry, not a
		// reservation: Index may have just written it.
		k := pendingKey(OwnerKey(r.Owner), r.TaskID)
		if e, err := s.kv.Get(ctx, k); err == nil && len(e.Value()) == 0 {
			if err := s.kv.Delete(ctx, k, jetstream.LastRevision(e.Revision())); err != nil && !isCASConflict(err) && !errors.Is(err, jetstream.ErrKeyNotFound) {
				s.log.Warn("tasks: drop pending index", "task_id", r.TaskID, "err", err)
			}
		}
	}
	if k := callIndexKey(r); k != "" && k != callIndexKey(cur) {
		if err := s.kv.Delete(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("tasks: drop call index", "task_id", r.TaskID, "err", err)
		}
	}
	if r.ApprovalRef != "" && cur.ApprovalRef != r.ApprovalRef {
		if err := s.kv.Delete(ctx, "r."+r.ApprovalRef); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			s.log.Warn("tasks: drop approval ref index", "task_id", r.TaskID, "err", err)
		}
	}
}

// Index writes a record's indexes (owner, pending, approval reference, and
// identical calls).
// Create writes them after the record; Index again repairs what a crash in
// between left out, and changes nothing when they are there.
//
// The writes are independent of each other, so they go out at once: one
// round trip to the store instead of three, on every gated call's path.
func (s *Store) Index(ctx context.Context, r Record) error {
	owner := OwnerKey(r.Owner)
	var wg sync.WaitGroup
	var ownerErr, pendingErr, refErr, callErr error
	wg.Go(func() {
		if _, err := s.kv.Put(ctx, "o."+owner+"."+r.TaskID, []byte(indexStamp(r.CreatedAt))); err != nil {
			ownerErr = fmt.Errorf("tasks: index owner: %w", err)
		}
	})
	if k := callIndexKey(r); k != "" {
		wg.Go(func() {
			if _, err := s.kv.Put(ctx, k, []byte(indexStamp(r.CreatedAt))); err != nil {
				callErr = fmt.Errorf("tasks: index call: %w", err)
			}
		})
	}
	if !r.Status.Terminal() {
		// A reservation (ReservePending) already wrote the key; otherwise
		// the task is indexed without one.
		wg.Go(func() {
			if _, err := s.kv.Create(ctx, pendingKey(owner, r.TaskID), nil); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
				pendingErr = fmt.Errorf("tasks: index pending: %w", err)
			}
		})
	}
	if r.ApprovalRef != "" {
		wg.Go(func() {
			if _, err := s.kv.Put(ctx, "r."+r.ApprovalRef, []byte(r.TaskID)); err != nil {
				refErr = fmt.Errorf("tasks: index approval ref: %w", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(ownerErr, pendingErr, refErr, callErr)
}

// callIndexKey is r's entry in the index of identical calls: one prefix per
// owner and action hash ([DedupKey]), so [Store.IdenticalCalls] reads only
// the tasks of that one call. "" for a record without an action hash.
func callIndexKey(r Record) string {
	if r.ActionHash == "" {
		return ""
	}
	return callIndexPrefix(r.Owner, r.ActionHash) + r.TaskID
}

func callIndexPrefix(owner, actionHash string) string {
	return "h." + DedupKey(owner, actionHash) + "."
}

// Delete removes a record and its indexes, and gives back its pending
// reservation. It is used only to undo a creation whose workflow could not be
// started.
func (s *Store) Delete(ctx context.Context, r Record) error {
	owner := OwnerKey(r.Owner)
	var errs []error
	if err := s.ReleasePending(ctx, r.Owner, r.TaskID); err != nil {
		errs = append(errs, err)
	}
	for _, k := range []string{"o." + owner + "." + r.TaskID, "r." + r.ApprovalRef, callIndexKey(r), "t." + r.TaskID} {
		if k == "" || strings.HasSuffix(k, ".") {
			continue
		}
		if err := s.kv.Delete(ctx, k); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			errs = append(errs, err)
		}
	}
	if r.DedupKey != "" {
		s.ReleaseDedup(ctx, r.DedupKey, r.TaskID)
	}
	return errors.Join(errs...)
}

// DeleteUnstarted is [Store.Delete] for the record of a task whose workflow
// start failed: it deletes the record only while it is as that start left
// it (not ended, no workflow has written to it, and no resume has marked it
// since: StartAttemptAt equal to r's), by compare-and-set on the record's
// revision, and only then its indexes, reservation and dedup slot. A record
// a resume took over meanwhile is left to that resume's workflow. It
// reports whether it deleted the record.
func (s *Store) DeleteUnstarted(ctx context.Context, r Record) (bool, error) {
	cur, rev, err := s.get(ctx, r.TaskID)
	if errors.Is(err, ErrTaskNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if _, unconfirmed := cur.Unconfirmed(s.now()); cur.Status.Terminal() || !unconfirmed || !cur.StartAttemptAt.Equal(r.StartAttemptAt) {
		return false, nil
	}
	if err := s.kv.Delete(ctx, "t."+r.TaskID, jetstream.LastRevision(rev)); err != nil {
		if isCASConflict(err) {
			return false, nil
		}
		return false, fmt.Errorf("tasks: delete %s: %w", r.TaskID, err)
	}
	return true, s.Delete(ctx, cur)
}

// ClaimExecution takes the task record's execution fence for one execution
// attempt, named by claim (a token the attempt made for itself), right
// before its workflow runs the tool: by compare-and-set it marks the record
// (ExecutionClaimedAt, ExecutionClaim) if, and only if, the task has not
// ended and its execution was never claimed. The same claim taking it again
// succeeds: a write that committed but whose answer was lost, retried. It
// fails with [ErrTerminal] when the task has ended, [ErrTaskNotFound] when
// its record is gone, and [ErrExecutionClaimed] when another attempt
// claimed it; then the tool must not run.
//
// The workflow's own claim (package workflows) is what makes a task's call
// run once against its decisions and its cancel. This fence makes the
// record agree with it. A start whose client gave up (a deadline, a lost
// connection) can land on the Temporal server after the task was judged
// never started and failed, or, for a verified call, deleted: the
// judgement and this fence are compare-and-sets on the same record, so
// either the task is failed and its late workflow does not run the tool, or
// the workflow claimed it first and the judgement leaves it alone
// ([Record.Unconfirmed]). A second run of the same workflow ID (a reset, a
// resume racing a late start) finds the fence taken and does not run the
// tool twice.
func (s *Store) ClaimExecution(ctx context.Context, taskID, claim string) error {
	if claim == "" {
		return errors.New("tasks: an execution claim needs a token")
	}
	now := s.now().UTC()
	_, err := s.Update(ctx, taskID, func(r *Record) error {
		switch {
		case r.Status.Terminal():
			return ErrTerminal
		case r.ExecutionClaim == claim:
			return errSameClaim
		case !r.ExecutionClaimedAt.IsZero():
			return ErrExecutionClaimed
		}
		r.ExecutionClaimedAt, r.ExecutionClaim = now, claim
		return nil
	})
	if errors.Is(err, errSameClaim) {
		return nil
	}
	return err
}

// errSameClaim ends ClaimExecution's update with nothing to write: the
// fence is the caller's already.
var errSameClaim = errors.New("tasks: execution claimed by this claim already")

// Get returns a record by ID, whoever owns it.
func (s *Store) Get(ctx context.Context, taskID string) (Record, error) {
	r, _, err := s.get(ctx, taskID)
	return r, err
}

func (s *Store) get(ctx context.Context, taskID string) (Record, uint64, error) {
	if !ValidID(taskID) {
		return Record{}, 0, ErrTaskNotFound
	}
	e, err := s.kv.Get(ctx, "t."+taskID)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Record{}, 0, ErrTaskNotFound
		}
		return Record{}, 0, fmt.Errorf("tasks: get %s: %w", taskID, err)
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return Record{}, 0, fmt.Errorf("tasks: decode %s: %w", taskID, err)
	}
	return r, e.Revision(), nil
}

// GetOwned returns a record only to its owner; anyone else gets
// [ErrTaskNotFound], exactly as for an unknown task.
func (s *Store) GetOwned(ctx context.Context, taskID, owner string) (Record, error) {
	r, err := s.Get(ctx, taskID)
	if err != nil {
		return Record{}, err
	}
	if r.Owner != owner {
		return Record{}, ErrTaskNotFound
	}
	return r, nil
}

// ByRef returns the record an approval reference points to.
func (s *Store) ByRef(ctx context.Context, ref string) (Record, error) {
	if !ValidID(ref) {
		return Record{}, ErrTaskNotFound
	}
	e, err := s.kv.Get(ctx, "r."+ref)
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return Record{}, ErrTaskNotFound
		}
		return Record{}, fmt.Errorf("tasks: ref %s: %w", ref, err)
	}
	return s.Get(ctx, string(e.Value()))
}

// Update applies fn to the current record and writes it back with
// compare-and-set, retrying on conflict. fn must be a pure function of the
// record it is given. A record whose status is terminal cannot change status
// again: fn's change is refused with [ErrTerminal] unless it leaves the status
// as it was.
func (s *Store) Update(ctx context.Context, taskID string, fn func(*Record) error) (Record, error) {
	for range casRetries {
		cur, rev, err := s.get(ctx, taskID)
		if err != nil {
			return Record{}, err
		}
		next := cur
		next.Approvals = append([]ApprovalEntry(nil), cur.Approvals...)
		next.Timeline = append([]Event(nil), cur.Timeline...)
		if err := fn(&next); err != nil {
			return cur, err
		}
		if cur.Status.Terminal() && next.Status != cur.Status {
			return cur, ErrTerminal
		}
		next.TaskID, next.Owner = cur.TaskID, cur.Owner // identity is immutable
		next.LastUpdatedAt = s.now().UTC()
		b, err := json.Marshal(next)
		if err != nil {
			return cur, fmt.Errorf("tasks: encode: %w", err)
		}
		if _, err := s.kv.Update(ctx, "t."+taskID, b, rev); err != nil {
			if isCASConflict(err) {
				continue
			}
			return cur, fmt.Errorf("tasks: update %s: %w", taskID, err)
		}
		if next.Status.Terminal() && !cur.Status.Terminal() {
			s.retire(ctx, next)
		}
		return next, nil
	}
	return Record{}, fmt.Errorf("tasks: update %s: too much contention", taskID)
}

// retireTimeout bounds the index clean-up after a task ends.
const retireTimeout = 10 * time.Second

// retire gives back the pending reservation of a task that has just become
// terminal and drops the indexes it no longer needs. It runs once per task:
// only the writer whose compare-and-set made the record terminal calls it.
// Failures are logged: an unreleased reservation only makes the pending cap
// stricter until [Reconcile] recounts, and a stale dedup slot is detected as
// terminal and replaced.
func (s *Store) retire(ctx context.Context, r Record) {
	// The record is terminal now: its release must not die with the
	// caller's context (an activity's timeout, a request hung up).
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), retireTimeout)
	defer cancel()
	if err := s.ReleasePending(ctx, r.Owner, r.TaskID); err != nil {
		s.log.Warn("tasks: release pending reservation", "task_id", r.TaskID, "err", err)
	}
	if r.DedupKey != "" {
		s.ReleaseDedup(ctx, r.DedupKey, r.TaskID)
	}
}

func isCASConflict(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence {
		return true
	}
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)
}

// ClaimDedup reserves the dedup slot for taskID. If an identical call is
// already pending it returns that task's ID instead (and claims nothing).
func (s *Store) ClaimDedup(ctx context.Context, key, taskID string) (existing string, err error) {
	for range casRetries {
		_, err := s.kv.Create(ctx, "d."+key, []byte(taskID))
		if err == nil {
			return "", nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", fmt.Errorf("tasks: dedup: %w", err)
		}
		e, err := s.kv.Get(ctx, "d."+key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // released meanwhile
		}
		if err != nil {
			return "", fmt.Errorf("tasks: dedup: %w", err)
		}
		other := string(e.Value())
		r, err := s.Get(ctx, other)
		if err == nil && !r.Status.Terminal() && !r.Expired(s.now()) {
			return other, nil
		}
		// The holder is gone or finished: take the slot over.
		if _, err := s.kv.Update(ctx, "d."+key, []byte(taskID), e.Revision()); err == nil {
			return "", nil
		} else if !isCASConflict(err) {
			return "", fmt.Errorf("tasks: dedup: %w", err)
		}
	}
	return "", fmt.Errorf("tasks: dedup: too much contention")
}

// ReleaseDedup frees the dedup slot if taskID still holds it.
func (s *Store) ReleaseDedup(ctx context.Context, key, taskID string) {
	e, err := s.kv.Get(ctx, "d."+key)
	if err != nil || string(e.Value()) != taskID {
		return
	}
	if err := s.kv.Delete(ctx, "d."+key, jetstream.LastRevision(e.Revision())); err != nil && !isCASConflict(err) {
		s.log.Warn("tasks: release dedup", "task_id", taskID, "err", err)
	}
}

func pendingKey(owner, taskID string) string { return "p." + owner + "." + taskID }

// ReservePending takes one of owner's pending slots for taskID, before the
// task is created, or fails with [ErrPendingCapReached] when owner already
// holds limit of them. It costs a few key operations whatever the number of
// pending tasks: it writes the task's p key as "held", then raises the
// owner's n counter by compare-and-set, never past limit. The reservation is
// given back by [Store.ReleasePending]: by retire when the task becomes
// terminal, by [Store.Delete], or by the caller if the task is never
// created.
func (s *Store) ReservePending(ctx context.Context, owner, taskID string, limit int) error {
	return s.ReservePendingFrom(ctx, owner, taskID, limit, s.ReadPending(ctx, owner))
}

// PendingCount is an owner's pending counter as [Store.ReadPending] read
// it: the first guess of a reservation.
type PendingCount struct {
	n   int
	rev uint64
	err error
}

// ReadPending reads owner's pending counter for [Store.ReservePendingFrom].
// It only reads, so a caller may run it alongside its own first write (the
// MCP endpoint's dedup claim) and save a round trip to the store.
func (s *Store) ReadPending(ctx context.Context, owner string) PendingCount {
	n, rev, err := s.pendingCounter(ctx, OwnerKey(owner))
	return PendingCount{n: n, rev: rev, err: err}
}

// ReservePendingFrom is [Store.ReservePending] starting from read, a
// [Store.ReadPending] of the same owner made just before. A read that is no
// longer current costs a conflict and a fresh read, never a wrong count:
// the compare-and-set stays the authority.
func (s *Store) ReservePendingFrom(ctx context.Context, owner, taskID string, limit int, read PendingCount) error {
	if !ValidID(taskID) {
		return fmt.Errorf("tasks: invalid task id %q", taskID)
	}
	ok, k := OwnerKey(owner), pendingKey(OwnerKey(owner), taskID)
	// A caller already at the cap is refused with one read and no write,
	// so hammering at the cap leaves nothing in the bucket.
	if read.err == nil && read.n >= limit {
		return ErrPendingCapReached
	}
	// The read is the increment's first guess (one round trip fewer); a
	// conflict makes it read again.
	guess := &counterRead{n: read.n, rev: read.rev}
	if read.err != nil {
		guess = nil
	}
	rev, err := s.kv.Create(ctx, k, []byte(pendingHeld))
	if errors.Is(err, jetstream.ErrKeyExists) {
		// The task ID is already reserved: another open of the same task
		// (a derived ID, see approvals.Call.TaskID).
		return fmt.Errorf("tasks: reserve %s: %w", taskID, ErrTaskExists)
	}
	if err != nil {
		return fmt.Errorf("tasks: reserve %s: %w", taskID, err)
	}
	if err := s.addPendingFrom(ctx, ok, +1, limit, guess); err != nil {
		// Not counted, or not known to be: drop the key. Should the
		// increment have landed after all (an answer lost in transit),
		// the counter stays one too high until Reconcile recounts:
		// stricter, never looser.
		if derr := s.kv.Delete(context.WithoutCancel(ctx), k, jetstream.LastRevision(rev)); derr != nil && !isCASConflict(derr) {
			s.log.Warn("tasks: drop refused reservation", "task_id", taskID, "err", derr)
		}
		return err
	}
	return nil
}

// ReleasePending gives back the reservation of taskID, if it still holds
// one; a task indexed without a reservation just leaves the index. Any number
// of calls, concurrent or repeated, lower the counter at most once: the
// caller that turns the key from "held" to "releasing" by compare-and-set
// owns the decrement, and deletes the key after it.
func (s *Store) ReleasePending(ctx context.Context, owner, taskID string) error {
	ok, k := OwnerKey(owner), pendingKey(OwnerKey(owner), taskID)
	for range casRetries {
		e, err := s.kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("tasks: release %s: %w", taskID, err)
		}
		rev := e.Revision()
		switch string(e.Value()) {
		case pendingReleasing:
			return nil // another caller owns the decrement
		case pendingHeld:
			rev, err = s.kv.Update(ctx, k, []byte(pendingReleasing), rev)
			if isCASConflict(err) {
				continue
			}
			if err != nil {
				return fmt.Errorf("tasks: release %s: %w", taskID, err)
			}
			if err := s.addPending(ctx, ok, -1, 0); err != nil {
				return err // the key stays "releasing"; Reconcile recounts
			}
		}
		if err := s.kv.Delete(ctx, k, jetstream.LastRevision(rev)); err != nil && !isCASConflict(err) && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return fmt.Errorf("tasks: release %s: %w", taskID, err)
		}
		return nil
	}
	return fmt.Errorf("tasks: release %s: too much contention", taskID)
}

// PendingReserved returns owner's count of pending reservations: one key
// read.
func (s *Store) PendingReserved(ctx context.Context, owner string) (int, error) {
	n, _, err := s.pendingCounter(ctx, OwnerKey(owner))
	return n, err
}

// errCorruptCounter: an n.<owner> value that is not a count. Reservations
// and releases fail on it (the cap fails closed) until Reconcile recounts.
var errCorruptCounter = errors.New("tasks: pending counter is corrupt")

// pendingCounter reads n.<owner>; a missing counter is 0 at revision 0.
func (s *Store) pendingCounter(ctx context.Context, owner string) (int, uint64, error) {
	e, err := s.kv.Get(ctx, "n."+owner)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("tasks: pending counter: %w", err)
	}
	n, err := strconv.Atoi(string(e.Value()))
	if err != nil || n < 0 {
		return 0, e.Revision(), fmt.Errorf("%w: %q", errCorruptCounter, e.Value())
	}
	return n, e.Revision(), nil
}

// setPendingCounter writes n.<owner> by compare-and-set on rev (0: the key
// must not exist).
func (s *Store) setPendingCounter(ctx context.Context, owner string, n int, rev uint64) error {
	v := []byte(strconv.Itoa(n))
	var err error
	if rev == 0 {
		_, err = s.kv.Create(ctx, "n."+owner, v)
	} else {
		_, err = s.kv.Update(ctx, "n."+owner, v, rev)
	}
	return err
}

// addPending moves owner's counter by delta with compare-and-set, retrying
// with a jittered backoff on conflict. An increment that would pass limit
// fails with [ErrPendingCapReached]; a decrement stops at 0.
func (s *Store) addPending(ctx context.Context, owner string, delta, limit int) error {
	return s.addPendingFrom(ctx, owner, delta, limit, nil)
}

// counterRead is a pending counter's value and revision as last read.
type counterRead struct {
	n   int
	rev uint64
}

// addPendingFrom is addPending whose first compare-and-set starts from
// guess, when the caller has just read the counter, instead of reading it
// again.
func (s *Store) addPendingFrom(ctx context.Context, owner string, delta, limit int, guess *counterRead) error {
	for attempt := range counterRetries {
		if attempt > 0 {
			// Up to 50µs × attempt (capped at 5ms), so that contenders
			// spread out instead of colliding again.
			d := time.Duration(rand.Int64N(int64(min(attempt, 100)) * int64(50*time.Microsecond)))
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("tasks: pending counter: %w", ctx.Err())
			case <-t.C:
			}
		}
		var n int
		var rev uint64
		var err error
		if attempt == 0 && guess != nil {
			n, rev = guess.n, guess.rev
		} else if n, rev, err = s.pendingCounter(ctx, owner); err != nil {
			return err
		}
		next := max(n+delta, 0)
		if delta > 0 && next > limit {
			return ErrPendingCapReached
		}
		if next == n {
			return nil
		}
		err = s.setPendingCounter(ctx, owner, next, rev)
		if err == nil {
			return nil
		}
		if !isCASConflict(err) {
			return fmt.Errorf("tasks: pending counter: %w", err)
		}
	}
	return fmt.Errorf("tasks: pending counter: too much contention")
}

// PendingTotal is the sum of every owner's pending counter: the tasks of
// the whole deployment that hold a pending slot. It reads every counter
// (one key per owner that ever had a task) in one scan, so its cost grows
// with the number of owners, not of tasks; for metrics, read now and then.
func (s *Store) PendingTotal(ctx context.Context) (int, error) {
	entries, err := s.entries(ctx, "n.>")
	if err != nil {
		return 0, err
	}
	total := 0
	for _, e := range entries {
		n, err := strconv.Atoi(string(e.Value()))
		if err != nil || n < 0 {
			return 0, fmt.Errorf("tasks: pending counter %s: %w: %q", e.Key(), errCorruptCounter, e.Value())
		}
		total += n
	}
	return total, nil
}

// CountPending returns how many non-terminal tasks owner has, by listing
// the pending index: a scan, for tests and diagnostics. The pending cap uses
// [Store.ReservePending], which reads one counter.
func (s *Store) CountPending(ctx context.Context, owner string) (int, error) {
	keys, err := s.keys(ctx, "p."+OwnerKey(owner)+".>")
	return len(keys), err
}

func (s *Store) keys(ctx context.Context, filter string) ([]string, error) {
	lister, err := s.kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoKeysFound) {
			return nil, nil
		}
		return nil, fmt.Errorf("tasks: list keys: %w", err)
	}
	var out []string
	for k := range lister.Keys() {
		out = append(out, k)
	}
	return out, nil
}

// entries returns the current entries (key, value, revision, time) of the
// keys matching filter: a scan, for Reconcile.
func (s *Store) entries(ctx context.Context, filter string) ([]jetstream.KeyValueEntry, error) {
	w, err := s.kv.Watch(ctx, filter, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("tasks: scan %s: %w", filter, err)
	}
	defer func() { _ = w.Stop() }()
	var out []jetstream.KeyValueEntry
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("tasks: scan %s: watcher closed", filter)
			}
			if e == nil { // end of the current values
				return out, nil
			}
			out = append(out, e)
		}
	}
}

// ErrInvalidCursor: a [Store.List] cursor that is not one of the owner's
// tasks.
var ErrInvalidCursor = errors.New("tasks: invalid cursor")

// listReadSlack is how many records a [Store.List] page reads, at most,
// beyond the ones it returns: those it leaves out (expired, or an index
// entry whose record is gone).
const listReadSlack = 200

// List returns owner's tasks that have not expired (as [Record.Expired]
// says at the store's clock, the answer tasks/get gives), newest first, a
// page of at most limit at a time. cursor is the opaque value returned as
// next by the previous page ("" for the first; [ErrInvalidCursor] unless
// one of owner's tasks); next is "" after the last page.
//
// What a page costs: one scan of the owner's index (a key and a timestamp
// per task, no record), which orders the tasks by creation, then reads of
// the records from the cursor on, limit at a time and concurrently, until
// the page is full: at most limit+listReadSlack records, however many tasks
// the owner has. A page that reaches that bound before it is full ends
// there, shorter, and its next cursor goes on from the last task it read.
// The retention sweep keeps the index to the tasks that are live or
// recently expired (retention.go). An index entry written before the index
// held the creation time costs a read of its record, on every page; no
// such entry outlives its task's retention.
func (s *Store) List(ctx context.Context, owner, cursor string, limit int) (page []Record, next string, err error) {
	if limit <= 0 {
		limit = 50
	}
	slots, read, err := s.ownerIndex(ctx, owner)
	if err != nil {
		return nil, "", err
	}
	i := 0
	if cursor != "" {
		i = slices.IndexFunc(slots, func(sl indexSlot) bool { return sl.id == cursor }) + 1
		if i == 0 {
			return nil, "", ErrInvalidCursor
		}
	}
	now, budget := s.now(), limit+listReadSlack
	for i < len(slots) && len(page) < limit && budget > 0 {
		n := min(limit-len(page), budget, len(slots)-i)
		if err := s.readSlots(ctx, slots[i:i+n], read); err != nil {
			return nil, "", err
		}
		for _, sl := range slots[i : i+n] {
			if r, ok := read[sl.id]; ok && r.Owner == owner && !r.Expired(now) {
				page = append(page, r)
			}
		}
		i += n
		budget -= n
	}
	if i < len(slots) {
		next = slots[i-1].id
	}
	return page, next, nil
}

// MaxRecentReads bounds the records one [Store.Recent] reads.
const MaxRecentReads = 1000

// recentBatch is how many records [Store.Recent] reads before it hands
// them to its visitor.
const recentBatch = 50

// Recent calls visit with owner's tasks that have not expired and that
// either have not ended or ended (last written) at since or later, newest
// first (by creation), until visit returns false. It is the owner's walk
// through their recent tasks: countersign_pending's lists and the
// identical calls an approver is shown ([Store.IdenticalCalls]).
//
// What it costs: one scan of the owner's index, as a [Store.List] page,
// then reads of the records, newest first, recentBatch at a time and
// concurrently, until visit has had enough: at most [MaxRecentReads]
// records, however many tasks the owner has. A task past that bound is
// not visited. The index orders tasks by creation, and a task may end
// long after its creation (the approval TTL policy gives, up to a week by
// default), so no creation time ends the walk sooner.
func (s *Store) Recent(ctx context.Context, owner string, since time.Time, visit func(Record) bool) error {
	slots, read, err := s.ownerIndex(ctx, owner)
	if err != nil {
		return err
	}
	slots = slots[:min(len(slots), MaxRecentReads)]
	now := s.now()
	for i := 0; i < len(slots); i += recentBatch {
		batch := slots[i:min(i+recentBatch, len(slots))]
		if err := s.readSlots(ctx, batch, read); err != nil {
			return err
		}
		for _, sl := range batch {
			r, ok := read[sl.id]
			if !ok || r.Owner != owner || r.Expired(now) || r.Status.Terminal() && r.LastUpdatedAt.Before(since) {
				continue
			}
			if !visit(r) {
				return nil
			}
		}
	}
	return nil
}

// indexSlot is one task of an owner's index: its ID and creation time.
type indexSlot struct {
	id string
	at time.Time
}

// ownerIndex scans owner's index and returns their tasks newest first
// (by creation, then ID), with the records it read: those of index entries
// written before the index held the creation time, which only their
// records tell.
func (s *Store) ownerIndex(ctx context.Context, owner string) ([]indexSlot, map[string]Record, error) {
	return s.indexSlots(ctx, "o."+OwnerKey(owner)+".")
}

// indexSlots scans the index entries under prefix (each keyed prefix+task
// ID, valued with the task's creation time) and returns their tasks newest
// first (by creation, then ID), with the records it read: those of entries
// written before the index held the creation time, which only their
// records tell.
func (s *Store) indexSlots(ctx context.Context, prefix string) ([]indexSlot, map[string]Record, error) {
	entries, err := s.entries(ctx, prefix+">")
	if err != nil {
		return nil, nil, err
	}
	slots := make([]indexSlot, 0, len(entries))
	var legacy []string
	for _, e := range entries {
		k := e.Key()
		id := k[strings.LastIndexByte(k, '.')+1:]
		at, err := time.Parse(time.RFC3339Nano, string(e.Value()))
		if err != nil {
			legacy = append(legacy, id)
			continue
		}
		slots = append(slots, indexSlot{id: id, at: at})
	}
	read := make(map[string]Record, len(legacy))
	if err := s.readInto(ctx, legacy, read); err != nil {
		return nil, nil, err
	}
	for _, id := range legacy {
		if r, ok := read[id]; ok {
			slots = append(slots, indexSlot{id: id, at: r.CreatedAt})
		}
	}
	sort.Slice(slots, func(i, j int) bool {
		if !slots[i].at.Equal(slots[j].at) {
			return slots[i].at.After(slots[j].at)
		}
		return slots[i].id < slots[j].id
	})
	return slots, read, nil
}

// readSlots reads into read the records of slots it does not hold yet.
func (s *Store) readSlots(ctx context.Context, slots []indexSlot, read map[string]Record) error {
	var ids []string
	for _, sl := range slots {
		if _, ok := read[sl.id]; !ok {
			ids = append(ids, sl.id)
		}
	}
	return s.readInto(ctx, ids, read)
}

// readInto reads the records of ids concurrently ([Store.getMany]) into
// read; a record that is gone is left out.
func (s *Store) readInto(ctx context.Context, ids []string, read map[string]Record) error {
	got, errs := s.getMany(ctx, ids)
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrTaskNotFound):
		case err != nil:
			return err
		default:
			read[ids[i]] = got[i]
		}
	}
	return nil
}

// Pending returns every task that awaits approvers, oldest first, for the
// admin API.
func (s *Store) Pending(ctx context.Context) ([]Record, error) {
	return s.nonTerminal(ctx, Record.AwaitsApproval)
}

// nonTerminal returns the records of the pending index that keep says to
// keep, oldest first.
func (s *Store) nonTerminal(ctx context.Context, keep func(Record) bool) ([]Record, error) {
	recs, err := s.pendingRecords(ctx)
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, r := range recs {
		if keep(r) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CreatedAt.Before(out[j].CreatedAt) })
	return out, nil
}

// pendingRecords reads the records the pending index names, in no
// particular order; a task ID without a record (a reservation whose record
// was never written, or not yet) is skipped.
func (s *Store) pendingRecords(ctx context.Context) ([]Record, error) {
	keys, err := s.keys(ctx, "p.>")
	if err != nil {
		return nil, err
	}
	ids := make([]string, 0, len(keys))
	for _, k := range keys {
		ids = append(ids, k[strings.LastIndexByte(k, '.')+1:])
	}
	got, errs := s.getMany(ctx, ids)
	var recs []Record
	for i, err := range errs {
		switch {
		case errors.Is(err, ErrTaskNotFound):
		case err != nil:
			return nil, err
		default:
			recs = append(recs, got[i])
		}
	}
	return recs, nil
}

// readAhead is how many record reads getMany keeps in flight.
const readAhead = 32

// getMany reads the records of ids, readAhead at a time: the scans of the
// pending index read thousands of records, and one read at a time would
// cost a round trip, and a write and a read on each side of the
// connection, each. In flight together, the reads share the connection's
// writes and the store's. got[i] and errs[i] answer ids[i].
func (s *Store) getMany(ctx context.Context, ids []string) (got []Record, errs []error) {
	got, errs = make([]Record, len(ids)), make([]error, len(ids))
	next := make(chan int)
	var wg sync.WaitGroup
	for range min(readAhead, len(ids)) {
		wg.Go(func() {
			for i := range next {
				got[i], errs[i] = s.Get(ctx, ids[i])
			}
		})
	}
	for i := range ids {
		next <- i
	}
	close(next)
	wg.Wait()
	return got, errs
}

// WaitTerminal blocks until the task is terminal (or ctx ends) and returns
// its final record. Only the owner may wait on a task.
func (s *Store) WaitTerminal(ctx context.Context, taskID, owner string) (Record, error) {
	r, err := s.GetOwned(ctx, taskID, owner)
	if err != nil || r.Status.Terminal() {
		return r, err
	}
	w, err := s.kv.Watch(ctx, "t."+taskID, jetstream.UpdatesOnly())
	if err != nil {
		return Record{}, fmt.Errorf("tasks: watch %s: %w", taskID, err)
	}
	defer w.Stop()
	// Re-read after the watch is in place so a transition between the first
	// read and the watch is not missed.
	if r, err = s.GetOwned(ctx, taskID, owner); err != nil || r.Status.Terminal() {
		return r, err
	}
	for {
		select {
		case <-ctx.Done():
			return Record{}, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return Record{}, fmt.Errorf("tasks: watch %s closed", taskID)
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue
			}
			var r Record
			if err := json.Unmarshal(e.Value(), &r); err != nil {
				return Record{}, fmt.Errorf("tasks: decode %s: %w", taskID, err)
			}
			if r.Status.Terminal() {
				return r, nil
			}
		}
	}
}
