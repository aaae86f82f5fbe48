// SEP-2672 §4.6 interop vectors computed independently of Countersign, with
// the reference implementation's canonicalization (npm canonicalize, by the
// author of RFC 8785) and Node's SHA-256:
//
//   canonical = canonicalize(JSON.parse(arguments))
//   actionHash = SHA-256(utf8(tool) 0x00 utf8(canonical) 0x00 utf8(serverId))
//   wireChallenge = base64url(nonce || actionHash)
//
// Usage: node sep2672-vectors.mjs INPUTS.json > VECTORS.json (with
// INTEROP_CANON_DIR naming the directory where canonicalize is installed).
// internal/canon's TestInteropVectors checks Countersign against the output.
import { readFileSync } from "node:fs";
import { createHash } from "node:crypto";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

// canonicalize is pure ESM: import its entry point from where it is installed.
const entry = join(process.env.INTEROP_CANON_DIR, "node_modules", "canonicalize", "lib", "canonicalize.js");
const mod = await import(pathToFileURL(entry).href);
const canonicalize = mod.default ?? mod.canonicalize;

const serverId = "https://countersign.example/sep2672-interop";
// A fixed nonce, so the wire challenge is a vector too (real nonces come
// from a CSPRNG).
const nonce = Buffer.from(Array.from({ length: 32 }, (_, i) => i));

const inputs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = inputs.map(({ name, tool, arguments: args }) => {
  const canonical = canonicalize(JSON.parse(args));
  const hash = createHash("sha256")
    .update(Buffer.concat([Buffer.from(tool, "utf8"), Buffer.from([0]), Buffer.from(canonical, "utf8"), Buffer.from([0]), Buffer.from(serverId, "utf8")]))
    .digest();
  return {
    name,
    tool,
    arguments: args,
    serverId,
    canonical,
    actionHash: hash.toString("hex"),
    nonce: nonce.toString("hex"),
    wireChallenge: Buffer.concat([nonce, hash]).toString("base64url"),
  };
});
process.stdout.write(JSON.stringify(out, null, 2) + "\n");
