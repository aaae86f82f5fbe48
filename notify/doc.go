// Package notify is Countersign's outbound and inbound messaging beside the
// approver site.
//
// Outbound, each type implements activities.Notifier (requested, then each
// accepted approval, then the end, in that order, from the workflow's
// notification queue):
//
//   - [Slack] posts one Block Kit message per task to the channel the policy
//     names (tasks.Requirement.SlackChannel) or the default one, and updates
//     that same message (chat.update) as approvals arrive and when the task
//     ends. The message links to the approval page; approving never happens
//     in Slack. It shows the requester's identical calls, looked up when it
//     is sent, and their warning when one ran or may have run. Channel and
//     ts are kept per task in NATS KV, so an activity retry updates instead
//     of posting twice.
//   - [Events] publishes JSON events (v:1; no arguments field, though an
//     upstream tool's display text holds their JSON; no task ID, tokens or
//     assertions; the requester's identical calls as the approver API shows
//     them) to the JetStream stream COUNTERSIGN_APPROVALS on
//     countersign.approvals.requested.<tool> and
//     countersign.approvals.resolved.<tool>, with Nats-Msg-Id
//     "<ref>.<type>" so retries are stored once.
//
// Inbound:
//
//   - [Interactions] is the Slack interactivity endpoint. It verifies every
//     request's signature (bad or stale: 401), refuses replays (409, NATS KV
//     create on a digest of timestamp and body), maps the Slack user to an
//     approver ([SlackUsers]) and asks the approvals service to deny without
//     a passkey (DenyUnsigned, which checks the approver's group and reaches
//     the workflow's tasks.UpdateDenyUnsigned). A deny needs no passkey because it can only
//     stop a call; the workflow records who denied, via Slack, and when.
//     Unknown users and non-eligible approvers get an ephemeral error and
//     nothing changes.
//   - [DecisionService] mirrors the approver API over NATS request/reply
//     (countersign.approver.v1.approval, .challenge, .decision). Like the
//     HTTP API it calls the approvals service and speaks the wire of
//     internal/approverapi, so parsing, limits and passkey verification are
//     the same code as over HTTP; the reply is the HTTP body with the
//     status in a header.
//   - [SlackUsers.LinkHandler] is the admin endpoint that links a Slack user
//     to an approver. A link lets the user deny for the approver, so it is
//     an admin record in the approver's audit chain (and the link it
//     replaces, an unlinking in the previous approver's); a server that
//     cannot sign audit records refuses it (503) and changes nothing.
//     [SlackUsers.UnlinkHandler] removes a link, likewise recorded.
//
// Nothing here blocks or fails a task: Slack and NATS failures are returned
// to the activity, which retries with backoff and then gives up, while the
// approval page keeps working.
package notify
