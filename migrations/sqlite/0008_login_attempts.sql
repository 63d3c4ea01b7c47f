-- Login attempts counted and checked in one statement: an attempt reserves a slot
-- (`failures < max`) before its password check, so concurrent guesses cannot run past the
-- lockout. Replaces the per-failure rows of `login_failures`.
CREATE TABLE login_attempts (
    user_name    TEXT PRIMARY KEY,
    failures     BIGINT NOT NULL,
    window_start BIGINT NOT NULL,
    locked_until BIGINT NOT NULL DEFAULT 0
);

DROP TABLE login_failures;
