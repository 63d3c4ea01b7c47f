//! Locks: an admin stops a user at once. Checked at login, at every session grant, on every API
//! call the user makes, and (through `GET /v1/locks`, polled by the proxy) at the proxy's SSH
//! door, where the user's live connections are also ended.

use sallyport_core::api::{AddLock, LockInfo};
use sallyport_core::audit::{Event, EventType};
use sqlx::Row;

use crate::users::rfc3339;
use crate::{AuthError, AuthServer};

impl AuthServer {
    pub async fn add_lock(&self, req: &AddLock, by: &str) -> Result<LockInfo, AuthError> {
        sallyport_core::names::validate("user", &req.user)
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        if self.get_user(&req.user).await?.is_none() {
            return Err(AuthError::NotFound(format!(
                "user {} does not exist",
                req.user
            )));
        }
        let message = req
            .message
            .clone()
            .filter(|m| !m.trim().is_empty())
            .unwrap_or_else(|| "locked by an administrator".into());
        if message.len() > 1024 {
            return Err(AuthError::BadRequest(
                "the lock message is longer than 1024 bytes".into(),
            ));
        }
        let now = sallyport_core::unix_now();
        let expires = match req.ttl_secs {
            Some(0) => {
                return Err(AuthError::BadRequest(
                    "a lock's ttl must be positive".into(),
                ));
            }
            Some(t) => Some(now.saturating_add(i64::try_from(t).unwrap_or(i64::MAX / 2))),
            None => None,
        };
        let id = uuid::Uuid::new_v4().to_string();
        sqlx::query("INSERT INTO locks (id, target_user, message, expires, created_by, created) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(&id)
            .bind(&req.user)
            .bind(&message)
            .bind(expires)
            .bind(by)
            .bind(now)
            .execute(&self.backend.pool)
            .await?;
        // The user's web sessions end with it, on every proxy (and stay ended when it lifts).
        self.end_web_sessions_of(
            &req.user,
            &sallyport_core::api::WebSessionEnding {
                code: sallyport_core::api::WEB_CLOSE_LOCKED,
                message: format!("user {} is locked: {message}", req.user),
            },
        )
        .await?;
        self.emit(
            Event::new(EventType::LockCreate, Some(by))
                .with("lock_id", id.clone())
                .with("target_user", req.user.clone())
                .with("message", message.clone())
                .with("expires", expires.map(rfc3339)),
        )
        .await?;
        Ok(LockInfo {
            id,
            user: req.user.clone(),
            message,
            expires: expires.map(rfc3339),
            created_by: by.to_string(),
            created: rfc3339(now),
        })
    }

    /// Locks in force now.
    pub async fn list_locks(&self) -> Result<Vec<LockInfo>, AuthError> {
        let rows = sqlx::query(
            "SELECT id, target_user, message, expires, created_by, created FROM locks
             WHERE expires IS NULL OR expires > $1 ORDER BY created, id",
        )
        .bind(sallyport_core::unix_now())
        .fetch_all(&self.backend.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(LockInfo {
                    id: r.try_get("id")?,
                    user: r.try_get("target_user")?,
                    message: r.try_get("message")?,
                    expires: r.try_get::<Option<i64>, _>("expires")?.map(rfc3339),
                    created_by: r.try_get("created_by")?,
                    created: rfc3339(r.try_get("created")?),
                })
            })
            .collect()
    }

    pub async fn remove_lock(&self, id: &str, by: &str) -> Result<(), AuthError> {
        let done = sqlx::query("DELETE FROM locks WHERE id = $1")
            .bind(id)
            .execute(&self.backend.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!("lock {id} does not exist")));
        }
        self.emit(Event::new(EventType::LockDelete, Some(by)).with("lock_id", id))
            .await?;
        Ok(())
    }

    /// Why `user` is locked, if a lock is in force.
    pub async fn lock_of(&self, user: &str) -> Result<Option<String>, AuthError> {
        let row = sqlx::query(
            "SELECT message FROM locks WHERE target_user = $1 AND (expires IS NULL OR expires > $2)
             ORDER BY created LIMIT 1",
        )
        .bind(user)
        .bind(sallyport_core::unix_now())
        .fetch_optional(&self.backend.pool)
        .await?;
        Ok(match row {
            Some(r) => Some(r.try_get("message")?),
            None => None,
        })
    }

    /// Refuses a locked user with the lock's message.
    pub async fn check_lock(&self, user: &str) -> Result<(), AuthError> {
        match self.lock_of(user).await? {
            Some(message) => Err(AuthError::UserLocked(format!(
                "user {user} is locked: {message}"
            ))),
            None => Ok(()),
        }
    }
}
