package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/tasks"
)

// taskSet collects the task IDs a scenario created.
type taskSet struct {
	mu  sync.Mutex
	ids []string
}

func (s *taskSet) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ids = append(s.ids, id)
}

func (s *taskSet) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := s.ids
	s.ids = nil
	return ids
}

// transferArgs are a requestable transfer_funds call (over 1,000), unique
// to this run and call.
func (b *bencher) transferArgs() map[string]any {
	return map[string]any{"to": fmt.Sprintf("bench-%s-%d", b.runID, b.seq.Add(1)), "amount": 5000, "currency": "USD"}
}

// later has the tasks cancelled at the end of the run: cancelling them
// between phases would load the next phase.
func (b *bencher) later(token string, ids []string) {
	if len(ids) == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.leftover = append(b.leftover, leftover{token, ids})
}

type leftover struct {
	token string
	ids   []string
}

// finish cancels the tasks the run left pending and terminates the
// baseline's workflows, before the run's agents are revoked.
func (b *bencher) finish() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b.mu.Lock()
	left, waiting := b.leftover, b.waiting
	b.leftover, b.waiting = nil, nil
	b.mu.Unlock()
	for _, l := range left {
		b.cancelAll(ctx, l.token, l.ids)
	}
	if len(waiting) > 0 {
		b.terminate(ctx, waiting)
	}
}

// cancelAll cancels the tasks (not timed), retrying refusals for load.
func (b *bencher) cancelAll(ctx context.Context, token string, ids []string) {
	if len(ids) == 0 {
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(8, len(ids)) {
		wg.Go(func() {
			for i := next.Add(1) - 1; i < int64(len(ids)); i = next.Add(1) - 1 {
				var err error
				for attempt := 0; attempt < 20 && ctx.Err() == nil; attempt++ {
					err = b.c.cancelTask(ctx, token, ids[i])
					if err == nil || errorKind(err) != "rate-limited" && errorKind(err) != "transport" {
						break
					}
					time.Sleep(500 * time.Millisecond)
				}
				if err != nil {
					b.mu.Lock()
					b.rep.CleanupErrors = append(b.rep.CleanupErrors, fmt.Sprintf("cancel task %s: %v", ids[i], err))
					b.mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
}

// settle pauses between phases, so that one phase's trailing work (workflow
// tasks, cancellations) does not land in the next one's numbers.
func (b *bencher) settle() { time.Sleep(500 * time.Millisecond) }

// gatedCall measures gated calls at each concurrency, each phase right
// after the baseline's at the same concurrency when there is one, so that
// the machine's drift weighs on both alike.
func (b *bencher) gatedCall(ctx context.Context) error {
	for _, conc := range b.o.Concurrency {
		if b.o.Temporal != nil {
			if err := b.baseline(ctx, conc); err != nil {
				return err
			}
		}
		var created taskSet
		err := b.measure(ctx, ScenarioGatedCall, conc, func(ctx context.Context, p *phase, _ int) error {
			args := b.transferArgs()
			var id string
			if timed(p, "gated-call", func() (err error) {
				id, err = b.c.createTask(ctx, b.o.AgentToken, args)
				return err
			}) == nil {
				created.add(id)
			}
			return nil
		}, "gated-call")
		b.later(b.o.AgentToken, created.take())
		if err != nil {
			return err
		}
		b.settle()
	}
	return nil
}

func (b *bencher) tasksGetPending(ctx context.Context) error {
	var ids []string
	defer func() { b.later(b.o.AgentToken, ids) }()
	for range 32 {
		id, err := b.c.createTask(ctx, b.o.AgentToken, b.transferArgs())
		if err != nil {
			return fmt.Errorf("create a pending task: %w", err)
		}
		ids = append(ids, id)
	}
	b.settle()
	return b.tasksGet(ctx, ScenarioTasksGetPending, ids, "")
}

func (b *bencher) tasksGetCompleted(ctx context.Context) error {
	if err := b.ensureCompleted(ctx, 8); err != nil {
		return err
	}
	b.mu.Lock()
	ids := slices.Clone(b.completed)
	b.mu.Unlock()
	return b.tasksGet(ctx, ScenarioTasksGetCompleted, ids, string(tasks.ApprovedExecuted))
}

// tasksGet polls the tasks round robin; each answer must have the
// disposition wantDisp (none: a pending task).
func (b *bencher) tasksGet(ctx context.Context, scenario string, ids []string, wantDisp string) error {
	var n atomic.Int64
	for _, conc := range b.o.Concurrency {
		err := b.measure(ctx, scenario, conc, func(ctx context.Context, p *phase, _ int) error {
			id := ids[int(n.Add(1))%len(ids)]
			_ = timed(p, scenario, func() error {
				status, disp, err := b.c.getTask(ctx, b.o.AgentToken, id)
				if err != nil {
					return err
				}
				if disp != wantDisp || wantDisp == "" && tasks.Status(status).Terminal() {
					return unexpectedError{"task-state", status + " " + disp}
				}
				return nil
			})
			return nil
		}, scenario)
		if err != nil {
			return err
		}
	}
	return nil
}

// ensureApprovers enrolls approvers until there are n.
func (b *bencher) ensureApprovers(ctx context.Context, n int) error {
	for len(b.approvers) < n {
		a, err := b.c.enrollApprover(ctx, fmt.Sprintf("bench-%s-%d", b.runID, len(b.approvers)+1), b.o.ApproverGroup)
		if err != nil {
			return err
		}
		b.approvers = append(b.approvers, a)
		b.onCleanup(func() { b.revoke("approvers", a.id) })
	}
	return nil
}

// ensureCompleted approves tasks until n of them are completed.
func (b *bencher) ensureCompleted(ctx context.Context, n int) error {
	if err := b.ensureApprovers(ctx, 1); err != nil {
		return err
	}
	for len(b.completed) < n {
		id, ref, err := b.c.pendingCall(ctx, b.o.AgentToken, b.transferArgs())
		if err != nil {
			return fmt.Errorf("gated call: %w", err)
		}
		if err := b.c.awaitRequested(ctx, ref); err != nil {
			return err
		}
		var sent, accepted time.Time
		if err := b.c.approveTimed(ctx, b.approvers[0], ref, &sent, &accepted); err != nil {
			return fmt.Errorf("approve: %w", err)
		}
		if err := b.c.waitExecuted(ctx, b.o.AgentToken, id); err != nil {
			return fmt.Errorf("task %s: %w", id, err)
		}
		b.completed = append(b.completed, id)
	}
	return nil
}

// approval: the approver's ceremony from the challenge to the task seen
// approved-executed. The gated call and the wait for the approval request
// to reach the approver are not timed.
func (b *bencher) approval(ctx context.Context) error {
	if err := b.ensureApprovers(ctx, slices.Max(b.o.Concurrency)); err != nil {
		return err
	}
	for _, conc := range b.o.Concurrency {
		err := b.measure(ctx, ScenarioApproval, conc, func(ctx context.Context, p *phase, w int) error {
			id, ref, err := b.c.pendingCall(ctx, b.o.AgentToken, b.transferArgs())
			if err == nil {
				err = b.c.awaitRequested(ctx, ref)
			}
			if err != nil {
				p.fail("approval", err)
				return nil
			}
			t0 := time.Now()
			var decisionStart, accepted time.Time
			err = b.c.approveTimed(ctx, b.approvers[w], ref, &decisionStart, &accepted)
			if err == nil {
				err = b.c.waitExecuted(ctx, b.o.AgentToken, id)
			}
			if err != nil {
				p.fail("approval", err)
				return nil
			}
			done := time.Now()
			p.observe("approval", done.Sub(t0))
			p.observe("approval-decision", accepted.Sub(decisionStart))
			p.observe("approval-accepted-to-executed", done.Sub(accepted))
			b.mu.Lock()
			b.completed = append(b.completed, id)
			b.mu.Unlock()
			return nil
		}, "approval", "approval-decision", "approval-accepted-to-executed")
		if err != nil {
			return err
		}
	}
	return nil
}

// await: a client without tasks follows a gated call with
// countersign_await, which an approval ends (await-decision-to-result: from
// the approver's decision POST to the await's answer, which the decision's
// own answer may come after); then reads the completed task once more with
// countersign_await (await-completed: the tool's round trip).
func (b *bencher) await(ctx context.Context) error {
	if err := b.ensureApprovers(ctx, slices.Max(b.o.Concurrency)); err != nil {
		return err
	}
	for _, conc := range b.o.Concurrency {
		err := b.measure(ctx, ScenarioAwait, conc, func(ctx context.Context, p *phase, w int) error {
			id, ref, err := b.c.pendingCall(ctx, b.o.AgentToken, b.transferArgs())
			if err == nil {
				err = b.c.awaitRequested(ctx, ref)
			}
			if err != nil {
				p.fail("await-decision-to-result", err)
				return nil
			}
			type answer struct {
				at  time.Time
				err error
			}
			got := make(chan answer, 1)
			go func() {
				err := b.c.awaitFinal(ctx, id, 30)
				got <- answer{time.Now(), err}
			}()
			time.Sleep(20 * time.Millisecond) // the await is waiting (not timed)
			var decisionStart, accepted time.Time
			if err := b.c.approveTimed(ctx, b.approvers[w], ref, &decisionStart, &accepted); err != nil {
				p.fail("await-decision-to-result", err)
				<-got
				return nil
			}
			a := <-got
			if a.err != nil {
				p.fail("await-decision-to-result", a.err)
				return nil
			}
			p.observe("await-decision-to-result", a.at.Sub(decisionStart))
			b.mu.Lock()
			b.completed = append(b.completed, id)
			b.mu.Unlock()
			_ = timed(p, "await-completed", func() error { return b.c.awaitFinal(ctx, id, 0) })
			return nil
		}, "await-decision-to-result", "await-completed")
		if err != nil {
			return err
		}
	}
	return nil
}

// gateway: the upstream's tool called directly and through Countersign,
// alternately, by each worker.
func (b *bencher) gateway(ctx context.Context) error {
	if b.o.Upstream == "" || b.o.UpstreamTool == "" || b.o.GatewayTool == "" {
		return skipError{"no upstream: pass --upstream-url, --upstream-tool and --gateway-tool (the tool's name through Countersign, e.g. everything__echo)"}
	}
	sessions := make([]*mcp.ClientSession, slices.Max(b.o.Concurrency))
	for i := range sessions {
		c := mcp.NewClient(&mcp.Implementation{Name: "countersign-bench-direct", Version: "1"}, nil)
		s, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: b.o.Upstream, HTTPClient: b.c.http}, nil)
		if err != nil {
			return fmt.Errorf("connect to the upstream %s: %w", b.o.Upstream, err)
		}
		defer s.Close()
		sessions[i] = s
	}
	// Through Countersign the tool must be allowed: a task means policy
	// gates it, and the comparison would be meaningless.
	if _, err := b.c.callThrough(ctx, b.o.AgentToken, b.o.GatewayTool, b.o.UpstreamArgs); err != nil {
		return fmt.Errorf("%s through the server: %w", b.o.GatewayTool, err)
	}
	for _, conc := range b.o.Concurrency {
		err := b.measure(ctx, ScenarioGateway, conc, func(ctx context.Context, p *phase, w int) error {
			_ = timed(p, "gateway-direct", func() error {
				r, err := sessions[w].CallTool(ctx, &mcp.CallToolParams{Name: b.o.UpstreamTool, Arguments: b.o.UpstreamArgs})
				if err == nil && r.IsError {
					err = unexpectedError{"tool-error", "the upstream answered isError"}
				}
				return err
			})
			_ = timed(p, "gateway-through", func() error {
				_, err := b.c.callThrough(ctx, b.o.AgentToken, b.o.GatewayTool, b.o.UpstreamArgs)
				return err
			})
			return nil
		}, "gateway-direct", "gateway-through")
		if err != nil {
			return err
		}
	}
	return nil
}

// sep2672: the in-band ceremony, one enrolled passkey per worker.
func (b *bencher) sep2672(ctx context.Context) error {
	signers := make([]*inBandSigner, slices.Max(b.o.Concurrency))
	for i := range signers {
		s, err := b.c.enrollInBand(ctx, b.o.AgentToken, b.o.VerifiedOrigin)
		if err != nil {
			return err
		}
		signers[i] = s
	}
	for _, conc := range b.o.Concurrency {
		err := b.measure(ctx, ScenarioSEP2672, conc, func(ctx context.Context, p *phase, w int) error {
			args := map[string]any{"symbol": "AAPL", "side": "buy", "quantity": 1 + b.seq.Add(1)%1000, "limit": 180}
			t0 := time.Now()
			if b.c.ceremony(ctx, p, b.o.AgentToken, signers[w], args) {
				p.observe("sep2672-ceremony", time.Since(t0))
			} else {
				p.fail("sep2672-ceremony", unexpectedError{"step", "challenge or call failed"})
			}
			return nil
		}, "sep2672-ceremony", "sep2672-challenge", "sep2672-call")
		if err != nil {
			return err
		}
	}
	return nil
}

// --- client helpers the scenarios share -----------------------------------

// approveTimed is approve, noting when the decision was sent and accepted.
func (c *benchClient) approveTimed(ctx context.Context, a *approver, ref string, decisionStart, accepted *time.Time) error {
	var ch struct {
		ChallengeID    string          `json:"challengeId"`
		RequestOptions json.RawMessage `json:"requestOptions"`
	}
	if err := c.api(ctx, http.MethodPost, "/approver/v1/approvals/"+ref+"/challenge", "", map[string]any{"decision": "approve"}, &ch); err != nil {
		return fmt.Errorf("challenge: %w", err)
	}
	sig, err := a.sign(ch.RequestOptions)
	if err != nil {
		return err
	}
	var r struct {
		Accepted bool   `json:"accepted"`
		Reason   string `json:"reason"`
	}
	*decisionStart = time.Now()
	if err := c.api(ctx, http.MethodPost, "/approver/v1/approvals/"+ref+"/decision", "",
		map[string]any{"challengeId": ch.ChallengeID, "decision": "approve", "response": sig}, &r); err != nil {
		return fmt.Errorf("decision: %w", err)
	}
	*accepted = time.Now()
	if !r.Accepted {
		return unexpectedError{"decision-rejected", r.Reason}
	}
	return nil
}

// awaitRequested waits until the approval page shows the request, which is
// when the workflow notifies the approvers.
func (c *benchClient) awaitRequested(ctx context.Context, ref string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		var view struct {
			Timeline []struct {
				Kind string `json:"kind"`
			} `json:"timeline"`
		}
		if err := c.api(ctx, http.MethodGet, "/approver/v1/approvals/"+ref, "", nil, &view); err != nil {
			return fmt.Errorf("approval page %s: %w", ref, err)
		}
		for _, e := range view.Timeline {
			if e.Kind == "requested" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("approval %s never showed the request: %w", ref, ctx.Err())
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// awaitFinal calls countersign_await; the answer must be the task's final,
// executed result.
func (c *benchClient) awaitFinal(ctx context.Context, taskID string, waitSeconds int) error {
	res, err := c.callTool(ctx, c.agent, "countersign_await", map[string]any{"taskId": taskID, "waitSeconds": waitSeconds}, nil, false)
	if err != nil {
		return err
	}
	var r struct {
		IsError bool           `json:"isError"`
		Meta    map[string]any `json:"_meta"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.IsError || r.Meta[tasks.MetaDisposition] != string(tasks.ApprovedExecuted) {
		return unexpectedError{"await", string(res)}
	}
	return nil
}

// callThrough makes an allowed call through the server; a task or an error
// result fails.
func (c *benchClient) callThrough(ctx context.Context, token, tool string, args map[string]any) (json.RawMessage, error) {
	res, err := c.callTool(ctx, token, tool, args, nil, true)
	if err != nil {
		return nil, err
	}
	var r struct {
		ResultType string `json:"resultType"`
		IsError    bool   `json:"isError"`
	}
	if err := json.Unmarshal(res, &r); err != nil || r.ResultType == "task" || r.IsError {
		return nil, unexpectedError{"not-allowed", string(res)}
	}
	return res, nil
}
