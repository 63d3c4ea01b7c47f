-- Proxy services: each registers at its join (a `proxy` token; the all-in-one's own proxy when
-- it starts) and heartbeats its addresses. A certificate of a proxy not listed here is refused.
CREATE TABLE proxies (
    id        TEXT PRIMARY KEY,
    name      TEXT NOT NULL UNIQUE,
    addrs     TEXT NOT NULL,
    created   BIGINT NOT NULL,
    last_seen BIGINT NOT NULL
);

-- Presence per (agent, proxy): an agent keeps a tunnel to every proxy, and a proxy that starts
-- or stops changes only its own rows. `nodes.last_seen` is the latest of a node's rows.
CREATE TABLE node_tunnels (
    node_id   TEXT NOT NULL,
    proxy_id  TEXT NOT NULL,
    last_seen BIGINT NOT NULL,
    PRIMARY KEY (node_id, proxy_id)
);
CREATE INDEX node_tunnels_proxy ON node_tunnels (proxy_id);

-- The proxy a session runs through: only its own restart marks it incomplete.
ALTER TABLE sessions ADD COLUMN proxy TEXT NOT NULL DEFAULT '';
CREATE INDEX sessions_running ON sessions (status, proxy);
