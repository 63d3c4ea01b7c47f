//! The roles' `max_connections` across proxies. A user behind a load balancer reaches several
//! proxies, so when a role sets the limit auth registers the connection a session runs on
//! (`user_connections`) and counts the user's connections registered before it on every live
//! proxy, plus those older ones on the asking proxy it has not registered (the proxy counts
//! them, `ConnectionRef::unconfirmed_older`). Registering and counting are one transaction, one
//! per user at a time (PostgreSQL: an advisory lock on the user's name; SQLite: one writer,
//! taken by the transaction's first statement), and the order is the registrations' own
//! (`seq`), not the proxies' clocks: the connection registered last has counted every other
//! one registered and open, so no more than the limit are.
//!
//! What is counted is what was registered: a connection that has had no session since a role
//! set the limit is counted only by its own proxy. A registered connection goes away when its
//! proxy says it closed (`POST /v1/connections/closed`), when the proxy's list of its open
//! connections (sent every 10 s, whole below an id it names) no longer has it, when that proxy
//! starts again or is removed; meanwhile a proxy that stopped heartbeating (`PROXY_TTL_SECS`)
//! counts for nothing, so a crashed proxy does not hold a user's connections for longer than
//! that.

use sallyport_core::api::{
    ClosedConnections, MAX_CLOSED_CONNECTIONS, MAX_OPEN_CONNECTIONS, PROXY_TTL_SECS, SessionRequest,
};
use sallyport_core::role::RoleSet;
use sqlx::Row;

use crate::backend::Kind;
use crate::{AuthError, AuthServer};

/// What the roles' limits say of a session about to be granted.
enum Limits {
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
    /// [`AuthServer::limits`], a refusal audited with `reject` and answered as
    /// [`AuthError::OverLimit`]; within them, whether the connection is registered.
    pub(crate) async fn within_limits(
        &self,
        set: &RoleSet,
        req: &SessionRequest,
        proxy: &str,
        reject: impl FnOnce(String) -> sallyport_core::audit::Event,
    ) -> Result<bool, AuthError> {
        match self.limits(set, req, proxy).await? {
            Limits::Within { registered } => Ok(registered),
            Limits::Over(why) => {
                self.emit_logged(reject(why.clone())).await;
                Err(AuthError::OverLimit(why))
            }
        }
    }

    /// Checks `max_sessions` and `max_connections` for `req` through `proxy`; under
    /// `max_connections`, registers the request's connection and counts the user's connections
    /// registered before it on every live proxy, with the asking proxy's older ones it has not
    /// registered.
    async fn limits(
        &self,
        set: &RoleSet,
        req: &SessionRequest,
        proxy: &str,
    ) -> Result<Limits, AuthError> {
        if let Some(why) = over_sessions(set, req) {
            return Ok(Limits::Over(why));
        }
        let over = |older| over_connections(set, &req.user, older);
        let (Some(max), Some(conn)) = (set.max_connections(), req.connection) else {
            return Ok(match over(req.older_connections) {
                Some(why) => Limits::Over(why),
                None => Limits::Within { registered: false },
            });
        };
        // Over on this proxy alone: no need to ask the database.
        if req.older_connections >= max {
            return Ok(match over(req.older_connections) {
                Some(why) => Limits::Over(why),
                None => Limits::Within { registered: false },
            });
        }
        let id = db_id(conn.id)?;
        let mut tx = self.backend.pool.begin().await?;
        if self.backend.kind == Kind::Postgres {
            // One registration of this user's at a time, whichever auth instance makes it.
            sqlx::query(
                "SELECT 1 FROM (SELECT pg_advisory_xact_lock(hashtextextended($1, 1330))) l",
            )
            .bind(&req.user)
            .execute(&mut *tx)
            .await?;
        }
        // One statement, so on SQLite the transaction's first act is a write (the database's
        // one write lock, taken before anything is read). `seq`: after every registered
        // connection of the user's.
        sqlx::query(
            "INSERT INTO user_connections (proxy, id, user_name, seq, opened)
             SELECT $1, $2, $3, COALESCE(MAX(seq), 0) + 1, $4 FROM user_connections WHERE user_name = $3
             ON CONFLICT (proxy, id) DO NOTHING",
        )
        .bind(proxy)
        .bind(id)
        .bind(&req.user)
        .bind(conn.opened_ms)
        .execute(&mut *tx)
        .await?;
        let row =
            sqlx::query("SELECT user_name, seq FROM user_connections WHERE proxy = $1 AND id = $2")
                .bind(proxy)
                .bind(id)
                .fetch_one(&mut *tx)
                .await?;
        let (owner, seq): (String, i64) = (row.try_get("user_name")?, row.try_get("seq")?);
        if owner != req.user {
            // Only a proxy reusing its connection ids without starting afresh could do this.
            return Err(AuthError::Conflict(format!(
                "connection {} of this proxy is registered to another user",
                conn.id
            )));
        }
        let earlier = self.registered_earlier(&mut tx, &req.user, seq).await?;
        match over(conn.unconfirmed_older.saturating_add(earlier)) {
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

    /// The user's connections registered before `seq`, through any proxy still heartbeating
    /// (this one's too: the proxy counts only those auth has not confirmed registering).
    /// Registration order, not the proxies' clocks: the connection registered last has
    /// counted every other one registered and open, so no more than the limit are.
    async fn registered_earlier(
        &self,
        tx: &mut sqlx::Transaction<'static, sqlx::Any>,
        user: &str,
        seq: i64,
    ) -> Result<u32, AuthError> {
        let alive = sallyport_core::unix_now() - PROXY_TTL_SECS;
        let n: i64 = sqlx::query(
            "SELECT COUNT(*) FROM user_connections c JOIN proxies p ON p.id = c.proxy
             WHERE c.user_name = $1 AND p.last_seen > $2 AND c.seq < $3",
        )
        .bind(user)
        .bind(alive)
        .bind(seq)
        .fetch_one(&mut **tx)
        .await?
        .try_get(0)?;
        Ok(u32::try_from(n).unwrap_or(u32::MAX))
    }

    /// Proxy `proxy` says these of its registered connections closed, and (`open`) which of
    /// its connections are still open: its other rows below the list's `below` go too.
    pub async fn connections_closed(
        &self,
        proxy: &str,
        closed: &ClosedConnections,
    ) -> Result<(), AuthError> {
        if closed.ids.len() > MAX_CLOSED_CONNECTIONS
            || closed
                .open
                .as_ref()
                .is_some_and(|o| o.ids.len() > MAX_OPEN_CONNECTIONS)
        {
            return Err(AuthError::BadRequest(format!(
                "at most {MAX_CLOSED_CONNECTIONS} closed and {MAX_OPEN_CONNECTIONS} open connections at a time"
            )));
        }
        let mut ids = closed
            .ids
            .iter()
            .map(|i| db_id(*i))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(open) = &closed.open {
            let below = i64::try_from(open.below).unwrap_or(i64::MAX);
            let listed: std::collections::HashSet<u64> = open.ids.iter().copied().collect();
            let rows = sqlx::query("SELECT id FROM user_connections WHERE proxy = $1 AND id < $2")
                .bind(proxy)
                .bind(below)
                .fetch_all(&self.backend.pool)
                .await?;
            for row in rows {
                let id: i64 = row.try_get("id")?;
                if u64::try_from(id).map_or(true, |id| !listed.contains(&id)) {
                    ids.push(id);
                }
            }
        }
        // A few hundred at a time: one statement each, no long hold of SQLite's write lock.
        for chunk in ids.chunks(500) {
            let list = crate::ssh_access::placeholders(2, chunk.len());
            let mut q = sqlx::query(sqlx::AssertSqlSafe(format!(
                "DELETE FROM user_connections WHERE proxy = $1 AND id IN ({list})"
            )))
            .bind(proxy);
            for id in chunk {
                q = q.bind(*id);
            }
            q.execute(&self.backend.pool).await?;
        }
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

/// Why a session would exceed the roles' `max_sessions` (session channels on one SSH
/// connection; [`DEFAULT_MAX_SESSIONS`] when no role sets it), if it would.
///
/// [`DEFAULT_MAX_SESSIONS`]: sallyport_core::api::DEFAULT_MAX_SESSIONS
fn over_sessions(set: &sallyport_core::role::RoleSet, req: &SessionRequest) -> Option<String> {
    let max_sessions = set
        .max_sessions()
        .unwrap_or(sallyport_core::api::DEFAULT_MAX_SESSIONS);
    match req.open_sessions {
        Some(open) if open >= max_sessions => Some(sallyport_core::api::max_sessions_refusal(
            open,
            max_sessions,
        )),
        _ => None,
    }
}

/// Why a connection of `user` with `older` of the user's connections opened before it and
/// still open would exceed the roles' `max_connections` (the oldest ones keep working), if it
/// would.
fn over_connections(set: &sallyport_core::role::RoleSet, user: &str, older: u32) -> Option<String> {
    let max = set.max_connections()?;
    (older >= max).then(|| {
        format!(
            "{user} has {older} other connections open, the most your roles allow (max_connections: {max})"
        )
    })
}
