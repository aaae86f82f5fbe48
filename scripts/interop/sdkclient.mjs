// What the TypeScript SDK client scripts (sdk-tasks.mjs, sdk-plain.mjs)
// share: the SDK loaded from INTEROP_SDK_DIR, the dev stack's tokens, one
// line per check, and an authenticated Streamable HTTP client.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

export const sdk = createRequire(path.join(process.env.INTEROP_SDK_DIR, 'package.json'));
export const { Client } = sdk('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = sdk('@modelcontextprotocol/sdk/client/streamableHttp.js');

export const [base, dataDir] = process.argv.slice(2);
const read = (f) => fs.readFileSync(path.join(dataDir, f), 'utf8').trim();
export const agentToken = read('agent-token');
export const adminToken = read('admin-token');

let failures = 0;
// check prints one line: "ok   NAME" or "FAIL NAME: DETAIL".
export const check = (name, ok, detail = '') => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? ': ' + detail : ''}`);
  if (!ok) failures++;
};
export const failed = () => failures;

// text joins a result's text blocks.
export const text = (r) => (r?.content ?? []).map((c) => c.text ?? '').join('\n');

// connect opens a client that declares no capabilities, with a bearer token.
export async function connect(token, name) {
  const client = new Client({ name, version: '1.0.0' }, { capabilities: {} });
  const transport = new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  await client.connect(transport);
  return client;
}

// transfers lists the demo ledger's transfers.
export async function transfers(client) {
  const r = await client.callTool({ name: 'list_transfers', arguments: {} });
  return r.structuredContent?.transfers ?? [];
}
