// Server CPU per SEP-2672 ceremony (issue 12): approval/challenge/create,
// then tools/call place_trade with the passkey's assertion, against a
// running `countersign dev`, with the client stack of the reference's
// scenarios (scripts/interop/sep2672-ref.mjs): the TypeScript SDK's Client
// over Streamable HTTP and the nid-webauthn-emulator software authenticator.
//
// Server CPU is utime+stime of the server process from /proc/PID/stat,
// read before and after each phase (the dev process holds the embedded
// Temporal and NATS too, so this is the whole server). Phases:
//   warm-up-challenge  W challenges, not counted
//   idle       IDLE_SECONDS without requests: the server's background CPU
//   challenge  N approval/challenge/create alone (the ceremony's fixed
//              cost), before any workflow ran, so no workflow's trailing
//              work (Temporal visibility, timers) lands in it
//   warm-up    W ceremonies, not counted
//   ceremony   N ceremonies, one after the other
//   ceremony-c4  N ceremonies over 4 clients (CONCURRENCY=4; 0 skips)
//
// Usage: node sep2672-cpu.mjs BASE_URL DATA_DIR SERVER_PID
//   env: N (2000), WARMUP (200), IDLE_SECONDS (10), CONCURRENCY (4; 0 skips), CLK_TCK (100),
//        PHASE_FILE (the current phase's name is written there),
//        INTEROP_SDK_DIR, INTEROP_EMULATOR_DIR
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const sdk = createRequire(path.join(process.env.INTEROP_SDK_DIR, 'package.json'));
const { Client } = sdk('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = sdk('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { z } = sdk('zod');
const emu = createRequire(path.join(process.env.INTEROP_EMULATOR_DIR, 'package.json'))('nid-webauthn-emulator');
const WebAuthnEmulator = emu.default ?? emu.WebAuthnEmulator;
const { AuthenticatorEmulator, PasskeysCredentialsMemoryRepository } = emu;

const ORIGIN = 'http://localhost:5173';
const META = 'io.modelcontextprotocol/verified-approval';
const [base, dataDir, pidArg] = process.argv.slice(2);
const pid = Number(pidArg);
const N = Number(process.env.N ?? 2000);
const WARMUP = Number(process.env.WARMUP ?? 200);
const IDLE_S = Number(process.env.IDLE_SECONDS ?? 10);
const CONC = Number(process.env.CONCURRENCY ?? 4);
const TCK = Number(process.env.CLK_TCK ?? 100);
const agentToken = fs.readFileSync(path.join(dataDir, 'agent-token'), 'utf8').trim();

// SERVICES_PID, when set, is the process that holds Temporal and NATS
// outside the server (EXTERNAL=1 in sep2672-cpu.sh): its CPU is reported
// beside the server's.
const servicesPid = Number(process.env.SERVICES_PID || 0);

// cpuOf is a process's user and system CPU so far, in ms.
function cpuOf(p) {
  const stat = fs.readFileSync(`/proc/${p}/stat`, 'utf8');
  const f = stat.slice(stat.lastIndexOf(')') + 2).split(' '); // f[0] is field 3 (state)
  const utime = Number(f[11]), stime = Number(f[12]); // fields 14 and 15
  return { user: (utime * 1000) / TCK, sys: (stime * 1000) / TCK };
}
// serverCPU is the server's user and system CPU so far, in ms.
const serverCPU = () => cpuOf(pid);
const servicesCPU = () => (servicesPid ? cpuOf(servicesPid) : { user: 0, sys: 0 });
const clientCPU = () => { const u = process.cpuUsage(); return (u.user + u.system) / 1000; };

async function newClient(name) {
  const c = new Client({ name, version: '0.0.0' });
  await c.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${agentToken}` } },
  }));
  return c;
}
const req = (c, method, params) => c.request({ method, ...(params === undefined ? {} : { params }) }, z.any());

async function enrolled(c) {
  const emulator = new WebAuthnEmulator(new AuthenticatorEmulator({
    credentialsRepository: new PasskeysCredentialsMemoryRepository(), signCounterIncrement: 1,
  }));
  const begin = await req(c, 'approval/enroll/begin');
  await req(c, 'approval/enroll/finish', { response: emulator.createJSON(ORIGIN, begin.options) });
  return emulator;
}

let seq = 0;
const argsFor = () => ({ symbol: 'AAPL', side: 'buy', quantity: 1 + (seq++ % 1000), limit: 180 });
const challenge = (c, args) => req(c, 'approval/challenge/create', { toolName: 'place_trade', arguments: args });

async function ceremony(c, emulator) {
  const args = argsFor();
  const ch = await challenge(c, args);
  const response = emulator.getJSON(ORIGIN, ch.requestOptions);
  const res = await req(c, 'tools/call', {
    name: 'place_trade', arguments: args,
    _meta: { [META]: { method: 'webauthn', challengeId: ch.challengeId, response } },
  });
  if (res.structuredContent?.success !== true) throw new Error(`ceremony did not execute: ${JSON.stringify(res)}`);
}

const pct = (xs, p) => { const s = [...xs].sort((a, b) => a - b); return s[Math.min(s.length - 1, Math.ceil((p / 100) * s.length) - 1)]; };

// phase runs n operations over `workers` (each [client, emulator]) and
// reports the server's CPU per operation and the wall time per operation.
async function phase(name, n, workers, op) {
  if (process.env.PHASE_FILE) fs.writeFileSync(process.env.PHASE_FILE, `${name}\n`); // for a profiler
  const lat = [];
  let next = 0;
  const s0 = serverCPU(), x0 = servicesCPU(), c0 = clientCPU(), t0 = performance.now();
  await Promise.all(workers.map(async (w) => {
    while (next < n) {
      next++;
      const t = performance.now();
      await op(...w);
      lat.push(performance.now() - t);
    }
  }));
  const wall = performance.now() - t0, s1 = serverCPU(), x1 = servicesCPU(), c1 = clientCPU();
  const user = s1.user - s0.user, sys = s1.sys - s0.sys;
  const r = {
    phase: name, n, concurrency: workers.length,
    serverCpuMsPerOp: +((user + sys) / n).toFixed(3),
    serverUserMsPerOp: +(user / n).toFixed(3), serverSysMsPerOp: +(sys / n).toFixed(3),
    serverCpuCores: +((user + sys) / wall).toFixed(2),
    clientCpuMsPerOp: +((c1 - c0) / n).toFixed(3),
    ...(servicesPid ? { servicesCpuMsPerOp: +((x1.user + x1.sys - x0.user - x0.sys) / n).toFixed(3) } : {}),
    wallP50Ms: +pct(lat, 50).toFixed(2), wallP95Ms: +pct(lat, 95).toFixed(2),
    perSecond: +((n * 1000) / wall).toFixed(1),
  };
  console.log(JSON.stringify(r));
  return r;
}

// idle reports the server's CPU while no request is made: the background
// (Temporal's and NATS's timers) that every phase also includes.
async function idle(seconds) {
  if (process.env.PHASE_FILE) fs.writeFileSync(process.env.PHASE_FILE, 'idle\n');
  const s0 = serverCPU(), x0 = servicesCPU();
  await new Promise((r) => setTimeout(r, seconds * 1000));
  const s1 = serverCPU(), x1 = servicesCPU();
  const ms = s1.user + s1.sys - s0.user - s0.sys;
  console.log(JSON.stringify({ phase: 'idle', seconds, serverCpuMsPerSecond: +(ms / seconds).toFixed(2),
    ...(servicesPid ? { servicesCpuMsPerSecond: +((x1.user + x1.sys - x0.user - x0.sys) / seconds).toFixed(2) } : {}) }));
}

async function main() {
  const c = await newClient('sep2672-cpu');
  const emulator = await enrolled(c);
  const one = [[c, emulator]];
  const challengeOnly = (cl) => challenge(cl, argsFor());
  await phase('warm-up-challenge', WARMUP, one, challengeOnly);
  await idle(IDLE_S);
  await phase('challenge', N, one, challengeOnly);
  await phase('warm-up', WARMUP, one, ceremony);
  await phase('ceremony', N, one, ceremony);
  if (CONC > 1) {
    const ws = [[c, emulator]];
    for (let i = 1; i < CONC; i++) { const ci = await newClient(`sep2672-cpu-${i}`); ws.push([ci, await enrolled(ci)]); }
    await phase(`ceremony-c${CONC}`, N, ws, ceremony);
    for (const [ci] of ws.slice(1)) await ci.close();
  }
  await c.close();
  if (process.env.PHASE_FILE) fs.writeFileSync(process.env.PHASE_FILE, 'done\n');
}

main().then(() => process.exit(0), (e) => { console.error(`FAIL ${e?.stack ?? e}`); process.exit(1); });
