-- Nodes: servers people reach. `agentless` nodes are OpenSSH servers at `addr` that trust the
-- user CA; agent nodes (which dial in) arrive with SSH access.
CREATE TABLE nodes (
    id       TEXT PRIMARY KEY,
    hostname TEXT NOT NULL UNIQUE,
    addr     TEXT,
    labels   TEXT NOT NULL,
    kind     TEXT NOT NULL,
    created  BIGINT NOT NULL,
    updated  BIGINT NOT NULL
);
