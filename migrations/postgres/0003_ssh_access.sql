-- SSH access: one-time join tokens for agents, node presence and pinned host keys, and the
-- session index (recordings live beside the data dir; this is their index).
CREATE TABLE join_tokens (
    token_hash TEXT PRIMARY KEY,
    kind       TEXT NOT NULL,
    expires    BIGINT NOT NULL,
    used       BIGINT NOT NULL DEFAULT 0,
    created    BIGINT NOT NULL
);

ALTER TABLE nodes ADD COLUMN last_seen BIGINT NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN host_key TEXT;

CREATE TABLE sessions (
    id         TEXT PRIMARY KEY,
    user_name  TEXT NOT NULL,
    login      TEXT NOT NULL,
    node       TEXT NOT NULL,
    node_id    TEXT NOT NULL,
    kind       TEXT NOT NULL,
    command    TEXT,
    start      BIGINT NOT NULL,
    end_time   BIGINT,
    exit_code  BIGINT,
    bytes_in   BIGINT NOT NULL DEFAULT 0,
    bytes_out  BIGINT NOT NULL DEFAULT 0,
    status     TEXT NOT NULL
);
CREATE INDEX sessions_user ON sessions (user_name, start);
