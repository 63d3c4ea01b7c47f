-- Locks: an admin stops a user at once. A locked user cannot log in, open sessions, call the
-- API, or pass the proxy's SSH door; the proxy also ends the user's live connections.
CREATE TABLE locks (
    id          TEXT PRIMARY KEY,
    target_user TEXT NOT NULL,
    message     TEXT NOT NULL,
    expires     BIGINT,
    created_by  TEXT NOT NULL,
    created     BIGINT NOT NULL
);
CREATE INDEX locks_user ON locks (target_user);
