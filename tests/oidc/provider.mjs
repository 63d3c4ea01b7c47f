// A real OpenID provider for Sallyport's SSO tests: the npm package `oidc-provider`, on
// loopback, with one confidential client (PKCE required) and users whose claims carry `email`
// and `groups`. Its login form is oidc-provider's own development interaction (any password;
// the login name picks the account, and the login name is the account's `sub`). Prints
// `ready <issuer>` once listening.
//
// The provider runs with the library's defaults, as real providers do: for the code flow the
// ID token carries `sub` and the protocol claims only, and `email`, `groups` and the rest are
// answered at the UserInfo endpoint (OpenID Connect Core 5.4). With CLAIMS_IN_ID_TOKEN=1 it is
// the other kind of provider: claims in the ID token and no UserInfo endpoint at all.
//
// `POST /test/users/<login>` with a JSON body replaces that account's claims (a person whose
// email changes at the provider); it is this fixture's, not the library's.
//
// With HOSTILE_PORT set it also serves a second issuer that follows the wire protocol but signs
// ID tokens wrong on purpose (wrong audience, expired, bad signature, wrong nonce, an
// algorithm off the allow-list, an authorized party (`azp`) that is another client, several
// audiences without `azp`, a UserInfo answer about another subject; or, `rotated`, a new
// signing key published after Sallyport cached the old one), chosen with
// `POST /scenario/<name>`: the real provider never does these things, and Sallyport must
// refuse each one. Its ID tokens carry the claims, and its UserInfo repeats them.
//
// Environment: PORT, CLIENT_ID, CLIENT_SECRET, REDIRECT_URI, USERS (JSON
// {"alice": {"email": ..., "email_verified": true, "groups": [...]}}; `email_verified`
// defaults to true), CLAIMS_IN_ID_TOKEN (optional), HOSTILE_PORT (optional), ISSUER_HOST
// (optional, default 127.0.0.1).
import http from 'node:http';
import crypto from 'node:crypto';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const port = Number(process.env.PORT);
// ISSUER_HOST=localhost makes the provider another site than a proxy on 127.0.0.1 (for a
// browser's SameSite rules), as a real provider is; it still listens on 127.0.0.1.
const issuer = `http://${process.env.ISSUER_HOST || '127.0.0.1'}:${port}`;
const users = JSON.parse(process.env.USERS || '{}');
const claimsInIdToken = process.env.CLAIMS_IN_ID_TOKEN === '1';
const client = {
  client_id: process.env.CLIENT_ID,
  client_secret: process.env.CLIENT_SECRET,
  redirect_uris: [process.env.REDIRECT_URI],
  grant_types: ['authorization_code'],
  response_types: ['code'],
  token_endpoint_auth_method: 'client_secret_basic',
};

const provider = new Provider(issuer, {
  clients: [client],
  pkce: { required: () => true },
  scopes: ['openid', 'email', 'profile', 'groups'],
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name'],
    groups: ['groups'],
  },
  ...(claimsInIdToken ? { conformIdTokenClaims: false } : {}),
  cookies: { keys: ['sallyport-test-cookie-key'] },
  features: {
    devInteractions: { enabled: true },
    ...(claimsInIdToken ? { userinfo: { enabled: false } } : {}),
  },
  async findAccount(ctx, id) {
    if (!users[id]) return undefined;
    return {
      accountId: id,
      async claims() {
        // Read at each request, so a change through /test/users is what the next login sees.
        const u = users[id];
        return {
          sub: id, email: u.email, email_verified: u.email_verified ?? true, name: id,
          groups: u.groups || [],
        };
      },
    };
  },
});
provider.proxy = false;
const handle = provider.callback();
http.createServer(async (req, res) => {
  const m = req.url.match(/^\/test\/users\/([^/?]+)$/);
  if (m && req.method === 'POST') {
    let body = '';
    for await (const chunk of req) body += chunk;
    users[decodeURIComponent(m[1])] = JSON.parse(body);
    res.writeHead(200, { 'content-type': 'application/json' });
    return res.end('{}');
  }
  return handle(req, res);
}).listen(port, '127.0.0.1', () => console.log(`ready ${issuer}`));

if (process.env.HOSTILE_PORT) {
  const hport = Number(process.env.HOSTILE_PORT);
  const hissuer = `http://127.0.0.1:${hport}`;
  const { privateKey, publicKey } = await jose.generateKeyPair('RS256');
  const { privateKey: strangerKey } = await jose.generateKeyPair('RS256');
  const { privateKey: newKey, publicKey: newPublic } = await jose.generateKeyPair('RS256');
  const jwk = { ...(await jose.exportJWK(publicKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
  const newJwk = { ...(await jose.exportJWK(newPublic)), kid: 'k2', alg: 'RS256', use: 'sig' };
  // `rotated`: the provider starts signing with a new key (kid k2) and publishes it.
  let rotated = false;
  let scenario = 'ok';
  const codes = new Map();
  const accessTokens = new Set();
  const person = { sub: 'alice', email: 'alice@example.com', groups: ['admins'] };
  const send = (res, status, body, headers = {}) => {
    res.writeHead(status, { 'content-type': 'application/json', ...headers });
    res.end(typeof body === 'string' ? body : JSON.stringify(body));
  };
  http.createServer(async (req, res) => {
    const url = new URL(req.url, hissuer);
    if (url.pathname === '/.well-known/openid-configuration') {
      return send(res, 200, {
        issuer: hissuer,
        authorization_endpoint: `${hissuer}/auth`,
        token_endpoint: `${hissuer}/token`,
        jwks_uri: `${hissuer}/jwks`,
        userinfo_endpoint: `${hissuer}/userinfo`,
        response_types_supported: ['code'],
        subject_types_supported: ['public'],
        id_token_signing_alg_values_supported: ['RS256'],
      });
    }
    if (url.pathname === '/userinfo') {
      const token = (req.headers.authorization || '').replace(/^Bearer /, '');
      if (!accessTokens.has(token)) return send(res, 401, { error: 'invalid_token' });
      return send(res, 200, scenario === 'userinfo-other-sub' ? { ...person, sub: 'mallory' } : person);
    }
    if (url.pathname === '/jwks') return send(res, 200, { keys: rotated ? [jwk, newJwk] : [jwk] });
    if (url.pathname.startsWith('/scenario/') && req.method === 'POST') {
      scenario = url.pathname.slice('/scenario/'.length);
      if (scenario === 'rotated') rotated = true;
      return send(res, 200, { scenario });
    }
    if (url.pathname === '/auth') {
      // Signs in at once as alice and sends the browser back with a code.
      const code = crypto.randomBytes(16).toString('hex');
      codes.set(code, { nonce: url.searchParams.get('nonce'), clientId: url.searchParams.get('client_id') });
      const back = new URL(url.searchParams.get('redirect_uri'));
      back.searchParams.set('code', code);
      back.searchParams.set('state', url.searchParams.get('state'));
      res.writeHead(302, { location: back.toString() });
      return res.end();
    }
    if (url.pathname === '/token' && req.method === 'POST') {
      let body = '';
      for await (const chunk of req) body += chunk;
      const form = new URLSearchParams(body);
      const grant = codes.get(form.get('code'));
      codes.delete(form.get('code'));
      if (!grant) return send(res, 400, { error: 'invalid_grant' });
      const now = Math.floor(Date.now() / 1000);
      let claims = {
        iss: hissuer, aud: grant.clientId, iat: now, exp: now + 300, nonce: grant.nonce, ...person,
      };
      let key = privateKey;
      let alg = 'RS256';
      let kid = 'k1';
      if (scenario === 'rotated') { key = newKey; kid = 'k2'; }
      if (scenario === 'wrong-aud') claims.aud = 'someone-else';
      if (scenario === 'expired') { claims.iat = now - 7200; claims.exp = now - 3600; }
      if (scenario === 'wrong-nonce') claims.nonce = 'not-the-nonce';
      if (scenario === 'wrong-issuer') claims.iss = 'http://127.0.0.1:1';
      if (scenario === 'bad-signature') key = strangerKey;
      if (scenario === 'wrong-azp') claims.azp = 'someone-else';
      if (scenario === 'several-aud-no-azp') claims.aud = [grant.clientId, 'another-api'];
      let idToken;
      if (scenario === 'alg-none') {
        const enc = (o) => Buffer.from(JSON.stringify(o)).toString('base64url');
        idToken = `${enc({ alg: 'none', kid: 'k1' })}.${enc(claims)}.`;
      } else {
        idToken = await new jose.SignJWT(claims).setProtectedHeader({ alg, kid }).sign(key);
      }
      const accessToken = crypto.randomBytes(16).toString('hex');
      accessTokens.add(accessToken);
      return send(res, 200, { access_token: accessToken, token_type: 'Bearer', expires_in: 300, id_token: idToken });
    }
    send(res, 404, { error: 'not_found' });
  }).listen(hport, '127.0.0.1', () => console.log(`hostile ${hissuer}`));
}
