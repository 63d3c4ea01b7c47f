-- A user's connections through the proxies, for the roles' `max_connections` across proxies:
-- registered by auth at a session grant when a role sets it, removed when the proxy says the
-- connection closed or no longer lists it among its open ones, when that proxy starts again or
-- is removed; a proxy that stopped heartbeating counts for nothing. `seq` orders a user's
-- registrations (the first granted is the oldest, whatever the proxies' clocks say); `opened`
-- is when the proxy saw the connection open (Unix milliseconds, its clock), for people reading
-- the table.
CREATE TABLE user_connections (
    proxy     TEXT NOT NULL,
    id        BIGINT NOT NULL,
    user_name TEXT NOT NULL,
    seq       BIGINT NOT NULL,
    opened    BIGINT NOT NULL,
    PRIMARY KEY (proxy, id)
);
CREATE INDEX user_connections_user ON user_connections (user_name, seq);
