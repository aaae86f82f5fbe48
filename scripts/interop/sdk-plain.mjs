// The TypeScript SDK's Client (@modelcontextprotocol/sdk 1.32.2) WITHOUT
// tasks, as most agents run it, against a REAL gated tool on an
// authenticated `countersign dev`: a gated call answers [approval-pending]
// with a task ID, a software passkey approves it through the approver API,
// and countersign_await returns the final result; deny, cancel through
// countersign_cancel, countersign_pending, and a foreign or unknown task.
//
// Then a stdio-only client: the same Client over stdio through the mcp-remote
// bridge (INTEROP_MCP_REMOTE, the README's configuration), to the approval
// and back.
//
// Usage: node sdk-plain.mjs BASE_URL DATA_DIR   (INTEROP_SDK_DIR has the SDK)
// Prints one line per check; exits non-zero on any failure.
import fs from 'node:fs';
import path from 'node:path';
import { SoftwarePasskey, http } from './webauthn.mjs';
import { sdk, Client, base, dataDir, agentToken, adminToken, check, failed, text, connect, transfers } from './sdkclient.mjs';

const { StdioClientTransport } = sdk('@modelcontextprotocol/sdk/client/stdio.js');

// gated makes a gated call and checks that it is pending, not run.
async function gated(client, label, to, amount) {
  const r = await client.callTool({ name: 'transfer_funds', arguments: { to, amount, currency: 'USD' } });
  const s = r.structuredContent ?? {};
  check(`${label}: [approval-pending] with a task`,
    r.isError === true && text(r).startsWith('[approval-pending]') && /has NOT run/.test(text(r)) &&
      typeof s.taskId === 'string' && s.status === 'working' && /\/approve\/apr_/.test(s.approveUrl ?? '') && !!s.expiresAt &&
      !r._meta?.['io.modelcontextprotocol/tool-approval-disposition'],
    text(r).slice(0, 100));
  return s;
}

const await_ = (client, taskId, waitSeconds = 30) =>
  client.callTool({ name: 'countersign_await', arguments: { taskId, waitSeconds } });

try {
  const passkey = new SoftwarePasskey(base);
  await passkey.enroll(adminToken, `plain-approver-${Date.now()}`, ['approvers']);
  const client = await connect(agentToken, 'countersign-interop-plain');
  const tools = (await client.listTools()).tools.map((t) => t.name);
  check('tools/list offers the follow-up tools',
    ['countersign_await', 'countersign_cancel', 'countersign_pending'].every((n) => tools.includes(n)), tools.join(' '));
  const before = (await transfers(client)).length;
  const amount = 5000 + Math.floor(Math.random() * 1000);

  // 1. Approved with a passkey, then countersign_await.
  const t1 = await gated(client, 'gated call', 'acct-plain-ok', amount);
  check('nothing ran before the approval', (await transfers(client)).length === before);
  const waiting = await_(client, t1.taskId);
  await passkey.approveNext(adminToken, { taskId: t1.taskId });
  const done = await waiting;
  check('countersign_await (waiting while approved): approved-executed with the tool output',
    done.isError === false && text(done).startsWith('[approved-executed]') && /Transferred/.test(text(done)) &&
      done._meta?.['io.modelcontextprotocol/tool-approval-disposition'] === 'approved-executed',
    text(done).slice(0, 120));
  check('the transfer ran exactly once', (await transfers(client)).length === before + 1);

  // 2. Denied.
  const t2 = await gated(client, 'second gated call', 'acct-plain-no', amount + 1);
  const list = await passkey.pending(adminToken);
  const item = (Array.isArray(list) ? list : []).find((a) => a.taskId === t2.taskId);
  await passkey.decide(item.ref, 'deny');
  const denied = await await_(client, t2.taskId);
  check('deny: countersign_await says denied-not-executed', denied.isError === true && text(denied).startsWith('[denied-not-executed]'),
    text(denied).slice(0, 100));

  // 3. countersign_pending and countersign_cancel.
  const t3 = await gated(client, 'third gated call', 'acct-plain-cxl', amount + 2);
  const pend = await client.callTool({ name: 'countersign_pending', arguments: {} });
  check('countersign_pending lists it', (pend.structuredContent?.tasks ?? []).some((t) => t.taskId === t3.taskId));
  const other = await http('POST', `${base}/admin/v1/agents`, { name: `plain-other-${Date.now()}` }, adminToken);
  const foreign = await connect(other.token, 'countersign-interop-plain-foreign');
  const fa = await await_(foreign, t3.taskId, 0);
  const fu = await await_(foreign, 'tsk_doesnotexist0000', 0);
  check('foreign and unknown tasks answer alike ([unknown-task])',
    text(fa).startsWith('[unknown-task]') && text(fu).startsWith('[unknown-task]') &&
      text(fa).replace(t3.taskId, 'X') === text(fu).replace('tsk_doesnotexist0000', 'X'));
  const fc = await foreign.callTool({ name: 'countersign_cancel', arguments: { taskId: t3.taskId } });
  check('a foreign cancel changes nothing', text(fc).startsWith('[unknown-task]'));
  await foreign.close();
  const c = await client.callTool({ name: 'countersign_cancel', arguments: { taskId: t3.taskId } });
  check('countersign_cancel: cancelled', c.isError === false && text(c).startsWith('[cancelled]'), text(c).slice(0, 100));
  const after = await await_(client, t3.taskId, 5);
  check('countersign_await after the cancel: did NOT run', after.isError === true && text(after).startsWith('[cancelled]'));
  check('only the approved call ran', (await transfers(client)).length === before + 1);

  // 4. Bad arguments are a protocol error that names the problem.
  let bad;
  try { await client.callTool({ name: 'countersign_await', arguments: { taskId: t1.taskId, waitSeconds: 600 } }); bad = 'no error'; }
  catch (e) { bad = `${e.code} ${e.message}`; }
  check('waitSeconds out of range: -32602', /-32602.*waitSeconds/.test(bad), bad);
  await client.close();

  // 5. A stdio-only client through the mcp-remote bridge, configured as the
  // README shows: the same approval flow end to end.
  if (process.env.INTEROP_MCP_REMOTE) {
    const bridged = new Client({ name: 'countersign-interop-stdio', version: '1.0.0' }, { capabilities: {} });
    await bridged.connect(new StdioClientTransport({
      command: process.execPath,
      args: [process.env.INTEROP_MCP_REMOTE, `${base}/mcp`, '--transport', 'http-only', '--header', `Authorization:Bearer ${agentToken}`],
      env: { ...process.env, MCP_REMOTE_CONFIG_DIR: fs.mkdtempSync(path.join(dataDir, 'mcp-remote-')) },
      stderr: 'ignore',
    }));
    const t5 = await gated(bridged, 'stdio client through mcp-remote', 'acct-plain-stdio', amount + 3);
    const w5 = await_(bridged, t5.taskId);
    await passkey.approveNext(adminToken, { taskId: t5.taskId });
    const d5 = await w5;
    check('stdio client through mcp-remote: countersign_await approved-executed',
      d5.isError === false && text(d5).startsWith('[approved-executed]'), text(d5).slice(0, 100));
    await bridged.close();
  }
} catch (e) {
  check('sdk run', false, e?.stack ?? String(e));
}
process.exit(failed() ? 1 : 0);
