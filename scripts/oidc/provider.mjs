// A real OpenID provider for the OAuth tests: the certified oidc-provider
// (npm, pinned in scripts/upstreams.sh), with client-credentials clients
// and resource indicators (RFC 8707) issuing JWT access tokens for the
// resource the client asks for:
//
//   agent-a        scopes mcp:tools and payments; its tokens carry the
//                  claim tenant: "acme"
//   agent-noscope  scope other only
//   agent-short    scope mcp:tools; its tokens live 2 seconds
//
//   node provider.mjs MODULES PORT RESOURCE KEYFILE
//
// MODULES is the node_modules holding oidc-provider; KEYFILE holds the
// private JWKS to sign with ({"keys":[…]}). The test restarts the provider
// with another KEYFILE to rotate the keys. Prints "ready" when listening.
import { join } from 'node:path';
import { readFileSync } from 'node:fs';
import { pathToFileURL } from 'node:url';

const [modules, port, resource, keyFile] = process.argv.slice(2);
const { default: Provider } = await import(pathToFileURL(join(modules, 'oidc-provider', 'lib', 'index.js')));
const issuer = `http://127.0.0.1:${port}`;
const jwks = JSON.parse(readFileSync(keyFile, 'utf8'));

const clients = [
  { client_id: 'agent-a', client_secret: 'secret-a', grant_types: ['client_credentials'],
    redirect_uris: [], response_types: [], scope: 'mcp:tools payments', id_token_signed_response_alg: 'ES256' },
  { client_id: 'agent-short', client_secret: 'secret-s', grant_types: ['client_credentials'],
    redirect_uris: [], response_types: [], scope: 'mcp:tools', id_token_signed_response_alg: 'ES256' },
  { client_id: 'agent-noscope', client_secret: 'secret-n', grant_types: ['client_credentials'],
    redirect_uris: [], response_types: [], scope: 'other', id_token_signed_response_alg: 'ES256' },
];

const provider = new Provider(issuer, {
  clients,
  jwks,
  scopes: ['mcp:tools', 'payments', 'other'],
  extraTokenClaims: (ctx, token) => (token.clientId === 'agent-a' ? { tenant: 'acme' } : undefined),
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => resource,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, indicator, client) => ({
        scope: 'mcp:tools payments other',
        audience: indicator,
        accessTokenFormat: 'jwt',
        accessTokenTTL: client.clientId === 'agent-short' ? 2 : 300,
        jwt: { sign: { alg: 'ES256' } },
      }),
    },
  },
});
provider.proxy = false;
provider.listen(Number(port), '127.0.0.1', () => console.log('ready'));
