package passkey

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// directory is the approvers bucket held in memory, fed by one KV watch
// for the life of the service, so that listing approvers (every challenge
// lists the eligible approvers' passkeys) costs no scan of the bucket. A
// scan is a new JetStream consumer each time: it was ~30 % of a challenge's
// server CPU.
//
// Freshness: a listing waits until the directory has applied every write
// the bucket held when the listing began (its stream's last sequence, one
// request), so it is never staler than the scan it replaces: an approver
// added or changed, on this replica or another, before the call is in the
// answer. Only when the watch is down or does not catch up within
// [directoryWait] does the listing fall back to the scan.
type directory struct {
	kv jetstream.KeyValue

	mu      sync.Mutex
	running bool                // a watch is feeding the directory
	ready   bool                // it has delivered the bucket's initial values
	seq     uint64              // highest stream sequence applied
	byID    map[string]Approver // current approvers
	changed chan struct{}       // closed (and replaced) whenever seq or ready moves
}

// directoryWait bounds how long a listing waits for the watch to catch up
// before it scans instead.
const directoryWait = 2 * time.Second

func newDirectory(kv jetstream.KeyValue) *directory {
	return &directory{kv: kv, changed: make(chan struct{})}
}

// list returns the approvers, ordered by id, as of at least the bucket's
// state when it was called; ok is false when the directory cannot say
// (the caller scans).
func (d *directory) list(ctx context.Context) (out []Approver, ok bool) {
	st, err := d.kv.Status(ctx)
	if err != nil {
		return nil, false
	}
	bs, isBucket := st.(*jetstream.KeyValueBucketStatus)
	if !isBucket {
		return nil, false
	}
	last := bs.StreamInfo().State.LastSeq
	d.start(last)
	timer := time.NewTimer(directoryWait)
	defer timer.Stop()
	for {
		d.mu.Lock()
		if d.ready && d.seq >= last {
			out = slices.AppendSeq(make([]Approver, 0, len(d.byID)), maps.Values(d.byID))
			d.mu.Unlock()
			slices.SortFunc(out, func(a, b Approver) int { return strings.Compare(a.ID, b.ID) })
			return out, true
		}
		running, changed := d.running, d.changed
		d.mu.Unlock()
		if !running {
			return nil, false
		}
		select {
		case <-ctx.Done():
			return nil, false
		case <-timer.C:
			return nil, false
		case <-changed:
		}
	}
}

// start starts the watch unless one is running. last is the bucket's last
// sequence, read before the watch is created: once the watch has delivered
// the initial values, the directory holds at least that state.
func (d *directory) start(last uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.running {
		return
	}
	// The watch outlives the call that started it: it ends when the
	// connection closes, and the next listing starts another.
	w, err := d.kv.WatchAll(context.Background())
	if err != nil {
		return
	}
	d.running, d.ready, d.seq, d.byID = true, false, 0, map[string]Approver{}
	go d.run(w, last)
}

func (d *directory) run(w jetstream.KeyWatcher, last uint64) {
	defer func() {
		d.mu.Lock()
		d.running, d.ready = false, false
		d.notifyLocked()
		d.mu.Unlock()
	}()
	for e := range w.Updates() {
		d.mu.Lock()
		if e == nil { // the initial values are in
			d.ready = true
			d.seq = max(d.seq, last)
		} else {
			d.applyLocked(e)
		}
		d.notifyLocked()
		d.mu.Unlock()
	}
}

func (d *directory) applyLocked(e jetstream.KeyValueEntry) {
	d.seq = max(d.seq, e.Revision())
	if e.Operation() != jetstream.KeyValuePut {
		delete(d.byID, e.Key())
		return
	}
	var a Approver
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		// Not an approver: the scan reports it. Leave it out, and keep
		// the directory from answering until the key changes.
		d.byID[e.Key()] = Approver{ID: e.Key(), Name: undecodable}
		return
	}
	d.byID[e.Key()] = a
}

// undecodable marks an entry that is not an approver; a listing that meets
// one scans, so it fails as the scan does.
const undecodable = "\x00undecodable"

func (d *directory) notifyLocked() {
	close(d.changed)
	d.changed = make(chan struct{})
}

// Approvers returns every approver, ordered by id.
func (s *Service) Approvers(ctx context.Context) ([]Approver, error) {
	if out, ok := s.dir.list(ctx); ok && !slices.ContainsFunc(out, func(a Approver) bool { return a.Name == undecodable }) {
		return out, nil
	}
	return s.scanApprovers(ctx)
}

// scanApprovers lists the approvers with a scan of the bucket.
func (s *Service) scanApprovers(ctx context.Context) ([]Approver, error) {
	w, err := s.approvers.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("passkey: list approvers: %w", err)
	}
	defer func() { _ = w.Stop() }()
	out := []Approver{}
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, errors.New("passkey: list approvers: watcher closed")
			}
			if e == nil { // end of the initial values
				slices.SortFunc(out, func(a, b Approver) int { return strings.Compare(a.ID, b.ID) })
				return out, nil
			}
			var a Approver
			if err := json.Unmarshal(e.Value(), &a); err != nil {
				return nil, fmt.Errorf("passkey: decode approver %s: %w", e.Key(), err)
			}
			out = append(out, a)
		}
	}
}
