// The proxy's web API. The CSRF token lives in this module's memory only (never in storage):
// a new page load reads it again from GET /v1/webapi/web/session.

let session = null;

export function current() { return session; }
export function forget() { session = null; }

export class ApiError extends Error {
  constructor(status, message, body = null) {
    super(message);
    this.status = status;
    /** The answer's JSON, when it had one (the role editor's 400 lists `errors`). */
    this.body = body;
  }
}

/** One call: JSON in and out; non-GET carries the CSRF token. Throws ApiError. */
export async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  if (method !== 'GET' && session) headers['X-CSRF-Token'] = session.csrf_token;
  let resp;
  try {
    resp = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: 'same-origin',
      cache: 'no-store',
    });
  } catch (e) {
    throw new ApiError(0, 'the proxy cannot be reached; check your connection and try again');
  }
  let json = null;
  try { json = await resp.json(); } catch (e) { json = null; }
  if (!resp.ok) {
    const message = (json && typeof json.error === 'string') ? json.error : `the proxy answered ${resp.status}`;
    throw new ApiError(resp.status, message, json);
  }
  return json;
}

/** Reads the session (null when not signed in). */
export async function loadSession() {
  try {
    session = await api('GET', '/v1/webapi/web/session');
  } catch (e) {
    if (e.status !== 401) throw e;
    session = null;
  }
  return session;
}

export async function signIn(user, password, totp) {
  const body = { user, password };
  if (totp) body.totp = totp;
  session = await api('POST', '/v1/webapi/web/login', body);
  return session;
}

export async function signOut() {
  try {
    await api('DELETE', '/v1/webapi/web/session');
  } finally {
    session = null;
  }
}
