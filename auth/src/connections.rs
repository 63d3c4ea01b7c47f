//! The roles' `max_connections` across proxies. Each proxy counts its own connections of a
//! user (`SessionRequest::older_connections`); a user behind a load balancer reaches several
//! proxies, so when a role sets the limit auth also registers the connection a session runs on
//! (`user_connections`) and counts the user's older ones on every *other* live proxy. The
//! registration and the count are one transaction, serialised per user (PostgreSQL: the
//! user's row locked; SQLite: one writer), so two proxies granting at once cannot both see the
//! other's connection as not yet there.
//!
//! A registered connection goes away when its proxy says it closed (`POST
//! /v1/connections/closed`), when that proxy starts again or is removed; meanwhile a proxy that
//! stopped heartbeating (`PROXY_TTL_SECS`) counts for nothing, so a crashed proxy does not hold
//! a user's connections for longer than that.

use sallyport_core::api::{ConnectionRef, PROXY_TTL_SECS, SessionRequest};
use sallyport_core::role::RoleSet;
use sqlx::Row;

use crate::backend::Kind;
use crate::{AuthError, AuthServer};

/// What the roles' limits say of a session about to be granted.
pub(crate) enum Limits {
    /// Within them; `registered`: the session's connection is registered (the proxy is told to
    /// say when it closes).
    Within { registered: bool },
    /// Past one, saying which (nothing registered).
    Over(String),
}

fn db_id(id: u64) -> Result<i64, AuthError> {
    i64::try_from(id).map_err(|_| AuthError::BadRequest(format!("connection id {id} is too large")))
}

impl AuthServer {
    /// Checks `max_sessions` and `max_connections` for `req` through `proxy`; under
    /// `max_connections`, registers the request's connection and counts the user's older
    /// connections on other live proxies with this proxy's own.
    pub(crate) async fn limits(
        &self,
        set: &RoleSet,
        req: &SessionRequest,
        proxy: &str,
    ) -> Result<Limits, AuthError> {
        if let Some(why) = crate::ssh_access::over_sessions(set, req) {
            return Ok(Limits::Over(why));
        }
        let (Some(_), Some(conn)) = (set.max_connections(), req.connection) else {
            return Ok(
                match crate::ssh_access::over_connections(set, &req.user, req.older_connections) {
                    Some(why) => Limits::Over(why),
                    None => Limits::Within { registered: false },
                },
            );
        };
        let mut tx = self.backend.pool.begin().await?;
        if self.backend.kind == Kind::Postgres {
            // One grant of this user's at a time, whichever auth instance makes it.
            sqlx::query("SELECT name FROM users WHERE name = $1 FOR UPDATE")
                .bind(&req.user)
                .execute(&mut *tx)
                .await?;
        }
        // SQLite: this write takes the database's one write lock before the count.
        sqlx::query(
            "INSERT INTO user_connections (proxy, id, user_name, opened) VALUES ($1, $2, $3, $4)
             ON CONFLICT (proxy, id) DO NOTHING",
        )
        .bind(proxy)
        .bind(db_id(conn.id)?)
        .bind(&req.user)
        .bind(conn.opened_ms)
        .execute(&mut *tx)
        .await?;
        let elsewhere = self
            .older_elsewhere(&mut tx, &req.user, proxy, conn)
            .await?;
        let older = req.older_connections.saturating_add(elsewhere);
        match crate::ssh_access::over_connections(set, &req.user, older) {
            Some(why) => {
                tx.rollback().await?;
                Ok(Limits::Over(why))
            }
            None => {
                tx.commit().await?;
                Ok(Limits::Within { registered: true })
            }
        }
    }

    /// The user's registered connections through proxies other than `proxy` that are still
    /// heartbeating, opened before `conn` (ties broken by the proxy's id, so of two connections
    /// opened in the same millisecond exactly one is the older).
    async fn older_elsewhere(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        user: &str,
        proxy: &str,
        conn: ConnectionRef,
    ) -> Result<u32, AuthError> {
        let alive = sallyport_core::unix_now() - PROXY_TTL_SECS;
        let n: i64 = sqlx::query(
            "SELECT COUNT(*) FROM user_connections c JOIN proxies p ON p.id = c.proxy
             WHERE c.user_name = $1 AND c.proxy <> $2 AND p.last_seen > $3
               AND (c.opened < $4 OR (c.opened = $4 AND c.proxy < $2))",
        )
        .bind(user)
        .bind(proxy)
        .bind(alive)
        .bind(conn.opened_ms)
        .fetch_one(&mut **tx)
        .await?
        .try_get(0)?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Proxy `proxy` says these of its registered connections closed.
    pub async fn connections_closed(&self, proxy: &str, ids: &[u64]) -> Result<(), AuthError> {
        if ids.len() > sallyport_core::api::MAX_CLOSED_CONNECTIONS {
            return Err(AuthError::BadRequest(format!(
                "at most {} connections at a time",
                sallyport_core::api::MAX_CLOSED_CONNECTIONS
            )));
        }
        let mut tx = self.backend.pool.begin().await?;
        for id in ids {
            sqlx::query("DELETE FROM user_connections WHERE proxy = $1 AND id = $2")
                .bind(proxy)
                .bind(db_id(*id)?)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Proxy `proxy` started again or was removed: none of its connections is open.
    pub(crate) async fn drop_proxy_connections(&self, proxy: &str) -> Result<(), AuthError> {
        sqlx::query("DELETE FROM user_connections WHERE proxy = $1")
            .bind(proxy)
            .execute(&self.backend.pool)
            .await?;
        Ok(())
    }
}
