-- Single sign-on: OpenID Connect connectors (the spec as JSON, secret included: the database
-- is 0600 like the CA keys it holds) and logins in flight (one row per started login; the
-- state is stored hashed and claimed once; the result waits for `sally` to redeem it).
CREATE TABLE connectors (
    name    TEXT PRIMARY KEY,
    kind    TEXT NOT NULL,
    spec    TEXT NOT NULL,
    created BIGINT NOT NULL
);

CREATE TABLE oidc_requests (
    state_hash      TEXT PRIMARY KEY,
    connector       TEXT NOT NULL,
    nonce           TEXT NOT NULL,
    pkce_verifier   TEXT NOT NULL,
    client_redirect TEXT NOT NULL,
    client_key_hash TEXT NOT NULL,
    ssh_public_key  TEXT NOT NULL,
    ttl_secs        BIGINT,
    expires         BIGINT NOT NULL,
    used            BIGINT NOT NULL DEFAULT 0,
    response_hash   TEXT,
    result          TEXT
);
CREATE INDEX oidc_requests_response ON oidc_requests (response_hash);
