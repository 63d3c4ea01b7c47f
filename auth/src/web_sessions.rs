//! Browsers' web sessions and SSO sign-ins in progress, kept for every proxy. A browser behind a
//! load balancer may reach any proxy with its next request; that proxy finds the session here by
//! the SHA-256 of the cookie's id (the id itself never leaves the browser and the proxy that made
//! it), with the session's certificate and key, CSRF token and latest input. Proxies keep a
//! small cache and ask again every ~2 s which of their sessions still exist
//! ([`AuthServer::check_web_sessions`]), so a sign-out on one proxy ends the terminals on every
//! other within seconds.
//!
//! A session that ends (signed out, locked, idle, evicted) stays a minute as a tombstone with its
//! close code and message, so every proxy closes its terminals with the same words; lookups
//! never return it. What this must never do: store the cookie's id, or answer anyone but a
//! proxy (the API's `Proxy` extractor).

use std::sync::atomic::{AtomicI64, Ordering};

use sallyport_core::api::{
    WEB_CLOSE_LOCKED, WEB_CLOSE_SIGNED_OUT, WebSessionCreated, WebSessionEnding, WebSessionRecord,
    WebSessionState, WebSsoPending,
};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::{AuthError, AuthServer};

/// Web sessions one user may hold at once; signing in past it ends the oldest.
pub const MAX_PER_USER: usize = sallyport_core::api::MAX_WEB_SESSIONS_PER_USER;
/// Web sessions the cluster holds at once; signing in past it ends the oldest.
pub const MAX_SESSIONS: usize = sallyport_core::api::MAX_WEB_SESSIONS;
/// How long an ended session is kept to tell other proxies why it ended.
const ENDED_KEPT_MS: u64 = 60_000;
/// A session no proxy ended is removed this long after it went idle or expired.
const BACKSTOP_MS: u64 = 60_000;
/// Hashes asked at once by one check, at most; and per query.
pub const MAX_CHECK: usize = MAX_SESSIONS;
const CHECK_CHUNK: usize = 500;
/// SSO sign-ins waiting for their browser, at most; past it the oldest is forgotten.
const MAX_SSO_PENDING: i64 = 10_000;
/// How long a started sign-in waits for its browser (the provider's part included).
const SSO_PENDING_TTL: i64 = 600;
/// Largest certificate chain and key a session may carry.
const MAX_PEM: usize = 16 * 1024;

/// A SHA-256 in hex, as proxies send it.
fn check_hash(h: &str) -> Result<(), AuthError> {
    if h.len() == 64
        && h.bytes()
            .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
    {
        Ok(())
    } else {
        Err(AuthError::BadRequest(
            "a web session or binding is named by the hex SHA-256 of its id".into(),
        ))
    }
}

fn now_ms() -> i64 {
    i64::try_from(sallyport_core::unix_now_ms()).unwrap_or(i64::MAX)
}

fn ms(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

/// When the expired, idle and ended rows were last cleared by this process (an economy: any
/// instance clearing them is as good).
static LAST_PURGE_MS: AtomicI64 = AtomicI64::new(0);

impl AuthServer {
    /// A new web session from proxy `proxy`; ends the user's oldest past [`MAX_PER_USER`] and the
    /// cluster's oldest past [`MAX_SESSIONS`], and says which.
    pub async fn create_web_session(
        &self,
        proxy: &str,
        s: &WebSessionRecord,
    ) -> Result<WebSessionCreated, AuthError> {
        check_hash(&s.id_hash)?;
        sallyport_core::names::validate("user", &s.user)
            .or_else(|e| {
                // SSO users are named by their provider's claim (an email address).
                if s.user.len() <= 256 && !s.user.chars().any(char::is_control) {
                    Ok(())
                } else {
                    Err(e)
                }
            })
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        if s.cert_chain_pem.len() > MAX_PEM || s.key_pem.len() > MAX_PEM || s.csrf_token.len() > 256
        {
            return Err(AuthError::BadRequest(
                "a web session's certificate, key or token is too large".into(),
            ));
        }
        let now = now_ms();
        self.purge_web_sessions(now, true).await?;
        sqlx::query(
            "INSERT INTO web_sessions (id_hash, user_name, proxy, roles, logins, cert_chain, private_key, csrf_token, created_ms, last_input_ms, idle_ms, expires, valid_until)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $10, $11, $12)",
        )
        .bind(&s.id_hash)
        .bind(&s.user)
        .bind(proxy)
        .bind(serde_json::to_string(&s.roles)?)
        .bind(serde_json::to_string(&s.logins)?)
        .bind(&s.cert_chain_pem)
        .bind(&s.key_pem)
        .bind(&s.csrf_token)
        .bind(now)
        .bind(i64::try_from(s.idle_ms).unwrap_or(i64::MAX))
        .bind(i64::try_from(s.expires).unwrap_or(i64::MAX))
        .bind(&s.valid_until)
        .execute(&self.backend.pool)
        .await
        .map_err(|e| taken(e, "this web session id is taken"))?;
        // Trimmed after the insert: two sign-ins at once on two instances each keep the newest.
        let mut evicted: Vec<String> = self
            .newest_beyond(
                "SELECT id_hash FROM web_sessions WHERE ended_ms = 0 AND user_name = $1 ORDER BY created_ms DESC, id_hash",
                Some(&s.user),
                MAX_PER_USER,
            )
            .await?;
        let total: i64 = sqlx::query("SELECT COUNT(*) FROM web_sessions WHERE ended_ms = 0")
            .fetch_one(&self.backend.pool)
            .await?
            .try_get(0)?;
        if total > MAX_SESSIONS as i64 {
            evicted.extend(
                self.newest_beyond(
                    "SELECT id_hash FROM web_sessions WHERE ended_ms = 0 ORDER BY created_ms DESC, id_hash",
                    None,
                    MAX_SESSIONS,
                )
                .await?,
            );
        }
        evicted.sort();
        evicted.dedup();
        let why = WebSessionEnding {
            code: WEB_CLOSE_SIGNED_OUT,
            message: "too many web sessions: this one, the oldest, was signed out".into(),
        };
        for h in &evicted {
            self.end_web_session(h, &why).await?;
        }
        Ok(WebSessionCreated { evicted })
    }

    /// The rows of `sql` (newest first) after the first `keep`.
    async fn newest_beyond(
        &self,
        sql: &'static str,
        user: Option<&str>,
        keep: usize,
    ) -> Result<Vec<String>, AuthError> {
        let mut q = sqlx::query(sql);
        if let Some(u) = user {
            q = q.bind(u.to_string());
        }
        let rows = q.fetch_all(&self.backend.pool).await?;
        rows.iter()
            .skip(keep)
            .map(|r| Ok(r.try_get::<String, _>(0)?))
            .collect()
    }

    /// The live web session `hash` names: not ended, not expired, its user not locked (a lock
    /// ends it here, for every proxy).
    pub async fn web_session(&self, hash: &str) -> Result<WebSessionRecord, AuthError> {
        check_hash(hash)?;
        let gone = || AuthError::NotFound("no such web session".into());
        let row = sqlx::query(
            "SELECT id_hash, user_name, roles, logins, cert_chain, private_key, csrf_token, created_ms, last_input_ms, idle_ms, expires, valid_until
             FROM web_sessions WHERE id_hash = $1 AND ended_ms = 0",
        )
        .bind(hash)
        .fetch_optional(&self.backend.pool)
        .await?
        .ok_or_else(gone)?;
        let record = record_of(&row)?;
        if record.expires <= sallyport_core::unix_now() as u64 {
            return Err(gone());
        }
        if let Some(why) = self.lock_of(&record.user).await? {
            self.end_web_session(
                hash,
                &WebSessionEnding {
                    code: WEB_CLOSE_LOCKED,
                    message: format!("user {} is locked: {why}", record.user),
                },
            )
            .await?;
            return Err(gone());
        }
        Ok(record)
    }

    /// The person did something on `hash` at `at_ms` (a proxy's clock, never later than ours):
    /// the latest input wins. A session that is gone is NotFound.
    pub async fn touch_web_session(&self, hash: &str, at_ms: u64) -> Result<(), AuthError> {
        check_hash(hash)?;
        let at = i64::try_from(at_ms).unwrap_or(0).min(now_ms());
        sqlx::query(
            "UPDATE web_sessions SET last_input_ms = $1 WHERE id_hash = $2 AND ended_ms = 0 AND last_input_ms < $1",
        )
        .bind(at)
        .bind(hash)
        .execute(&self.backend.pool)
        .await?;
        let live =
            sqlx::query("SELECT 1 AS one FROM web_sessions WHERE id_hash = $1 AND ended_ms = 0")
                .bind(hash)
                .fetch_optional(&self.backend.pool)
                .await?
                .is_some();
        if live {
            Ok(())
        } else {
            Err(AuthError::NotFound("no such web session".into()))
        }
    }

    /// Ends web session `hash` for `why`, for every proxy (kept a minute as a tombstone).
    pub async fn end_web_session(
        &self,
        hash: &str,
        why: &WebSessionEnding,
    ) -> Result<(), AuthError> {
        check_hash(hash)?;
        let message: String = why.message.chars().take(1024).collect();
        sqlx::query(
            "UPDATE web_sessions SET ended_ms = $1, ended_code = $2, ended_message = $3, cert_chain = '', private_key = ''
             WHERE id_hash = $4 AND ended_ms = 0",
        )
        .bind(now_ms())
        .bind(i64::from(why.code))
        .bind(message)
        .bind(hash)
        .execute(&self.backend.pool)
        .await?;
        let known = sqlx::query("SELECT 1 AS one FROM web_sessions WHERE id_hash = $1")
            .bind(hash)
            .fetch_optional(&self.backend.pool)
            .await?
            .is_some();
        if known {
            Ok(())
        } else {
            Err(AuthError::NotFound("no such web session".into()))
        }
    }

    /// Ends every web session of `user` (a lock was added).
    pub async fn end_web_sessions_of(
        &self,
        user: &str,
        why: &WebSessionEnding,
    ) -> Result<(), AuthError> {
        sqlx::query(
            "UPDATE web_sessions SET ended_ms = $1, ended_code = $2, ended_message = $3, cert_chain = '', private_key = ''
             WHERE user_name = $4 AND ended_ms = 0",
        )
        .bind(now_ms())
        .bind(i64::from(why.code))
        .bind(&why.message)
        .bind(user)
        .execute(&self.backend.pool)
        .await?;
        Ok(())
    }

    /// Which of `hashes` auth still knows: live with their latest input, or ended a moment ago
    /// and why. The ones not answered are gone.
    pub async fn check_web_sessions(
        &self,
        hashes: &[String],
    ) -> Result<Vec<WebSessionState>, AuthError> {
        if hashes.len() > MAX_CHECK {
            return Err(AuthError::BadRequest(format!(
                "at most {MAX_CHECK} web sessions at once"
            )));
        }
        for h in hashes {
            check_hash(h)?;
        }
        let now = now_ms();
        self.purge_web_sessions(now, false).await?;
        let mut out = Vec::with_capacity(hashes.len());
        for chunk in hashes.chunks(CHECK_CHUNK) {
            let marks: Vec<String> = (1..=chunk.len()).map(|i| format!("${i}")).collect();
            let sql = format!(
                "SELECT id_hash, last_input_ms, ended_ms, ended_code, ended_message FROM web_sessions WHERE id_hash IN ({})",
                marks.join(", ")
            );
            // Only `$n` placeholders are made here; the hashes are bound.
            let mut q = sqlx::query(sqlx::AssertSqlSafe(sql));
            for h in chunk {
                q = q.bind(h.clone());
            }
            for r in q.fetch_all(&self.backend.pool).await? {
                let ended_ms: i64 = r.try_get("ended_ms")?;
                let code: i64 = r.try_get("ended_code")?;
                out.push(WebSessionState {
                    id_hash: r.try_get("id_hash")?,
                    last_input_ms: ms(r.try_get("last_input_ms")?),
                    ended: (ended_ms > 0)
                        .then(|| -> Result<_, AuthError> {
                            Ok(WebSessionEnding {
                                code: u16::try_from(code).unwrap_or(WEB_CLOSE_SIGNED_OUT),
                                message: r.try_get("ended_message")?,
                            })
                        })
                        .transpose()?,
                });
            }
        }
        Ok(out)
    }

    /// Clears tombstones older than a minute and the sessions no proxy ended that expired or
    /// went idle a minute ago; at most every 30 s per process unless `now` is asked.
    async fn purge_web_sessions(&self, now: i64, always: bool) -> Result<(), AuthError> {
        let last = LAST_PURGE_MS.load(Ordering::Relaxed);
        if !always && now - last < 30_000 {
            return Ok(());
        }
        LAST_PURGE_MS.store(now, Ordering::Relaxed);
        sqlx::query(
            "DELETE FROM web_sessions WHERE (ended_ms > 0 AND ended_ms < $1)
               OR expires * 1000 < $2 OR (ended_ms = 0 AND last_input_ms + idle_ms < $2)",
        )
        .bind(now - ENDED_KEPT_MS as i64)
        .bind(now - BACKSTOP_MS as i64)
        .execute(&self.backend.pool)
        .await?;
        Ok(())
    }

    /// A browser's SSO sign-in waiting for the browser to come back; past [`MAX_SSO_PENDING`]
    /// the oldest is forgotten.
    pub async fn put_web_sso(&self, p: &WebSsoPending) -> Result<(), AuthError> {
        check_hash(&p.binding_hash)?;
        if p.key_pem.len() > MAX_PEM || p.client_key.len() > 256 {
            return Err(AuthError::BadRequest(
                "the key or client key is too large".into(),
            ));
        }
        let now = sallyport_core::unix_now();
        sqlx::query("DELETE FROM web_sso_pending WHERE expires <= $1")
            .bind(now)
            .execute(&self.backend.pool)
            .await?;
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM web_sso_pending")
            .fetch_one(&self.backend.pool)
            .await?
            .try_get(0)?;
        if n >= MAX_SSO_PENDING {
            sqlx::query(
                "DELETE FROM web_sso_pending WHERE binding_hash IN (SELECT binding_hash FROM web_sso_pending ORDER BY created, binding_hash LIMIT $1)",
            )
            .bind(n + 1 - MAX_SSO_PENDING)
            .execute(&self.backend.pool)
            .await?;
        }
        sqlx::query(
            "INSERT INTO web_sso_pending (binding_hash, client_key, private_key, created, expires) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(&p.binding_hash)
        .bind(&p.client_key)
        .bind(&p.key_pem)
        .bind(now)
        .bind(now + SSO_PENDING_TTL)
        .execute(&self.backend.pool)
        .await
        .map_err(|e| taken(e, "this binding is taken"))?;
        Ok(())
    }

    /// The sign-in under `hash`, left in place (a made-up response must use nothing up).
    pub async fn web_sso(&self, hash: &str) -> Result<WebSsoPending, AuthError> {
        check_hash(hash)?;
        let row = sqlx::query(
            "SELECT client_key, private_key FROM web_sso_pending WHERE binding_hash = $1 AND expires > $2",
        )
        .bind(hash)
        .bind(sallyport_core::unix_now())
        .fetch_optional(&self.backend.pool)
        .await?
        .ok_or_else(|| AuthError::NotFound("no such sign-in in progress".into()))?;
        Ok(WebSsoPending {
            binding_hash: hash.to_string(),
            client_key: row.try_get("client_key")?,
            key_pem: row.try_get("private_key")?,
        })
    }

    /// Forgets the sign-in under `hash`: it opened its session.
    pub async fn remove_web_sso(&self, hash: &str) -> Result<(), AuthError> {
        check_hash(hash)?;
        let r = sqlx::query("DELETE FROM web_sso_pending WHERE binding_hash = $1")
            .bind(hash)
            .execute(&self.backend.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound("no such sign-in in progress".into()));
        }
        Ok(())
    }
}

/// A unique key already there is a conflict; anything else is the storage's failure.
fn taken(e: sqlx::Error, what: &str) -> AuthError {
    match &e {
        sqlx::Error::Database(d) if d.is_unique_violation() => AuthError::Conflict(what.into()),
        _ => e.into(),
    }
}

fn record_of(r: &AnyRow) -> Result<WebSessionRecord, AuthError> {
    let roles: String = r.try_get("roles")?;
    let logins: String = r.try_get("logins")?;
    Ok(WebSessionRecord {
        id_hash: r.try_get("id_hash")?,
        user: r.try_get("user_name")?,
        roles: serde_json::from_str(&roles)?,
        logins: serde_json::from_str(&logins)?,
        cert_chain_pem: r.try_get("cert_chain")?,
        key_pem: r.try_get("private_key")?,
        csrf_token: r.try_get("csrf_token")?,
        created_ms: ms(r.try_get("created_ms")?),
        last_input_ms: ms(r.try_get("last_input_ms")?),
        idle_ms: ms(r.try_get("idle_ms")?),
        expires: ms(r.try_get("expires")?),
        valid_until: r.try_get("valid_until")?,
    })
}
