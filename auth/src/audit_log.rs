//! Writing, searching and verifying the audit log. Records are appended under one lock per
//! process and, on PostgreSQL, a row lock on the chain head, so the chain stays linear even with
//! several auth instances; the head (last seq and hash) is stored beside the records so that a
//! truncated tail is found too.

use sallyport_core::api::{AuditQuery, AuditVerify};
use sallyport_core::audit::{self, Event, GENESIS};
use serde_json::Value;
use sqlx::Row;

use crate::backend::Kind;
use crate::{AuthError, AuthServer};

const HEAD: &str = "audit_head";

impl AuthServer {
    /// Appends one event to the chain.
    pub async fn emit(&self, event: Event) -> Result<(), AuthError> {
        let _guard = self.audit_lock.lock().await;
        let mut tx = self.backend.pool.begin().await?;
        // On PostgreSQL, the row lock serialises appends across auth instances.
        let sql = if self.backend.kind == Kind::Postgres {
            "SELECT value FROM cluster_state WHERE key = $1 FOR UPDATE"
        } else {
            "SELECT value FROM cluster_state WHERE key = $1"
        };
        let head: Option<String> = sqlx::query(sql)
            .bind(HEAD)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        let (seq, prev) = match head.as_deref().and_then(|h| h.split_once(':')) {
            Some((s, h)) => (s.parse::<i64>().unwrap_or(0), h.to_string()),
            None => (0, GENESIS.to_string()),
        };
        let now = time::OffsetDateTime::now_utc();
        let (record, hash) = audit::seal(&event, &self.config.cluster_name, seq + 1, &prev, now);
        sqlx::query("INSERT INTO audit_events (seq, time, event_type, user_name, record, hash) VALUES ($1, $2, $3, $4, $5, $6)")
            .bind(seq + 1)
            .bind(now.unix_timestamp())
            .bind(&event.event)
            .bind(event.user.clone())
            .bind(record.to_string())
            .bind(&hash)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO cluster_state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            .bind(HEAD)
            .bind(format!("{}:{hash}", seq + 1))
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Emits an event, logging (not failing) when the log cannot be written: used where the
    /// caller's answer must not depend on the audit write, e.g. refusing a login.
    pub async fn emit_logged(&self, event: Event) {
        let name = event.event.clone();
        if let Err(e) = self.emit(event).await {
            tracing::error!(event = %name, error = %e, "audit event could not be written");
        }
    }

    pub async fn audit_search(&self, q: &AuditQuery) -> Result<Vec<Value>, AuthError> {
        let limit = i64::from(q.limit.unwrap_or(1000).min(10_000));
        let rows = sqlx::query(
            "SELECT record FROM audit_events
             WHERE ($1 = '' OR event_type = $1) AND ($2 = '' OR user_name = $2) AND time >= $3
             ORDER BY seq DESC LIMIT $4",
        )
        .bind(q.event_type.clone().unwrap_or_default())
        .bind(q.user.clone().unwrap_or_default())
        .bind(q.since.unwrap_or(0))
        .bind(limit)
        .fetch_all(&self.backend.pool)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows.iter().rev() {
            let text: String = r.try_get(0)?;
            out.push(serde_json::from_str(&text)?);
        }
        Ok(out)
    }

    pub async fn audit_verify(&self) -> Result<AuditVerify, AuthError> {
        let rows = sqlx::query("SELECT record FROM audit_events ORDER BY seq")
            .fetch_all(&self.backend.pool)
            .await?;
        let mut records = Vec::with_capacity(rows.len());
        for r in &rows {
            let text: String = r.try_get(0)?;
            records.push(serde_json::from_str::<Value>(&text).unwrap_or(Value::Null));
        }
        let mut v = audit::verify(&records);
        if v.ok {
            let head = self.backend.get_state(HEAD).await?;
            let last = records
                .last()
                .map(|r| format!("{}:{}", r["seq"], r["hash"].as_str().unwrap_or("")));
            if head != last {
                let want = head
                    .as_deref()
                    .and_then(|h| h.split_once(':'))
                    .map(|(s, _)| s.to_string());
                v.ok = false;
                v.first_bad_seq = Some(records.len() as i64 + 1);
                v.message = format!(
                    "the log ends at record {} but the chain head says {}: records were removed from the end",
                    records.len(),
                    want.unwrap_or_else(|| "none".into())
                );
            }
        }
        Ok(v)
    }

    pub async fn audit_count(&self) -> Result<u64, AuthError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM audit_events")
            .fetch_one(&self.backend.pool)
            .await?
            .try_get(0)?;
        Ok(n.max(0) as u64)
    }
}
