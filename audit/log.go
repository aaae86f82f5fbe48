package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream and subjects.
const (
	StreamName    = "COUNTERSIGN_AUDIT"
	SubjectPrefix = "countersign.audit."
)

// MaxChainLen bounds one task's chain. The workflow bounds the decisions it
// takes, so an honest chain stays far below.
const MaxChainLen = 1000

// Errors.
var (
	// ErrSealed: the task's chain already ends with its outcome.
	ErrSealed = errors.New("audit: chain is sealed by its outcome")
	// ErrNotFound: no record for the task.
	ErrNotFound = errors.New("audit: no records for the task")
	// ErrReadOnly: the log has no signing keys.
	ErrReadOnly = errors.New("audit: log has no signing keys")
	// ErrInvalidTaskID: the task ID cannot name a subject.
	ErrInvalidTaskID = errors.New("audit: invalid task id")
	// ErrBrokenChain: the step cannot follow what the chain holds (no
	// requested record, a full chain, no terminal step to seal). Retrying
	// does not help; the verifier will report the chain.
	ErrBrokenChain = errors.New("audit: broken chain")
)

// Options configures a [Log].
type Options struct {
	// Keys signs new records; nil opens the log read-only (an HTTP-only
	// server, which never writes records).
	Keys *Keyring
	// Redact records a digest of the arguments instead of the arguments.
	Redact bool
	// Replicas of the stream; 0 means 1.
	Replicas int
	// Logger; nil discards.
	Logger *slog.Logger
}

// Log is the audit log over a JetStream stream.
type Log struct {
	js     jetstream.JetStream
	stream jetstream.Stream
	keys   *Keyring
	redact bool
	log    *slog.Logger
	// tails holds the chains this Log appended to lately, as its own
	// appends left them (see chainTail).
	tails   *lru.Cache[string, *chainTail]
	tailsMu sync.Mutex // orders remember's check and update
	// checked holds, by record hash, whether a record read from the
	// stream verified (see checkedChain), and records this Log wrote: a
	// record is checked once.
	checked *lru.Cache[string, bool]
}

// maxTails bounds [Log.tails]. A tail holds no record, only a receipt per
// step (~250 bytes; a task's chain stays within a few dozen records), and a
// sealed chain leaves the cache.
const maxTails = 4096

// maxChecked bounds [Log.checked]: about 100 bytes a record, for the
// chains of some hundreds of tasks.
const maxChecked = 1 << 14

// Open creates or updates the audit stream and returns the log.
func Open(ctx context.Context, js jetstream.JetStream, opts Options) (*Log, error) {
	rep := opts.Replicas
	if rep == 0 {
		rep = 1
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:        StreamName,
		Description: "Countersign audit records: one signed hash chain per task",
		Subjects:    []string{SubjectPrefix + ">"},
		Storage:     jetstream.FileStorage,
		Retention:   jetstream.LimitsPolicy,
		Replicas:    rep,
		DenyDelete:  true,
		DenyPurge:   true,
		Duplicates:  10 * time.Minute,
		MaxMsgSize:  1 << 20,
	})
	if err != nil {
		return nil, fmt.Errorf("audit: stream: %w", err)
	}
	tails, err := lru.New[string, *chainTail](maxTails)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	checked, err := lru.New[string, bool](maxChecked)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	l := &Log{js: js, stream: s, keys: opts.Keys, redact: opts.Redact, log: opts.Logger, tails: tails, checked: checked}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	return l, nil
}

// CanSign reports whether the log holds signing keys (else it is read-only).
func (l *Log) CanSign() bool { return l.keys != nil }

// Redact reports whether arguments are recorded as a digest only.
func (l *Log) Redact() bool { return l.redact }

// ValidTaskID reports whether id can name a chain: 1–128 of [a-z0-9_-].
func ValidTaskID(id string) bool {
	if id == "" || len(id) > 128 {
		return false
	}
	for _, c := range id {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Step is one record to append.
type Step struct {
	ID   string // unique within the task; the idempotency key
	Kind string
	At   time.Time
	Body any
}

// entry is a stored record with its stream position.
type entry struct {
	line []byte
	rec  Record
	hash string
	seq  uint64 // stream sequence
	// foreign: a record the Log could not verify (see
	// [Log.checkedChain]); it is neither a step written nor a seal.
	foreign bool
}

// chain reads a task's records in order, one direct get per record (no
// consumer, so a burst of appends creates no server-side state). It trusts
// the stream; the verifier does not.
func (l *Log) chain(ctx context.Context, taskID string) ([]entry, error) {
	subj := SubjectPrefix + taskID
	var out []entry
	seq := uint64(1)
	for {
		m, err := l.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subj))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("audit: read chain: %w", err)
		}
		var r Record
		if err := json.Unmarshal(m.Data, &r); err != nil {
			return nil, fmt.Errorf("audit: stored record %d: %w", m.Sequence, err)
		}
		out = append(out, entry{line: m.Data, rec: r, hash: Hash(m.Data), seq: m.Sequence})
		if len(out) > MaxChainLen+2 {
			return nil, fmt.Errorf("audit: chain of %s is longer than %d records", taskID, MaxChainLen)
		}
		seq = m.Sequence + 1
	}
}

// checkedChain reads a task's chain to append to it. Every record must be
// the chain's (of the task, at its seq, linked to the one before), else
// the chain cannot be appended to ([ErrBrokenChain]). A record this Log
// cannot verify (signed by a key its keyring does not have, even once the
// key directory is read again for a rotation by another process; a
// signature that does not verify; not canonical) is foreign: it stays in
// the chain, for the verifier to report, but it never counts as a step
// written or as the chain's seal, so the Log's own record of its step is
// appended after it. Whoever may publish to the stream but holds no key
// thus cannot keep a step (a claim, an end) out of the chain, or hand the
// caller a receipt for a record not its own. A record is checked once
// ([Log.checked]), except one of a key this process does not hold, which
// is checked again on each read until its key arrives; the Log's own
// records never are.
func (l *Log) checkedChain(ctx context.Context, taskID string) ([]entry, error) {
	es, err := l.chain(ctx, taskID)
	if err != nil {
		return nil, err
	}
	var p recordParser
	reloaded := false
	prev := ""
	for i := range es {
		e := &es[i]
		if r := e.rec; r.TaskID != taskID || r.Seq != i || r.Prev != prev {
			return nil, fmt.Errorf("%w: chain of %s: stored record %d is not the chain's (task %q, seq %d)", ErrBrokenChain, taskID, i, r.TaskID, r.Seq)
		}
		prev = e.hash
		if ok, seen := l.checked.Get(e.hash); seen {
			e.foreign = !ok
			continue
		}
		if p.keys == nil {
			p.keys = l.keys.publicKeys()
		}
		_, _, err := p.parse(e.line)
		if errors.Is(err, ErrUnknownKey) && !reloaded {
			reloaded = true
			if rerr := l.keys.reload(); rerr != nil {
				l.log.Warn("audit: key directory not read again", "error", rerr)
			}
			p.keys = l.keys.publicKeys()
			_, _, err = p.parse(e.line)
		}
		// A record of a key this process does not hold yet (another
		// process's directory got a rotation first) is not remembered as
		// foreign: once the key arrives, it counts.
		if !errors.Is(err, ErrUnknownKey) {
			l.checked.Add(e.hash, err == nil)
		}
		if err != nil {
			e.foreign = true
			l.log.Warn("audit: chain holds a record this process cannot verify; it does not count as a step written",
				"task_id", taskID, "seq", i, "step_id", e.rec.StepID, "key_id", e.rec.KeyID, "error", err)
		}
	}
	return es, nil
}

// Chain returns the canonical lines of a task's records, in order.
func (l *Log) Chain(ctx context.Context, taskID string) ([][]byte, error) {
	if !ValidTaskID(taskID) {
		return nil, ErrInvalidTaskID
	}
	es, err := l.chain(ctx, taskID)
	if err != nil {
		return nil, err
	}
	if len(es) == 0 {
		return nil, ErrNotFound
	}
	out := make([][]byte, len(es))
	for i, e := range es {
		out[i] = e.line
	}
	return out, nil
}

func receipt(e entry) Receipt {
	return Receipt{RecordRef: e.rec.TaskID + "/" + strconv.Itoa(e.rec.Seq), Hash: e.hash, Signature: e.rec.Sig, KeyID: e.rec.KeyID}
}

// Append adds one step to the task's chain and returns its receipt. A step
// whose ID is already in the chain, in a record the Log verified (see
// [Log.checkedChain]), returns the earlier record's receipt and writes
// nothing.
//
// A chain this Log appended to lately is not read again: its tail (see
// chainTail) says what the next record follows, and the publish is guarded
// by the subject's last sequence, so it succeeds only if no record was
// written since, by anyone (stream sequences only grow, and records are
// never deleted). If the chain moved, the tail is dropped and the chain
// read whole, as for a chain this Log does not know.
func (l *Log) Append(ctx context.Context, taskID string, s Step) (Receipt, error) {
	if l.keys == nil {
		return Receipt{}, ErrReadOnly
	}
	if !ValidTaskID(taskID) {
		return Receipt{}, ErrInvalidTaskID
	}
	if s.ID == "" || s.Kind == "" {
		return Receipt{}, errors.New("audit: step needs an ID and a kind")
	}
	body, err := json.Marshal(s.Body)
	if err != nil {
		return Receipt{}, fmt.Errorf("audit: encode %s body: %w", s.Kind, err)
	}
	for attempt := 0; ; attempt++ {
		t, ok := l.tails.Get(taskID)
		switch {
		case ok && attempt == 0:
			// The tail this Log's own last append left.
		case attempt == 0 && s.Kind == KindRequested:
			// A task's requested record starts its chain, and is almost
			// always written to an empty one: try that first. A chain
			// that has records fails the guard (or the publish is a
			// duplicate), and is read below.
			t = tailOf(nil)
		default:
			es, err := l.checkedChain(ctx, taskID)
			if err != nil {
				return Receipt{}, err
			}
			t = tailOf(es)
		}
		rc, next, err := l.appendTo(ctx, taskID, t, s, body)
		if err == nil {
			l.remember(taskID, next)
			return rc, nil
		}
		l.tails.Remove(taskID)
		if !isWrongLastSeq(err) || attempt >= 20 {
			return Receipt{}, err
		}
		// Another writer appended meanwhile: read the chain again.
	}
}

// chainTail is what appending to a chain needs to know of it: its length,
// how it starts and ends, and the receipt of every step it holds (the
// idempotency check). A chainTail is never changed once made: [Log.tails]
// hands the same one to concurrent appends.
type chainTail struct {
	n         int
	firstKind string
	// the last record's kind, hash and stream sequence (zero when n == 0)
	lastKind string
	lastHash string
	lastSeq  uint64
	steps    map[string]Receipt
}

func tailOf(es []entry) *chainTail {
	t := &chainTail{n: len(es), steps: make(map[string]Receipt, len(es)+1)}
	for _, e := range es {
		if !e.foreign {
			t.steps[e.rec.StepID] = receipt(e)
		}
	}
	if len(es) > 0 {
		last := es[len(es)-1]
		t.firstKind, t.lastKind, t.lastHash, t.lastSeq = es[0].rec.Kind, last.rec.Kind, last.hash, last.seq
		// A foreign record neither opens a one-record chain nor seals one.
		if es[0].foreign {
			t.firstKind = ""
		}
		if last.foreign {
			t.lastKind = ""
		}
	}
	return t
}

// with returns the tail of t's chain with e appended.
func (t *chainTail) with(e entry) *chainTail {
	u := &chainTail{n: t.n + 1, firstKind: t.firstKind, lastKind: e.rec.Kind, lastHash: e.hash, lastSeq: e.seq, steps: maps.Clone(t.steps)}
	if t.n == 0 {
		u.firstKind = e.rec.Kind
	}
	u.steps[e.rec.StepID] = receipt(e)
	return u
}

// sealed reports whether nothing may follow: the outcome, or a rejected
// token's one-record chain.
func (t *chainTail) sealed() bool {
	return t.n > 0 && (t.lastKind == KindOutcome || t.firstKind == KindTokenRejected)
}

// remember keeps t as the task's tail, unless the cache already holds a
// later one (two appends of this Log raced) or the chain is sealed.
func (l *Log) remember(taskID string, t *chainTail) {
	if t == nil {
		return
	}
	l.tailsMu.Lock()
	defer l.tailsMu.Unlock()
	if t.sealed() {
		l.tails.Remove(taskID)
		return
	}
	if old, ok := l.tails.Peek(taskID); ok && old.lastSeq >= t.lastSeq {
		return
	}
	l.tails.Add(taskID, t)
}

// appendTo appends s after the chain t describes, guarded by the subject's
// last sequence. It returns the record's receipt and the chain's new tail
// (nil when s was already in the chain and nothing was written).
func (l *Log) appendTo(ctx context.Context, taskID string, t *chainTail, s Step, body json.RawMessage) (Receipt, *chainTail, error) {
	if rc, ok := t.steps[s.ID]; ok {
		return rc, nil, nil
	}
	var prev string
	var lastSeq uint64
	if t.n > 0 {
		if t.sealed() {
			return Receipt{}, nil, ErrSealed
		}
		prev, lastSeq = t.lastHash, t.lastSeq
	} else if s.Kind != KindRequested && s.Kind != KindAdmin && !IsTokenChainStart(s.Kind) {
		return Receipt{}, nil, fmt.Errorf("%w: chain of %s has no requested record; cannot append %s", ErrBrokenChain, taskID, s.Kind)
	}
	if t.n >= MaxChainLen {
		return Receipt{}, nil, fmt.Errorf("%w: chain of %s is full", ErrBrokenChain, taskID)
	}
	line, rec, err := seal(Record{
		TaskID: taskID, Seq: t.n, Kind: s.Kind, StepID: s.ID,
		At: s.At.UTC(), Prev: prev, Body: body,
	}, l.keys)
	if err != nil {
		return Receipt{}, nil, err
	}
	ack, err := l.js.Publish(ctx, SubjectPrefix+taskID, line,
		jetstream.WithMsgID(taskID+"/"+s.ID),
		jetstream.WithExpectLastSequencePerSubject(lastSeq))
	if err != nil {
		return Receipt{}, nil, fmt.Errorf("audit: append %s: %w", s.Kind, err)
	}
	if ack.Duplicate {
		// Written by an earlier attempt whose answer was lost: read it back.
		return Receipt{}, nil, errWrongLastSeq
	}
	e := entry{line: line, rec: rec, hash: Hash(line), seq: ack.Sequence}
	l.checked.Add(e.hash, true)
	return receipt(e), t.with(e), nil
}

var errWrongLastSeq = errors.New("audit: chain moved")

func isWrongLastSeq(err error) bool {
	if errors.Is(err, errWrongLastSeq) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
	}
	return false
}

// End is the terminal step [Log.Seal] writes.
type End struct {
	Kind         string // a terminal kind: executed, denied, expired, cancelled, …
	At           time.Time
	Status       string
	Disposition  string
	Detail       string
	ResultDigest string
}

// Seal appends the terminal record and the outcome record derived from the
// chain, and returns the outcome's receipt. It is idempotent.
func (l *Log) Seal(ctx context.Context, taskID string, end End) (Receipt, error) {
	if !IsTerminalKind(end.Kind) {
		return Receipt{}, fmt.Errorf("%w: %q is not a terminal kind", ErrBrokenChain, end.Kind)
	}
	if _, err := l.Append(ctx, taskID, Step{ID: StepEnd, Kind: end.Kind, At: end.At, Body: Ended{
		Status: end.Status, Disposition: end.Disposition, Detail: end.Detail, ResultDigest: end.ResultDigest,
	}}); err != nil && !errors.Is(err, ErrSealed) {
		return Receipt{}, err
	}
	for attempt := 0; ; attempt++ {
		es, err := l.checkedChain(ctx, taskID)
		if err != nil {
			return Receipt{}, err
		}
		n := len(es)
		if n > 0 && es[n-1].rec.Kind == KindOutcome && !es[n-1].foreign {
			return receipt(es[n-1]), nil
		}
		recs := make([]Record, n)
		hashes := make([]string, n)
		for i, e := range es {
			recs[i], hashes[i] = e.rec, e.hash
		}
		o, err := BuildOutcome(recs, hashes)
		if err != nil {
			return Receipt{}, fmt.Errorf("%w: %v", ErrBrokenChain, err)
		}
		body, err := json.Marshal(o)
		if err != nil {
			return Receipt{}, err
		}
		rc, _, err := l.appendTo(ctx, taskID, tailOf(es), Step{ID: StepOutcome, Kind: KindOutcome, At: end.At}, body)
		if err == nil {
			l.tails.Remove(taskID)
			return rc, nil
		}
		if !isWrongLastSeq(err) || attempt >= 20 {
			return Receipt{}, err
		}
	}
}

// Export calls fn with every record of every task that has a record at or
// after since (zero: every task), chain by chain, each chain in order.
func (l *Log) Export(ctx context.Context, since time.Time, fn func(line []byte) error) error {
	info, err := l.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("audit: stream info: %w", err)
	}
	if info.State.Msgs == 0 {
		return nil
	}
	cfg := jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{SubjectPrefix + ">"},
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		HeadersOnly:    true,
	}
	if !since.IsZero() {
		cfg.DeliverPolicy = jetstream.DeliverByStartTimePolicy
		cfg.OptStartTime = &since
	}
	c, err := l.stream.OrderedConsumer(ctx, cfg)
	if err != nil {
		return fmt.Errorf("audit: export: %w", err)
	}
	// Collect the task IDs first (in order of first appearance), then
	// write whole chains, so a chain is never cut by since.
	seen := map[string]bool{}
	var ids []string
	last := info.State.LastSeq
	done := false
	for !done {
		batch, err := c.FetchNoWait(500)
		if err != nil {
			return fmt.Errorf("audit: export: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			id := strings.TrimPrefix(m.Subject(), SubjectPrefix)
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
			if md, err := m.Metadata(); err == nil && md.Sequence.Stream >= last {
				done = true
			}
			if md, err := m.Metadata(); err == nil && md.NumPending == 0 {
				done = true
			}
		}
		if err := batch.Error(); err != nil {
			return fmt.Errorf("audit: export: %w", err)
		}
		if n == 0 {
			if !since.IsZero() {
				break // nothing (more) since the start time
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	for _, id := range ids {
		es, err := l.chain(ctx, id)
		if err != nil {
			return err
		}
		for _, e := range es {
			if err := fn(e.line); err != nil {
				return err
			}
		}
	}
	return nil
}
