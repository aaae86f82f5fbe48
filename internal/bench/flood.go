package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// flood: agent A makes requestable calls from FloodWorkers goroutines, back
// to back, while agent B makes paced ones (FloodInterval apart). B's calls
// are measured alone first, then under A's flood (after a second of it).
// Both agents are new (admin API), so neither the dev agent's budget nor
// its pending tasks are touched. Series: flood-b-alone,
// flood-b-under-flood, flood-a (A's calls, with how they were refused).
//
// B makes Requests calls in each of its two parts (or calls for Duration):
// on a server with the default limits (30 task creations a minute, burst 10)
// keep B's calls within its own burst, or B is refused for its own rate.
func (b *bencher) flood(ctx context.Context) error {
	nameA, nameB := fmt.Sprintf("bench-%s-flood-a", b.runID), fmt.Sprintf("bench-%s-flood-b", b.runID)
	tokA, err := b.c.addAgent(ctx, nameA)
	if err != nil {
		return err
	}
	b.onCleanup(func() { b.revoke("agents", nameA) })
	tokB, err := b.c.addAgent(ctx, nameB)
	if err != nil {
		return err
	}
	b.onCleanup(func() { b.revoke("agents", nameB) })
	var tasksA, tasksB taskSet
	defer func() {
		b.later(tokA, tasksA.take())
		b.later(tokB, tasksB.take())
	}()
	p := newPhase(ScenarioFlood, b.o.FloodWorkers, "flood-b-alone", "flood-b-under-flood", "flood-a")
	call := func(ctx context.Context, series, token string, set *taskSet) {
		var id string
		if timed(p, series, func() (err error) {
			id, err = b.c.createTask(ctx, token, b.transferArgs())
			return err
		}) == nil {
			set.add(id)
		}
	}
	paced := func(series string) time.Duration {
		start := time.Now()
		deadline := start.Add(b.o.Duration)
		for i := 0; ctx.Err() == nil; i++ {
			if b.o.Requests > 0 && i >= b.o.Requests || b.o.Requests == 0 && time.Now().After(deadline) {
				break
			}
			call(ctx, series, tokB, &tasksB)
			time.Sleep(b.o.FloodInterval)
		}
		return time.Since(start)
	}
	var done sync.WaitGroup
	var progressed atomic.Int64
	stop := make(chan struct{})
	aloneFor := paced("flood-b-alone")
	floodStart := time.Now()
	for range b.o.FloodWorkers {
		done.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				call(ctx, "flood-a", tokA, &tasksA)
				progressed.Add(1)
			}
		})
	}
	stopProgress := b.progress(ScenarioFlood, b.o.FloodWorkers, &progressed, time.Now().Add(b.o.Duration+time.Second))
	time.Sleep(time.Second)
	underFor := paced("flood-b-under-flood")
	close(stop)
	// Wait for A's calls in flight (a refused one is answered after a pause
	// of up to 1.5 s): a call cut short could leave a task the run does not
	// know of, and never cancels.
	done.Wait()
	stopProgress()
	floodFor := time.Since(floodStart)
	a := p.result("flood-a", floodFor)
	b.rep.Results = append(b.rep.Results, p.result("flood-b-alone", aloneFor), p.result("flood-b-under-flood", underFor), a)
	return nil
}
