// The TypeScript SDK (@modelcontextprotocol/sdk 1.32.2) as a 2025-11-25 tasks
// client against a REAL gated tool on an authenticated `countersign dev`:
// callToolStream to a task, an approval through the approver API with a
// software passkey, the result read back, tasks/get, tasks/list,
// tasks/cancel, the error codes for unknown and foreign tasks, and a call
// without params.task getting [approval-pending] (the flow of clients without
// tasks is sdk-plain.mjs).
//
// Usage: node sdk-tasks.mjs BASE_URL DATA_DIR   (NODE_PATH has the SDK)
// Prints one line per check; exits non-zero on any failure.
import { SoftwarePasskey, http } from './webauthn.mjs';
import { sdk, base, dataDir, agentToken, adminToken, check, failed, text, connect, transfers } from './sdkclient.mjs';

const { CallToolResultSchema } = sdk('@modelcontextprotocol/sdk/types.js');

async function rpcCode(p) {
  try { await p; return 'no error'; } catch (e) { return e.code; }
}

try {
  const passkey = new SoftwarePasskey(base);
  await passkey.enroll(adminToken, `sdk-approver-${Date.now()}`, ['approvers']);
  const client = await connect(agentToken, 'countersign-interop-sdk');
  check('initialize negotiated 2025-11-25', client.getServerCapabilities()?.tasks?.requests?.tools?.call !== undefined,
    JSON.stringify(client.getServerCapabilities()?.tasks));
  const tools = await client.listTools();
  const tf = tools.tools.find((t) => t.name === 'transfer_funds');
  check('tools/list has transfer_funds with execution.taskSupport', !!tf?.execution?.taskSupport, tf?.execution?.taskSupport);
  const before = (await transfers(client)).length;

  // 1. callToolStream to a task, approved while the stream polls.
  const amount = 5000 + Math.floor(Math.random() * 1000);
  const stream = client.experimental.tasks.callToolStream(
    { name: 'transfer_funds', arguments: { to: 'acct-interop', amount, currency: 'USD' } },
    CallToolResultSchema, { task: { ttl: 600000 } });
  let taskId, result, approving;
  for await (const msg of stream) {
    if (msg.type === 'taskCreated') {
      taskId = msg.task.taskId;
      check('callToolStream: taskCreated', msg.task.status === 'working', `${taskId} ${msg.task.status}`);
      approving = passkey.approveNext(adminToken, { taskId });
    } else if (msg.type === 'result') {
      result = msg.result;
    } else if (msg.type === 'error') {
      throw msg.error;
    }
  }
  await approving;
  check('result read back after passkey approval', /approved-executed/.test(text(result)) && !result.isError, text(result).slice(0, 120));
  check('the transfer ran exactly once', (await transfers(client)).length === before + 1);

  // 2. tasks/get, tasks/result, tasks/list.
  const got = await client.experimental.tasks.getTask(taskId);
  check('tasks/get: completed', got.status === 'completed', got.status);
  const res2 = await client.experimental.tasks.getTaskResult(taskId, CallToolResultSchema);
  check('tasks/result: the same result', text(res2) === text(result));
  const list = await client.experimental.tasks.listTasks();
  check('tasks/list: contains the task', list.tasks.some((t) => t.taskId === taskId), `${list.tasks.length} tasks`);

  // 3. tasks/cancel on a pending task; the tool never runs.
  const stream2 = client.experimental.tasks.callToolStream(
    { name: 'transfer_funds', arguments: { to: 'acct-cancel', amount: amount + 1, currency: 'USD' } },
    CallToolResultSchema, { task: { ttl: 600000 } });
  const first = (await stream2.next()).value;
  const pendingId = first?.task?.taskId;
  check('second call: a task', first?.type === 'taskCreated', first?.type);
  await stream2.return();
  const cancelled = await client.experimental.tasks.cancelTask(pendingId);
  check('tasks/cancel: cancelled', cancelled.status === 'cancelled', cancelled.status);
  check('tasks/get after cancel: cancelled', (await client.experimental.tasks.getTask(pendingId)).status === 'cancelled');
  check('tasks/cancel on a terminal task: -32602', (await rpcCode(client.experimental.tasks.cancelTask(taskId))) === -32602);

  // 4. Unknown and foreign tasks answer alike: -32602.
  check('tasks/get unknown task: -32602', (await rpcCode(client.experimental.tasks.getTask('tsk_doesnotexist0000'))) === -32602);
  const other = await http('POST', `${base}/admin/v1/agents`, { name: `other-agent-${Date.now()}` }, adminToken);
  const foreign = await connect(other.token, 'countersign-interop-foreign');
  check('tasks/get foreign task: -32602', (await rpcCode(foreign.experimental.tasks.getTask(taskId))) === -32602);
  check('tasks/result foreign task: -32602', (await rpcCode(foreign.experimental.tasks.getTaskResult(taskId, CallToolResultSchema))) === -32602);
  check('tasks/cancel foreign task: -32602', (await rpcCode(foreign.experimental.tasks.cancelTask(taskId))) === -32602);
  const foreignList = await foreign.experimental.tasks.listTasks();
  check('tasks/list foreign: none of ours', !foreignList.tasks.some((t) => t.taskId === taskId));
  await foreign.close();

  // 5. A call without params.task: the task is opened all the same and the
  // answer says it has not run (sdk-plain.mjs follows that flow through).
  const n = (await transfers(client)).length;
  const plain = await client.callTool({ name: 'transfer_funds', arguments: { to: 'acct-plain', amount: amount + 2, currency: 'USD' } });
  check('no params.task: [approval-pending] isError result with a task', plain.isError === true &&
    /^\[approval-pending\]/.test(text(plain)) && typeof plain.structuredContent?.taskId === 'string', text(plain).slice(0, 120));
  check('no params.task: nothing executed', (await transfers(client)).length === n);
  await client.callTool({ name: 'countersign_cancel', arguments: { taskId: plain.structuredContent?.taskId } });
  await client.close();
} catch (e) {
  check('sdk run', false, e?.stack ?? String(e));
}
process.exit(failed() ? 1 : 0);
