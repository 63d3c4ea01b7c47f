//! Writing, searching and verifying the audit log, and anchoring it outside the database.
//!
//! Records are appended under one lock per process and, on PostgreSQL, a row lock on the chain
//! head, so the chain stays linear even with several auth instances; the head (last seq and
//! hash) is stored beside the records so that a truncated tail is found too.
//!
//! The chain's formula is public, so a database writer could edit a record and re-hash the rest.
//! Auth therefore signs checkpoints of the chain ([`sallyport_core::audit::Checkpoint`]) with
//! an Ed25519 key kept in its data dir, never in the database: inside the append that makes a
//! multiple of `audit_checkpoint_every` records since the last checkpoint, and in the background
//! at most `audit_checkpoint_interval` after a record was written. Before signing it checks
//! that the records since the last checkpoint link to it, so a rewrite it can see is never
//! signed. The last checkpoint it signed is also remembered in the data dir, so that removing
//! the newest checkpoints together with the records they cover shows. `audit_verify` checks
//! every checkpoint with the key from the data dir.
//!
//! What that proves: every record up to the last checkpoint is what auth wrote, none is
//! missing, and no checkpoint was removed or forged. What it cannot: records after the last
//! checkpoint (at most a minute's, or `every` records) are only as safe as the database; and
//! whoever holds the key file (root on the auth host, a backup of the data dir) can sign a
//! rewritten chain. With several auth instances on PostgreSQL, all must share the same key file
//! (a KMS later), and each remembers only the checkpoints it signed itself.
//!
//! Searches filter on the records themselves (what the chain hashes), never on the side columns
//! `event_type`, `user_name` and `time`, which nothing verifies; each result's own hash is
//! checked before it is returned.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_core::api::{AuditQuery, AuditVerify};
use sallyport_core::audit::{self, Checkpoint, Event, GENESIS};
use serde_json::Value;
use sqlx::{Any, Row, Transaction};

use crate::backend::Kind;
use crate::{AuthConfig, AuthError, AuthServer};

const HEAD: &str = "audit_head";

// Searches read the fields of the record itself. Record times are RFC 3339 in UTC
// ("…T18:10:28.123Z"): compared as bytes (PostgreSQL: the "C" collation) with the same form cut
// before the fraction ($3), a record of the very second `since` names counts.
const SEARCH_SQLITE: &str = "SELECT seq, record FROM audit_events
     WHERE ($1 = '' OR json_extract(record, '$.event') = $1)
       AND ($2 = '' OR json_extract(record, '$.user') = $2)
       AND ($3 = '' OR json_extract(record, '$.time') >= $3)
     ORDER BY seq DESC LIMIT $4";
const SEARCH_POSTGRES: &str = "SELECT seq, record FROM audit_events
     WHERE ($1 = '' OR (record::jsonb ->> 'event') = $1)
       AND ($2 = '' OR (record::jsonb ->> 'user') = $2)
       AND ($3 = '' OR (record::jsonb ->> 'time') COLLATE \"C\" >= $3)
     ORDER BY seq DESC LIMIT $4";

/// The checkpoint signing key and where the last checkpoint signed with it is remembered.
pub(crate) struct Anchor {
    key: PrivateKey,
    remembered: PathBuf,
    every: i64,
}

impl Anchor {
    /// Loads the key named in the config, creating it (0600) at first start.
    pub(crate) fn load(config: &AuthConfig) -> Result<Option<Anchor>, AuthError> {
        let Some(path) = &config.audit_checkpoint_key else {
            return Ok(None);
        };
        let key = match std::fs::read_to_string(path) {
            Ok(text) => {
                let mode = std::fs::metadata(path)
                    .map(|m| m.permissions().mode())
                    .unwrap_or(0);
                if mode & 0o077 != 0 {
                    return Err(AuthError::Internal(format!(
                        "the audit checkpoint key {} is readable by others (mode {:o}): chmod 600 it",
                        path.display(),
                        mode & 0o777
                    )));
                }
                PrivateKey::from_openssh(&text).map_err(|e| {
                    AuthError::Internal(format!(
                        "the audit checkpoint key {} is unreadable: {e}",
                        path.display()
                    ))
                })?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_key(path)?,
            Err(e) => {
                return Err(AuthError::Internal(format!(
                    "cannot read the audit checkpoint key {}: {e}",
                    path.display()
                )));
            }
        };
        if key.algorithm() != Algorithm::Ed25519 {
            return Err(AuthError::Internal(format!(
                "the audit checkpoint key {} must be an Ed25519 key",
                path.display()
            )));
        }
        Ok(Some(Anchor {
            key,
            remembered: path.with_extension("last"),
            every: i64::try_from(config.audit_checkpoint_every.max(1)).unwrap_or(i64::MAX),
        }))
    }

    /// The last checkpoint this server signed, from the data dir.
    fn remembered(&self) -> Option<Checkpoint> {
        let text = match std::fs::read_to_string(&self.remembered) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
            Err(e) => {
                tracing::warn!(file = %self.remembered.display(), error = %e, "the last audit checkpoint cannot be read");
                return None;
            }
        };
        match serde_json::from_str(&text) {
            Ok(cp) => Some(cp),
            Err(e) => {
                tracing::warn!(file = %self.remembered.display(), error = %e, "the last audit checkpoint is unreadable");
                None
            }
        }
    }

    /// Remembers `cp` once it is committed (never before: a remembered checkpoint the
    /// database lacks reads as removed).
    fn remember(&self, cp: &Checkpoint) {
        if self.remembered().is_some_and(|r| r.seq >= cp.seq) {
            return;
        }
        let result = serde_json::to_vec(cp)
            .map_err(std::io::Error::other)
            .and_then(|doc| write_private(&self.remembered, &doc));
        if let Err(e) = result {
            tracing::error!(file = %self.remembered.display(), error = %e, "the last audit checkpoint cannot be remembered");
        }
    }
}

fn create_key(path: &Path) -> Result<PrivateKey, AuthError> {
    let key = sallyport_core::sshcert::generate_ed25519()
        .map_err(|e| AuthError::Internal(format!("cannot make the audit checkpoint key: {e}")))?;
    let text = key
        .to_openssh(LineEnding::LF)
        .map_err(|e| AuthError::Internal(format!("cannot encode the audit checkpoint key: {e}")))?;
    write_private(path, text.as_bytes()).map_err(|e| {
        AuthError::Internal(format!(
            "cannot write the audit checkpoint key {}: {e}",
            path.display()
        ))
    })?;
    tracing::info!(file = %path.display(), "made the audit checkpoint key");
    Ok(key)
}

/// Writes a file only its owner may read, atomically.
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The background half of anchoring: unsigned records wait at most one interval.
pub(crate) fn spawn_anchorer(auth: Weak<AuthServer>) {
    let Some(interval) = auth
        .upgrade()
        .filter(|a| a.audit_anchor.is_some())
        .map(|a| a.config.audit_checkpoint_interval)
    else {
        return;
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval.max(std::time::Duration::from_millis(100)));
        tick.tick().await;
        loop {
            tick.tick().await;
            let Some(auth) = auth.upgrade() else { return };
            if let Err(e) = auth.anchor_audit().await {
                tracing::error!(error = %e, "no audit checkpoint signed");
            }
            drop::<Arc<AuthServer>>(auth);
        }
    });
}

impl AuthServer {
    /// Appends one event to the chain.
    pub async fn emit(&self, event: Event) -> Result<(), AuthError> {
        let _guard = self.audit_lock.lock().await;
        let mut tx = self.backend.pool.begin().await?;
        let (seq, prev) = self.lock_head(&mut tx).await?;
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
        // A checkpoint that cannot be signed is logged, never a reason to lose the record.
        let signed = match &self.audit_anchor {
            Some(a) => match self.sign_checkpoint(&mut tx, a, seq + 1, &hash, true).await {
                Ok(cp) => cp,
                Err(e) => {
                    tracing::error!(error = %e, "no audit checkpoint signed");
                    None
                }
            },
            None => None,
        };
        tx.commit().await?;
        if let (Some(a), Some(cp)) = (&self.audit_anchor, signed) {
            a.remember(&cp);
        }
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

    /// Signs a checkpoint of the chain head now if any record is not anchored yet (the
    /// background task, and a clean shutdown). Returns the seq it anchored.
    pub async fn anchor_audit(&self) -> Result<Option<i64>, AuthError> {
        let Some(a) = &self.audit_anchor else {
            return Ok(None);
        };
        let _guard = self.audit_lock.lock().await;
        let mut tx = self.backend.pool.begin().await?;
        let (seq, hash) = self.lock_head(&mut tx).await?;
        let signed = self.sign_checkpoint(&mut tx, a, seq, &hash, false).await?;
        tx.commit().await?;
        Ok(signed.map(|cp| {
            a.remember(&cp);
            cp.seq
        }))
    }

    /// Reads (and on PostgreSQL row-locks, serialising appends and checkpoints across auth
    /// instances) the chain head: the last seq and its hash.
    async fn lock_head(&self, tx: &mut Transaction<'_, Any>) -> Result<(i64, String), AuthError> {
        let sql = if self.backend.kind == Kind::Postgres {
            "SELECT value FROM cluster_state WHERE key = $1 FOR UPDATE"
        } else {
            "SELECT value FROM cluster_state WHERE key = $1"
        };
        let head: Option<String> = sqlx::query(sql)
            .bind(HEAD)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        Ok(match head.as_deref().and_then(|h| h.split_once(':')) {
            Some((s, h)) => (s.parse::<i64>().unwrap_or(0), h.to_string()),
            None => (0, GENESIS.to_string()),
        })
    }

    /// Signs "record `head_seq` has hash `head_hash`" once the records since the last
    /// checkpoint are checked to link to it; `only_when_due`: only at a multiple of `every`
    /// records past it.
    async fn sign_checkpoint(
        &self,
        tx: &mut Transaction<'_, Any>,
        a: &Anchor,
        head_seq: i64,
        head_hash: &str,
        only_when_due: bool,
    ) -> Result<Option<Checkpoint>, AuthError> {
        let cluster = &self.config.cluster_name;
        let last = sqlx::query(
            "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints ORDER BY seq DESC LIMIT 1",
        )
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| checkpoint_row(&r))
        .transpose()?;
        let (from_seq, from_hash) = match &last {
            Some(cp) if !cp.is_signed_by(a.key.public_key(), cluster) => {
                return Err(AuthError::Conflict(format!(
                    "the last audit checkpoint ({}) is not signed by the checkpoint key: not signing on top of it; run `sallyctl audit verify`",
                    cp.seq
                )));
            }
            Some(cp) => (cp.seq, cp.hash.clone()),
            None => (0, GENESIS.to_string()),
        };
        let pending = head_seq - from_seq;
        if pending <= 0 || (only_when_due && pending % a.every != 0) {
            return Ok(None);
        }
        let rows = sqlx::query("SELECT record FROM audit_events WHERE seq > $1 ORDER BY seq")
            .bind(from_seq)
            .fetch_all(&mut **tx)
            .await?;
        let mut records = Vec::with_capacity(rows.len());
        for r in &rows {
            let text: String = r.try_get(0)?;
            records.push(serde_json::from_str::<Value>(&text).unwrap_or(Value::Null));
        }
        let v = audit::verify_from(from_seq, &from_hash, &records);
        if !v.ok {
            return Err(AuthError::Conflict(format!(
                "not signing an audit checkpoint: {}; run `sallyctl audit verify`",
                v.message
            )));
        }
        let tail = records
            .last()
            .and_then(|r| r.get("hash"))
            .and_then(Value::as_str);
        if v.checked as i64 != pending || tail != Some(head_hash) {
            return Err(AuthError::Conflict(format!(
                "not signing an audit checkpoint: the chain head is record {head_seq} but the records after checkpoint {from_seq} end elsewhere; run `sallyctl audit verify`"
            )));
        }
        let cp = Checkpoint::sign(
            &a.key,
            cluster,
            head_seq,
            head_hash,
            sallyport_core::unix_now(),
            from_seq,
        )
        .map_err(AuthError::Internal)?;
        sqlx::query(
            "INSERT INTO audit_checkpoints (seq, hash, time, prev_seq, signature) VALUES ($1, $2, $3, $4, $5)",
        )
        .bind(cp.seq)
        .bind(&cp.hash)
        .bind(cp.time)
        .bind(cp.prev_seq)
        .bind(&cp.signature)
        .execute(&mut **tx)
        .await?;
        Ok(Some(cp))
    }

    pub async fn audit_search(&self, q: &AuditQuery) -> Result<Vec<Value>, AuthError> {
        let limit = i64::from(q.limit.unwrap_or(1000).min(10_000));
        let sql = match self.backend.kind {
            Kind::Sqlite => SEARCH_SQLITE,
            Kind::Postgres => SEARCH_POSTGRES,
        };
        let since = q
            .since
            .filter(|s| *s > 0)
            .map(since_text)
            .unwrap_or_default();
        let rows = sqlx::query(sql)
            .bind(q.event_type.clone().unwrap_or_default())
            .bind(q.user.clone().unwrap_or_default())
            .bind(since)
            .bind(limit)
            .fetch_all(&self.backend.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows.iter().rev() {
            let seq: i64 = r.try_get(0)?;
            let text: String = r.try_get(1)?;
            let record: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            // A record that does not hash to its own `hash` was edited in place: say so rather
            // than hand it out as evidence.
            let intact = record.as_object().is_some_and(|m| {
                m.get("seq").and_then(Value::as_i64) == Some(seq)
                    && m.get("hash").and_then(Value::as_str) == Some(audit::chain_hash(m).as_str())
            });
            if !intact {
                return Err(AuthError::Conflict(format!(
                    "audit record {seq} fails its hash check: it was changed in the database; run `sallyctl audit verify`"
                )));
            }
            out.push(record);
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
        let mut v = match &self.audit_anchor {
            Some(a) => {
                let rows = sqlx::query(
                    "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints ORDER BY seq",
                )
                .fetch_all(&self.backend.pool)
                .await?;
                let checkpoints = rows
                    .iter()
                    .map(checkpoint_row)
                    .collect::<Result<Vec<_>, _>>()?;
                audit::verify_anchored(
                    &records,
                    &checkpoints,
                    a.key.public_key(),
                    &self.config.cluster_name,
                    a.remembered().as_ref(),
                )
            }
            None => {
                let mut v = audit::verify(&records);
                if v.ok {
                    v.message.push_str(
                        "; not anchored: no checkpoint key is configured, so a database writer could have re-hashed it",
                    );
                }
                v
            }
        };
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

fn checkpoint_row(r: &sqlx::any::AnyRow) -> Result<Checkpoint, AuthError> {
    Ok(Checkpoint {
        seq: r.try_get(0)?,
        hash: r.try_get(1)?,
        time: r.try_get(2)?,
        prev_seq: r.try_get(3)?,
        signature: r.try_get(4)?,
    })
}

/// `since` (Unix seconds) as the start of a record's `time`: `YYYY-MM-DDTHH:MM:SS`.
fn since_text(since: i64) -> String {
    match time::OffsetDateTime::from_unix_timestamp(since) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn since_is_the_prefix_of_record_times() {
        let t = time::OffsetDateTime::from_unix_timestamp(1_700_000_000)
            .unwrap_or_else(|e| panic!("{e}"));
        let record = t
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        assert_eq!(super::since_text(1_700_000_000), "2023-11-14T22:13:20");
        assert!(record.as_str() >= "2023-11-14T22:13:20");
        assert!("2023-11-14T22:13:20.5Z" >= "2023-11-14T22:13:20");
        assert!("2023-11-14T22:13:19.9Z" < "2023-11-14T22:13:20");
    }
}
