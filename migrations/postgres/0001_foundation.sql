-- The foundation: cluster state, certificate authorities, users, sign-up tokens, login
-- failures, roles and the hash-chained audit log. Times are Unix seconds (BIGINT) so that the
-- same queries run on SQLite and PostgreSQL.
CREATE TABLE cluster_state (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE cert_authorities (
    id          TEXT PRIMARY KEY,
    kind        TEXT NOT NULL,
    private_key TEXT NOT NULL,
    public_key  TEXT NOT NULL,
    active      BIGINT NOT NULL,
    created     BIGINT NOT NULL
);
CREATE INDEX cert_authorities_kind ON cert_authorities (kind);

CREATE TABLE users (
    name           TEXT PRIMARY KEY,
    user_type      TEXT NOT NULL,
    roles          TEXT NOT NULL,
    traits         TEXT NOT NULL,
    password_hash  TEXT,
    totp_secret    TEXT,
    totp_last_step BIGINT NOT NULL DEFAULT 0,
    created        BIGINT NOT NULL
);

CREATE TABLE signup_tokens (
    token_hash  TEXT PRIMARY KEY,
    user_name   TEXT NOT NULL,
    expires     BIGINT NOT NULL,
    totp_secret TEXT,
    used        BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX signup_tokens_user ON signup_tokens (user_name);

CREATE TABLE login_failures (
    user_name TEXT NOT NULL,
    at        BIGINT NOT NULL
);
CREATE INDEX login_failures_user ON login_failures (user_name, at);

CREATE TABLE roles (
    name    TEXT PRIMARY KEY,
    spec    TEXT NOT NULL,
    created BIGINT NOT NULL,
    updated BIGINT NOT NULL
);

CREATE TABLE audit_events (
    seq        BIGINT PRIMARY KEY,
    time       BIGINT NOT NULL,
    event_type TEXT NOT NULL,
    user_name  TEXT,
    record     TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX audit_events_time ON audit_events (time);
