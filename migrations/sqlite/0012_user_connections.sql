-- A user's connections through the proxies, for the roles' `max_connections` across proxies:
-- registered by auth at a session grant when a role sets it, removed when the proxy says the
-- connection closed, when that proxy starts again or is removed; a proxy that stopped
-- heartbeating counts for nothing. `seq` orders a user's registrations (the first granted is
-- the oldest, whatever the proxies' clocks say); `opened` is when the proxy saw the connection
-- open (Unix milliseconds, its clock), for people reading the table; `registered` when auth
-- registered it (Unix milliseconds, auth's clock), which keeps a fresh registration from being
-- dropped by a proxy's list of its open connections made just before it.
CREATE TABLE user_connections (
    proxy     TEXT NOT NULL,
    id        BIGINT NOT NULL,
    user_name TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    opened    BIGINT NOT NULL,
    registered BIGINT NOT NULL,
    PRIMARY KEY (proxy, id)
);
CREATE INDEX user_connections_user ON user_connections (user_name, seq);
