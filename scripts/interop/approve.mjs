// Enrolls a fresh software passkey as an approver, then approves the next
// pending approval of TOOL (used while another client waits on its task).
// Usage: node approve.mjs BASE_URL DATA_DIR TOOL [TIMEOUT_MS]
import fs from 'node:fs';
import path from 'node:path';
import { SoftwarePasskey } from './webauthn.mjs';

const [base, dataDir, tool, timeout = '60000'] = process.argv.slice(2);
const admin = fs.readFileSync(path.join(dataDir, 'admin-token'), 'utf8').trim();
const p = new SoftwarePasskey(base);
await p.enroll(admin, `interop-approver-${process.pid}-${Date.now()}`, ['approvers']);
const item = await p.approveNext(admin, { tool, timeoutMs: Number(timeout) });
console.log(`approved ${item.ref} (task ${item.taskId}, ${item.tool})`);
