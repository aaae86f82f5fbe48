package tasks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// RetentionGrace is how long a finished task's record is kept past the end
// of its retention (CreatedAt+TTL, when tasks/get starts to answer it
// expired) and past its last write, before [Store.Sweep] deletes it. Within
// it nothing can still need the record:
//
//   - The workflow's terminal write (activities.Complete through Publish)
//     is retried until it lands, each attempt bounded by 30 s; once it
//     has landed, only an attempt whose answer was lost writes the same end
//     again, within minutes. Any write restarts the grace.
//   - A late start of a workflow whose record was already failed
//     (approvals' start judgement, [Reconcile]) finds the record terminal,
//     or gone: [Store.ClaimExecution] refuses both, so the tool never runs,
//     and its writes change nothing ([Store.Update] never creates a
//     record).
//   - A verified call's task ID is derived from its challenge
//     (mcpserver), and the same signed call sent again re-opens the task
//     when its record is missing. The passkey challenges bucket forgets a
//     consumed challenge passkey.ChallengeRetention (48 h) after the
//     consume, which comes before the task's creation; from then on that
//     replay is challenge_unknown. The grace outlives it
//     (mcpserver TestRetentionGraceOutlivesChallenges).
//   - The reconciler and a resume touch only records that have not ended.
const RetentionGrace = 72 * time.Hour

// deletable reports whether the retention sweep may delete r at now: it
// has ended, its retention is over (it has expired, [Record.Expired]), and
// both the end of its retention and its last write are [RetentionGrace]
// old. A task that has not ended (whatever its TTL, its execution claimed
// or not) or has no TTL is never deleted.
func (r Record) deletable(now time.Time) bool {
	return r.Status.Terminal() && r.TTL > 0 &&
		now.Sub(later(r.CreatedAt.Add(r.TTL), r.LastUpdatedAt)) >= RetentionGrace
}

// kvPrefix is the stream subject prefix of the keys of [Bucket].
const kvPrefix = "$KV." + Bucket + "."

// kvOperation is the header that marks a key-value delete or purge marker.
const kvOperation = "KV-Operation"

// Sweep is what one [Store.Sweep] round did.
type Sweep struct {
	// Read counts the records (and delete markers) the round read.
	Read int
	// Deleted counts the records it deleted.
	Deleted int
	// Next is where the next round goes on (its from); 0 when this round
	// finished a pass over the records old enough to be deleted.
	Next uint64
}

// Sweep deletes, in one round, the records of finished tasks past their
// retention (deletable) together with their index keys, reading
// at most limit records. A pass is a series of rounds, each going on from
// the previous one's Next (0 for the first); the caller waits between
// passes.
//
// A round reads the records in the order of their last write (the order
// of the bucket's stream), from from on, and stops at the first one written
// less than [RetentionGrace] ago: every later one is younger, so a pass
// reads only the records old enough to be deleted, and a round at most
// limit of them, so it never floods the store.
//
// Deleting is idempotent and safe with other replicas sweeping at once.
// For each record: its pending reservation, should a crash have left one,
// is given back ([Store.ReleasePending]); then its index keys (owner,
// approval reference, dedup slot, pending) are deleted, each only while it
// still names the task; the record goes last, only if it is still at the
// revision read: a record written since (an Update racing the sweep) is
// left alone and indexed again ([Store.Index]). A crash midway leaves the
// record, which the next pass finds again. Keys are deleted by purging
// their subject up to the revision read, which leaves no delete marker
// behind, so the bucket does not grow by a marker per task either; the
// delete markers of records deleted otherwise ([Store.Delete]) go too.
//
// The audit chain is elsewhere (package audit, its own stream) and is
// never touched.
func (s *Store) Sweep(ctx context.Context, from uint64, limit int) (Sweep, error) {
	if limit <= 0 {
		return Sweep{}, fmt.Errorf("tasks: sweep limit %d must be positive", limit)
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{kvPrefix + "t.>"},
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: time.Minute,
	}
	if from > 0 {
		cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverByStartSequencePolicy, from
	}
	c, err := s.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return Sweep{}, fmt.Errorf("tasks: sweep: %w", err)
	}
	batch, err := c.FetchNoWait(limit)
	if err != nil {
		return Sweep{}, fmt.Errorf("tasks: sweep: %w", err)
	}
	now := s.now()
	var out Sweep
	var last, pending uint64
	young := false
	for m := range batch.Messages() {
		if young {
			continue // drain the batch
		}
		md, err := m.Metadata()
		if err != nil {
			return out, fmt.Errorf("tasks: sweep: %w", err)
		}
		if now.Sub(md.Timestamp) < RetentionGrace {
			young = true
			continue
		}
		out.Read++
		last, pending = md.Sequence.Stream, md.NumPending
		key := strings.TrimPrefix(m.Subject(), kvPrefix)
		if op := m.Headers().Get(kvOperation); op != "" {
			// A record deleted otherwise: its marker goes.
			if err := s.purgeUpTo(ctx, key, last); err != nil {
				return out, err
			}
			continue
		}
		var r Record
		if err := json.Unmarshal(m.Data(), &r); err != nil {
			s.log.Warn("tasks: sweep: undecodable record left alone", "key", key, "err", err)
			continue
		}
		if !r.deletable(now) || "t."+r.TaskID != key {
			continue
		}
		deleted, err := s.retireRecord(ctx, r, last)
		if err != nil {
			return out, err
		}
		if deleted {
			out.Deleted++
		}
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) {
		return out, fmt.Errorf("tasks: sweep: %w", err)
	}
	if !young && out.Read > 0 && pending > 0 {
		out.Next = last + 1
	}
	return out, nil
}

// retireRecord deletes r, read at revision rev, and its index keys (see
// [Store.Sweep]). It reports whether it deleted the record.
func (s *Store) retireRecord(ctx context.Context, r Record, rev uint64) (bool, error) {
	owner := OwnerKey(r.Owner)
	if err := s.ReleasePending(ctx, r.Owner, r.TaskID); err != nil {
		return false, err
	}
	index := []struct {
		key  string
		ours func(value []byte) bool // whether a value names this task
	}{
		{"o." + owner + "." + r.TaskID, func([]byte) bool { return true }},
		// Only a marker: a pending key with a value is a reservation
		// whose release (another sweeper's, Reconcile's) is under way.
		{pendingKey(owner, r.TaskID), func([]byte) bool { return false }},
		{"r." + r.ApprovalRef, func(v []byte) bool { return string(v) == r.TaskID }},
		{"d." + r.DedupKey, func(v []byte) bool { return string(v) == r.TaskID }},
		{callIndexKey(r), func([]byte) bool { return true }},
	}
	// The keys are independent of each other: one round trip for all.
	var wg sync.WaitGroup
	errs := make([]error, len(index))
	for i, ix := range index {
		if ix.key == "" || strings.HasSuffix(ix.key, ".") {
			continue // no approval reference, dedup slot or action hash
		}
		wg.Go(func() { errs[i] = s.dropKey(ctx, ix.key, ix.ours) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	if s.beforeRecordPurge != nil {
		s.beforeRecordPurge(r)
	}
	if err := s.purgeUpTo(ctx, "t."+r.TaskID, rev); err != nil {
		return false, err
	}
	cur, err := s.Get(ctx, r.TaskID)
	if errors.Is(err, ErrTaskNotFound) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	// Written since it was read: it stays, with its indexes.
	return false, s.Index(ctx, cur)
}

// dropKey deletes key if its last message is a delete marker, or a value
// ours says names the task being deleted, by purging its subject up to
// that message: a value written since stays.
func (s *Store) dropKey(ctx context.Context, key string, ours func([]byte) bool) error {
	m, err := s.stream.GetLastMsgForSubject(ctx, kvPrefix+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("tasks: sweep: read %s: %w", key, err)
	}
	if m.Header.Get(kvOperation) == "" && !ours(m.Data) {
		return nil
	}
	return s.purgeUpTo(ctx, key, m.Sequence)
}

// purgeUpTo removes key's messages up to and including revision rev,
// leaving no marker: a compare-and-delete, since a later revision stays.
func (s *Store) purgeUpTo(ctx context.Context, key string, rev uint64) error {
	err := s.stream.Purge(ctx, jetstream.WithPurgeSubject(kvPrefix+key), jetstream.WithPurgeSequence(rev+1))
	if err != nil {
		return fmt.Errorf("tasks: sweep: delete %s: %w", key, err)
	}
	return nil
}

// indexStamp is the value of a task's owner index key: its creation time,
// by which [Store.List] orders without reading the record.
func indexStamp(createdAt time.Time) string {
	return createdAt.UTC().Format(time.RFC3339Nano)
}
