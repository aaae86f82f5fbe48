// A tiny software passkey for interop tests: a P-256 key in node:crypto that
// answers Countersign's enrollment (attestation "none") and approval
// challenges (assertions with user presence and verification), talking to
// the approver and admin HTTP APIs. No dependencies beyond Node 22.
import { createHash, generateKeyPairSync, randomBytes, sign } from 'node:crypto';

const b64u = (buf) => Buffer.from(buf).toString('base64url');
const sha256 = (b) => createHash('sha256').update(b).digest();

// Minimal CBOR for the attestation object and COSE key: maps, text and byte
// strings, small negative and positive integers.
function cborHead(major, n) {
  if (n < 24) return Buffer.from([(major << 5) | n]);
  if (n < 256) return Buffer.from([(major << 5) | 24, n]);
  const b = Buffer.alloc(3); b[0] = (major << 5) | 25; b.writeUInt16BE(n, 1); return b;
}
function cbor(v) {
  if (typeof v === 'number') return v >= 0 ? cborHead(0, v) : cborHead(1, -1 - v);
  if (typeof v === 'string') { const b = Buffer.from(v, 'utf8'); return Buffer.concat([cborHead(3, b.length), b]); }
  if (Buffer.isBuffer(v)) return Buffer.concat([cborHead(2, v.length), v]);
  if (v instanceof Map) {
    const parts = [cborHead(5, v.size)];
    for (const [k, x] of v) parts.push(cbor(k), cbor(x));
    return Buffer.concat(parts);
  }
  throw new Error('cbor: unsupported value');
}

async function http(method, url, body, token) {
  const headers = { 'Content-Type': 'application/json' };
  if (token) headers.Authorization = `Bearer ${token}`;
  const res = await fetch(url, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await res.text();
  let json; try { json = JSON.parse(text); } catch { json = text; }
  if (!res.ok) throw new Error(`${method} ${url}: HTTP ${res.status}: ${text}`);
  return json;
}

export class SoftwarePasskey {
  constructor(baseURL) {
    this.base = baseURL.replace(/\/$/, '');
    this.origin = new URL(this.base).origin;
    const { privateKey, publicKey } = generateKeyPairSync('ec', { namedCurve: 'P-256' });
    this.priv = privateKey;
    this.jwk = publicKey.export({ format: 'jwk' });
    this.credId = randomBytes(32);
    this.counter = 0;
  }

  // enroll creates an approver through the admin API and registers this key.
  async enroll(adminToken, name, groups) {
    const ap = await http('POST', `${this.base}/admin/v1/approvers`, { name, groups }, adminToken);
    const token = new URL(ap.enrollUrl).pathname.split('/').filter(Boolean).pop();
    const begin = await http('POST', `${this.base}/approver/v1/enrollments/${token}/begin`, {});
    const pk = (begin.options ?? begin).publicKey;
    this.rpId = pk.rp.id ?? new URL(this.base).hostname;
    this.userHandle = pk.user.id; // base64url, as sent
    const clientData = Buffer.from(JSON.stringify({ type: 'webauthn.create', challenge: pk.challenge, origin: this.origin, crossOrigin: false }));
    const cose = cbor(new Map([[1, 2], [3, -7], [-1, 1],
      [-2, Buffer.from(this.jwk.x, 'base64url')], [-3, Buffer.from(this.jwk.y, 'base64url')]]));
    const idLen = Buffer.alloc(2); idLen.writeUInt16BE(this.credId.length);
    const authData = Buffer.concat([sha256(this.rpId), Buffer.from([0x45]), Buffer.alloc(4),
      Buffer.alloc(16), idLen, this.credId, cose]);
    const att = cbor(new Map([['fmt', 'none'], ['attStmt', new Map()], ['authData', authData]]));
    const response = {
      id: b64u(this.credId), rawId: b64u(this.credId), type: 'public-key',
      authenticatorAttachment: 'platform',
      response: { clientDataJSON: b64u(clientData), attestationObject: b64u(att), transports: ['internal'] },
      clientExtensionResults: {},
    };
    await http('POST', `${this.base}/approver/v1/enrollments/${token}/finish`, { response });
    this.approverId = ap.approverId;
    return ap.approverId;
  }

  // assertion signs a request-options challenge.
  assertion(requestOptions) {
    const pk = requestOptions.publicKey ?? requestOptions;
    this.counter++;
    const cnt = Buffer.alloc(4); cnt.writeUInt32BE(this.counter);
    const authData = Buffer.concat([sha256(pk.rpId ?? this.rpId), Buffer.from([0x05]), cnt]);
    const clientData = Buffer.from(JSON.stringify({ type: 'webauthn.get', challenge: pk.challenge, origin: this.origin, crossOrigin: false }));
    const sig = sign('sha256', Buffer.concat([authData, sha256(clientData)]), { key: this.priv, dsaEncoding: 'der' });
    return {
      id: b64u(this.credId), rawId: b64u(this.credId), type: 'public-key',
      authenticatorAttachment: 'platform',
      response: { clientDataJSON: b64u(clientData), authenticatorData: b64u(authData), signature: b64u(sig), userHandle: this.userHandle },
      clientExtensionResults: {},
    };
  }

  // decide approves (or denies) the approval ref with a fresh challenge.
  async decide(ref, decision = 'approve') {
    const ch = await http('POST', `${this.base}/approver/v1/approvals/${ref}/challenge`, { decision });
    return http('POST', `${this.base}/approver/v1/approvals/${ref}/decision`,
      { challengeId: ch.challengeId, decision, response: this.assertion(ch.requestOptions) });
  }

  // pending lists pending approvals (admin API).
  async pending(adminToken) {
    return http('GET', `${this.base}/admin/v1/approvals?status=pending`, undefined, adminToken);
  }

  // approveNext waits for a pending approval of tool (optionally for taskId)
  // and approves it.
  async approveNext(adminToken, { tool, taskId, timeoutMs = 60000 } = {}) {
    const until = Date.now() + timeoutMs;
    while (Date.now() < until) {
      const list = await this.pending(adminToken);
      const item = (Array.isArray(list) ? list : list.approvals ?? []).find((a) =>
        (!tool || a.tool === tool) && (!taskId || a.taskId === taskId));
      if (item) {
        const res = await this.decide(item.ref, 'approve');
        if (!res.accepted) throw new Error(`approval of ${item.ref} rejected: ${res.reason}`);
        return item;
      }
      await new Promise((r) => setTimeout(r, 200));
    }
    throw new Error(`no pending approval for ${tool ?? 'any tool'} within ${timeoutMs} ms`);
  }
}

export { http };
