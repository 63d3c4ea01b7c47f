-- Browsers' web sessions, for every proxy: a browser behind a load balancer may reach any
-- proxy, which finds its session here by the SHA-256 of the cookie's id (the id is never
-- stored). A row holds the session's user certificate and its private key, as this database
-- holds the CA keys. `ended` keeps a session that ended (signed out, locked, idle, evicted) a
-- minute longer, with its close code and message, so that every proxy ends its terminals with
-- the same words; `ended_ms` is 0 while it lives.
CREATE TABLE web_sessions (
    id_hash       TEXT PRIMARY KEY,
    user_name     TEXT NOT NULL,
    proxy         TEXT NOT NULL,
    roles         TEXT NOT NULL,
    logins        TEXT NOT NULL,
    cert_chain    TEXT NOT NULL,
    private_key   TEXT NOT NULL,
    csrf_token    TEXT NOT NULL,
    created_ms    BIGINT NOT NULL,
    last_input_ms BIGINT NOT NULL,
    idle_ms       BIGINT NOT NULL,
    expires       BIGINT NOT NULL,
    valid_until   TEXT NOT NULL,
    ended_ms      BIGINT NOT NULL DEFAULT 0,
    ended_code    BIGINT NOT NULL DEFAULT 0,
    ended_message TEXT NOT NULL DEFAULT ''
);
CREATE INDEX web_sessions_user ON web_sessions (user_name, ended_ms, created_ms);
CREATE INDEX web_sessions_created ON web_sessions (ended_ms, created_ms);

-- A browser's SSO sign-in waiting for the browser to come back to a proxy's finishing page,
-- by the SHA-256 of its binding cookie: the secret its response is redeemed with and the web
-- session's key. Any proxy finishes it.
CREATE TABLE web_sso_pending (
    binding_hash TEXT PRIMARY KEY,
    client_key   TEXT NOT NULL,
    private_key  TEXT NOT NULL,
    created      BIGINT NOT NULL,
    expires      BIGINT NOT NULL
);
CREATE INDEX web_sso_pending_created ON web_sso_pending (created);

-- The source (address, an IPv6 /64 as one) a started SSO login came from: its cap per source
-- is counted here, so every auth instance enforces one cap.
ALTER TABLE oidc_requests ADD COLUMN source TEXT NOT NULL DEFAULT '';
CREATE INDEX oidc_requests_pending ON oidc_requests (used, source, expires);
