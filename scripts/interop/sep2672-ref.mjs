// The SEP-2672 reference implementation's integration scenarios
// (pinialt/mcp-verified-approval server/test), run against a real
// `countersign dev` with the same client stack the reference's tests use:
// the TypeScript SDK's Client over Streamable HTTP (2025-11-25) and the
// nid-webauthn-emulator software authenticator at the reference client's
// origin (http://localhost:5173, which dev accepts for in-band ceremonies).
// The only change is the bearer token Countersign requires.
//
// Usage: node sep2672-ref.mjs BASE_URL DATA_DIR
//   (INTEROP_SDK_DIR has the SDK, INTEROP_EMULATOR_DIR nid-webauthn-emulator)
// Prints one line per check; exits non-zero on any failure.
import fs from 'node:fs';
import path from 'node:path';
import { createRequire } from 'node:module';

const sdk = createRequire(path.join(process.env.INTEROP_SDK_DIR, 'package.json'));
const { Client } = sdk('@modelcontextprotocol/sdk/client/index.js');
const { StreamableHTTPClientTransport } = sdk('@modelcontextprotocol/sdk/client/streamableHttp.js');
const { McpError } = sdk('@modelcontextprotocol/sdk/types.js');
const { z } = sdk('zod');
const emu = createRequire(path.join(process.env.INTEROP_EMULATOR_DIR, 'package.json'))('nid-webauthn-emulator');
const WebAuthnEmulator = emu.default ?? emu.WebAuthnEmulator;
const { AuthenticatorEmulator, PasskeysCredentialsMemoryRepository } = emu;

const ORIGIN = 'http://localhost:5173';
const META = 'io.modelcontextprotocol/verified-approval';
const [base, dataDir] = process.argv.slice(2);
const agentToken = fs.readFileSync(path.join(dataDir, 'agent-token'), 'utf8').trim();

let failed = 0;
const check = (name, ok, detail = '') => {
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${name}${detail ? ': ' + detail : ''}`);
  if (!ok) failed++;
};
const reasonOf = (e) => (e instanceof McpError && e.code === -32001 ? e.data?.reason : `not -32001: ${e?.code} ${e?.message}`);

async function newClient(name) {
  const c = new Client({ name, version: '0.0.0' });
  await c.connect(new StreamableHTTPClientTransport(new URL(`${base}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${agentToken}` } },
  }));
  return c;
}
function newEmulator(opts = {}) {
  const repository = new PasskeysCredentialsMemoryRepository();
  const emulator = new WebAuthnEmulator(new AuthenticatorEmulator({ credentialsRepository: repository, ...opts }));
  return { emulator, repository };
}
const req = (c, method, params) => c.request(params === undefined ? { method } : { method, params }, z.any());
async function enroll(c, emulator) { // as the reference's helpers.ts
  const begin = await req(c, 'approval/enroll/begin');
  const response = emulator.createJSON(ORIGIN, begin.options);
  return req(c, 'approval/enroll/finish', { response });
}
const challenge = (c, args, toolName = 'place_trade') => req(c, 'approval/challenge/create', { toolName, arguments: args });
const call = (c, args, challengeId, response, method = 'webauthn') =>
  req(c, 'tools/call', { name: 'place_trade', arguments: args, _meta: { [META]: { method, challengeId, response } } });
const fails = (p) => p.then(() => 'succeeded', reasonOf);

async function run() {
  const c = await newClient('sep2672-reference-scenarios');
  try {
    // capability.test: extensions.verifiedApproval = {}
    const caps = c.getServerCapabilities();
    check('capability extensions.verifiedApproval declared as {}', JSON.stringify(caps?.extensions?.verifiedApproval) === '{}', JSON.stringify(caps?.extensions));
    const tools = await c.listTools();
    const pt = tools.tools.find((t) => t.name === 'place_trade');
    check('place_trade carries the verified-approval annotation', pt?._meta?.[META]?.required === 'verified', JSON.stringify(pt?._meta));

    // enrollment.test
    const { emulator, repository } = newEmulator({ signCounterIncrement: 1 });
    const b1 = await req(c, 'approval/enroll/begin');
    const registration = emulator.createJSON(ORIGIN, b1.options);
    const fin = await req(c, 'approval/enroll/finish', { response: registration });
    check('enrollment stores a credential', fin.success === true && typeof fin.credentialId === 'string' && !!fin.createdAt, JSON.stringify(fin));
    const again = await req(c, 'approval/enroll/begin');
    check('begin excludes the enrolled credential, requires user verification',
      again.options.excludeCredentials?.some((d) => d.id === fin.credentialId) && again.options.authenticatorSelection?.userVerification === 'required');
    // Re-enrolling the enrolled credential: with attestation "none" nothing
    // signs clientDataJSON, so a client can bypass excludeCredentials by
    // replaying its registration under the new challenge (SEP-2672 §4.4.2).
    const replayed = JSON.parse(JSON.stringify(registration));
    const rcd = JSON.parse(Buffer.from(replayed.response.clientDataJSON, 'base64url'));
    rcd.challenge = again.options.challenge;
    replayed.response.clientDataJSON = Buffer.from(JSON.stringify(rcd)).toString('base64url');
    const reenroll = replayed;
    const rr = await fails(req(c, 'approval/enroll/finish', { response: reenroll }));
    check('re-enrolling an enrolled credential: credential_already_enrolled', rr === 'credential_already_enrolled', rr);
    const fresh = newEmulator();
    const b2 = await req(c, 'approval/enroll/begin');
    const mutated = fresh.emulator.createJSON(ORIGIN, b2.options);
    const cd = JSON.parse(Buffer.from(mutated.response.clientDataJSON, 'base64url'));
    cd.challenge = Buffer.alloc(32, 7).toString('base64url');
    mutated.response.clientDataJSON = Buffer.from(JSON.stringify(cd)).toString('base64url');
    check('mutated clientDataJSON.challenge: verification_failed',
      (await fails(req(c, 'approval/enroll/finish', { response: mutated }))) === 'verification_failed');
    const foreign = fresh.emulator.createJSON('http://localhost:9999', b2.options);
    check('foreign origin: verification_failed',
      (await fails(req(c, 'approval/enroll/finish', { response: foreign }))) === 'verification_failed');

    // assertion.test: happy path, wire challenge shape
    const args = { symbol: 'AAPL', side: 'buy', quantity: 10, limit: 180 };
    const ch = await challenge(c, args);
    check('wire challenge is 86 base64url chars, userVerification required, allowCredentials non-empty',
      ch.requestOptions.challenge.length === 86 && ch.requestOptions.userVerification === 'required' && ch.requestOptions.allowCredentials?.length > 0);
    check('displayText', ch.displayText === 'Buy 10 AAPL at $180', ch.displayText);
    const res = await call(c, args, ch.challengeId, emulator.getJSON(ORIGIN, ch.requestOptions));
    check('happy path: the trade executes', res.structuredContent?.success === true && typeof res.structuredContent?.tradeId === 'string', JSON.stringify(res.structuredContent));

    // argument tampering
    const original = { symbol: 'AAPL', side: 'buy', quantity: 100, limit: 180 };
    const tch = await challenge(c, original);
    const tas = emulator.getJSON(ORIGIN, tch.requestOptions);
    check('argument tampering: argument_hash_mismatch',
      (await fails(call(c, { ...original, quantity: 1000 }, tch.challengeId, tas))) === 'argument_hash_mismatch');

    // replay
    const rargs = { symbol: 'AAPL', side: 'buy', quantity: 1, limit: 100 };
    const rch = await challenge(c, rargs);
    const ras = emulator.getJSON(ORIGIN, rch.requestOptions);
    const first = await call(c, rargs, rch.challengeId, ras);
    check('replay: first call runs', first.structuredContent?.success === true);
    check('replay: second is challenge_consumed', (await fails(call(c, rargs, rch.challengeId, ras))) === 'challenge_consumed');

    // unsupported method
    const mch = await challenge(c, rargs);
    check('evidence method "totp": unsupported_method',
      (await fails(call(c, rargs, mch.challengeId, emulator.getJSON(ORIGIN, mch.requestOptions), 'totp'))) === 'unsupported_method');

    // unannotated tool
    check('challenge for a tool without verified approval: tool_not_approved_required',
      (await fails(challenge(c, { to: 'x', amount: 1, currency: 'USD' }, 'transfer_funds'))) === 'tool_not_approved_required');

    // authenticator class: internal-only credential
    const internal = newEmulator({ transports: ['internal'] });
    await enroll(c, internal.emulator);
    const ich = await challenge(c, { symbol: 'ZZZ', side: 'buy', quantity: 1, limit: 1 });
    check('internal-only credential excluded from allowCredentials',
      !ich.requestOptions.allowCredentials.some((d) => (d.transports ?? []).length === 1 && d.transports[0] === 'internal'));
    const ias = internal.emulator.getJSON(ORIGIN, { ...ich.requestOptions, allowCredentials: undefined });
    const ireason = await fails(call(c, { symbol: 'ZZZ', side: 'buy', quantity: 1, limit: 1 }, ich.challengeId, ias));
    check('internal-only credential at verify: authenticator_class_mismatch', ireason === 'authenticator_class_mismatch', ireason);

    // signature counter regression
    const cargs = { symbol: 'GOOG', side: 'buy', quantity: 2, limit: 2780 };
    const c1 = await challenge(c, cargs);
    await call(c, cargs, c1.challengeId, emulator.getJSON(ORIGIN, c1.requestOptions));
    const stored = repository.loadCredentials()[0];
    stored.authenticatorData.signCount = 0;
    repository.saveCredential(stored);
    const c2 = await challenge(c, cargs);
    check('rewound signature counter: signature_counter_regression',
      (await fails(call(c, cargs, c2.challengeId, emulator.getJSON(ORIGIN, c2.requestOptions)))) === 'signature_counter_regression');
  } finally {
    await c.close();
  }
}

run().then(
  () => {
    console.log(failed === 0 ? 'all reference scenarios passed' : `${failed} failed`);
    process.exit(failed === 0 ? 0 : 1);
  },
  (e) => {
    console.log(`FAIL unexpected error: ${e?.stack ?? e}`);
    process.exit(1);
  },
);
