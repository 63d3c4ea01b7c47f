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
//! at most `audit_checkpoint_interval` after a record was written. The last checkpoint it
//! signed is also remembered in the data dir (`audit-checkpoint.last`). Before signing it
//! requires that checkpoint to be in the database exactly as signed and the records since it
//! to link to it up to the head: the database's own newest checkpoint is not enough, since a
//! writer who removes checkpoints and re-hashes the records after them leaves a chain that
//! links to an older one (or GENESIS), and signing that would launder the rewrite. When this
//! does not hold it refuses (logged as an error, the record itself still written), and
//! `audit_verify`, which checks every checkpoint with the key from the data dir and the
//! remembered one against the database, fails and says why.
//!
//! What that proves: every record up to the last checkpoint is what auth wrote, none is
//! missing, and no checkpoint was removed or forged. What it cannot: records after the last
//! checkpoint (at most a minute's, or `every` records) are only as safe as the database; and
//! whoever holds the key file (root on the auth host, a backup of the data dir) can sign a
//! rewritten chain. With several auth instances on PostgreSQL, all must share the same key file
//! (a KMS later), and each remembers only the checkpoints it signed itself.
//!
//! Searches filter on the records themselves (what the chain hashes), never on the side columns
//! `event_type`, `user_name` and `time`, which nothing verifies. Each result is checked before
//! it is returned: its own hash, then against the chain — the span of records its covering
//! checkpoint signed must link from the checkpoint before it to the signed hash (checked once
//! per checkpoint, then kept in memory), and a result after the last checkpoint must link from
//! it to the chain head; the first such result is reported as not yet anchored.

use sallyport_core::metrics::{AuditQueue, metrics};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_core::api::{AuditQuery, AuditVerify};
use sallyport_core::audit::{self, Checkpoint, Event, EventType, GENESIS};
use serde_json::Value;
use sqlx::{Any, Row, Transaction};

use crate::backend::Kind;
use crate::{AuthConfig, AuthError, AuthServer};

const HEAD: &str = "audit_head";

// Searches read the fields of the record itself. Record times are RFC 3339 in UTC
// ("…T18:10:28.123Z"): compared as bytes (PostgreSQL: the "C" collation) with the same form cut
// before the fraction ($3), a record of the very second `since` names counts.
//
// An event renamed by the catalogue is searched under both names ($1 today's, $5 the former
// one or ''): records written before the rename keep the old name, hashed into the chain.
/// A search's filters; `$1` type, `$5` its former name, `$2` user, `$3` since (text of the
/// record's `time`, inclusive), `$6` node, `$7` session, `$8` until (exclusive), `$9` below
/// this seq, `$10` above this seq (0: no bound). Then `ORDER BY seq DESC|ASC LIMIT $4`.
macro_rules! search_sqlite {
    ($order:literal) => {
        concat!(
            "SELECT seq, record FROM audit_events
     WHERE ($1 = '' OR json_extract(record, '$.event') IN ($1, $5))
       AND ($2 = '' OR json_extract(record, '$.user') = $2)
       AND ($3 = '' OR json_extract(record, '$.time') >= $3)
       AND ($6 = '' OR json_extract(record, '$.node') = $6)
       AND ($7 = '' OR json_extract(record, '$.session_id') = $7)
       AND ($8 = '' OR json_extract(record, '$.time') < $8)
       AND ($9 = 0 OR seq < $9)
       AND ($10 = 0 OR seq > $10)
     ORDER BY seq ",
            $order,
            " LIMIT $4"
        )
    };
}
macro_rules! search_postgres {
    ($order:literal) => {
        concat!(
            "SELECT seq, record FROM audit_events
     WHERE ($1 = '' OR (record::jsonb ->> 'event') IN ($1, $5))
       AND ($2 = '' OR (record::jsonb ->> 'user') = $2)
       AND ($3 = '' OR (record::jsonb ->> 'time') COLLATE \"C\" >= $3)
       AND ($6 = '' OR (record::jsonb ->> 'node') = $6)
       AND ($7 = '' OR (record::jsonb ->> 'session_id') = $7)
       AND ($8 = '' OR (record::jsonb ->> 'time') COLLATE \"C\" < $8)
       AND ($9 = 0 OR seq < $9)
       AND ($10 = 0 OR seq > $10)
     ORDER BY seq ",
            $order,
            " LIMIT $4"
        )
    };
}

/// The checkpoint signing key and where the last checkpoint signed with it is remembered.
pub(crate) struct Anchor {
    key: PrivateKey,
    remembered: PathBuf,
    every: i64,
    /// Spans searches have checked against their checkpoint, by (checkpoint seq, hash): the
    /// records' hashes, oldest spans first out.
    spans: Mutex<SpanCache>,
    /// Why the last checkpoint was refused (a rewrite seen), until one is signed again:
    /// `sallyctl status` shows it, so that stopped anchoring does not go unnoticed.
    stopped: Mutex<Option<String>>,
    /// The key was made at this start (no file was there).
    made: bool,
}

impl Anchor {
    /// Loads the key named in the config, creating it (0600) at first start.
    pub(crate) fn load(config: &AuthConfig) -> Result<Option<Anchor>, AuthError> {
        let Some(path) = &config.audit_checkpoint_key else {
            return Ok(None);
        };
        let mut made = false;
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
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                made = true;
                create_key(path)?
            }
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
            spans: Mutex::new(BTreeMap::new()),
            stopped: Mutex::new(None),
            made,
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

    fn set_stopped(&self, why: Option<String>) {
        if let Ok(mut stopped) = self.stopped.lock() {
            *stopped = why;
        }
    }

    /// Remembers `cp` once it is committed (never before: a remembered checkpoint the
    /// database lacks reads as removed).
    fn remember(&self, cp: &Checkpoint) {
        self.set_stopped(None);
        if self.remembered().is_some_and(|r| r.seq >= cp.seq) {
            return;
        }
        let result = serde_json::to_vec(cp)
            .map_err(std::io::Error::other)
            .and_then(|doc| sallyport_core::files::replace_private(&self.remembered, &doc));
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
    sallyport_core::files::replace_private(path, text.as_bytes()).map_err(|e| {
        AuthError::Internal(format!(
            "cannot write the audit checkpoint key {}: {e}",
            path.display()
        ))
    })?;
    tracing::info!(file = %path.display(), "made the audit checkpoint key");
    Ok(key)
}

impl AuthServer {
    /// A second auth instance on a database whose chain another one anchors must sign with the
    /// same key: one that made a key of its own at this start, where checkpoints signed by
    /// another key already are, stops with what to do (its key removed again), rather than run
    /// and have every search and `audit verify` report the other's checkpoints as forged.
    pub(crate) async fn check_checkpoint_key(&self) -> Result<(), AuthError> {
        let Some(a) = self.audit_anchor.as_ref() else {
            return Ok(());
        };
        let path = self.config.audit_checkpoint_key.clone().unwrap_or_default();
        let refuse = || {
            // Only a key this start made is removed: an operator's file is theirs.
            if a.made {
                let _ = std::fs::remove_file(&path);
            }
            AuthError::Internal(format!(
                "the audit chain in this database is anchored by another auth instance's checkpoint key, not this one's ({}): auth instances on one database share one key; copy audit-checkpoint.key from that instance's data dir to {} (mode 0600) and start again",
                path.display(),
                path.display()
            ))
        };
        // A database from before the key was recorded: its newest checkpoint names the key.
        if a.made {
            let row = sqlx::query(
                "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints ORDER BY seq DESC LIMIT 1",
            )
            .fetch_optional(&self.backend.pool)
            .await?;
            if let Some(row) = row
                && !checkpoint_row(&row)?
                    .is_signed_by(a.key.public_key(), &self.config.cluster_name)
            {
                return Err(refuse());
            }
        }
        // The first instance's key is the cluster's, recorded once (two instances starting
        // together on an empty database agree on one): every start compares.
        let ours = a
            .key
            .public_key()
            .to_openssh()
            .map_err(|e| AuthError::Internal(e.to_string()))?;
        let cluster = self
            .backend
            .init_state("audit_checkpoint_key", &ours)
            .await?;
        if cluster != ours {
            return Err(refuse());
        }
        Ok(())
    }
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

/// Numbers callers' appends (see [`Pending::withdraw`]).
static NEXT_APPEND: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The most events one group commit writes (a caller's own are never split).
const BATCH_EVENTS: usize = 512;

/// Appends waiting for the chain's writer: each caller's events and where its answer goes.
#[derive(Default)]
pub(crate) struct Pending(Mutex<Vec<PendingAppend>>);

/// A caller's events, the caller's number (to withdraw them), and where its answer goes.
type PendingAppend = (
    Vec<Event>,
    u64,
    tokio::sync::oneshot::Sender<Result<(), AuthError>>,
);

impl Pending {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<PendingAppend>> {
        match self.0.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// The oldest callers' appends, whole, up to `max` events (at least one caller's).
    /// Takes back caller `id`'s events if no writer has taken them yet.
    fn withdraw(&self, id: u64) {
        self.lock().retain(|(_, n, _)| *n != id);
    }

    /// The writer stopped without emptying the queue (it panicked, or its task was
    /// cancelled): every caller still queued is told nothing of theirs was written, and the
    /// next append starts a writer again (it finds the queue empty).
    fn fail_all(&self) {
        for (_, _, done) in self.lock().drain(..) {
            let _ = done.send(Err(AuthError::Internal(
                "the audit writer stopped; these records were not written".into(),
            )));
        }
    }

    fn take(&self, max: usize) -> Vec<PendingAppend> {
        let mut p = self.lock();
        let mut n = 0;
        let mut count = 0;
        for (events, _, _) in p.iter() {
            if count > 0 && n + events.len() > max {
                break;
            }
            n += events.len();
            count += 1;
        }
        p.drain(..count).collect()
    }
}

/// One record in `sallyport_audit_queue_depth{queue="auth_audit_writer"}` while it lives.
struct WriterQueue;

impl WriterQueue {
    fn enter() -> Self {
        metrics().audit_queued(AuditQueue::AuthAuditWriter, 1);
        WriterQueue
    }
}

impl Drop for WriterQueue {
    fn drop(&mut self) {
        metrics().audit_dequeued(AuditQueue::AuthAuditWriter, 1);
    }
}

impl AuthServer {
    /// Appends one event to the chain.
    pub async fn emit(&self, event: Event) -> Result<(), AuthError> {
        self.emit_all(vec![event]).await
    }

    /// Appends `events` to the chain in their order, in one transaction: all of them or, if
    /// it fails, none (a caller that is told so may send them again without doubling any).
    /// A report of many records (a proxy's batch of `kube.request`s) is one write, not one each.
    ///
    /// Group commit: the chain has one writer at a time, and a write is a handful of
    /// statements, so under load (every session start and end is a caller) callers queued
    /// behind the writer (auth's audit queue hit ~195 at 250 sessions/s asked) and the writer's
    /// pace set the sessions' pace. Callers now join a batch; the first of a batch starts a
    /// writer task, which takes every batch waiting once it holds the chain's lock and writes
    /// them in one transaction, each caller's events together and in order. A batch's failure
    /// is every caller's, and none of them was written, as before. The writer is a task of its
    /// own so that a caller that goes away (its request dropped) cannot leave the others
    /// without an answer; such a caller takes its events back if no writer took them yet
    /// (then nothing of it is written, and it may send them again), and a writer that dies
    /// tells every caller still queued (`Pending::fail_all`).
    pub async fn emit_all(&self, events: Vec<Event>) -> Result<(), AuthError> {
        if events.is_empty() {
            return Ok(());
        }
        // Waiting for the chain's writer, or being written: auth's audit queue.
        let _queued = WriterQueue::enter();
        let (done, answer) = tokio::sync::oneshot::channel();
        let id = NEXT_APPEND.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let first = {
            let mut p = self.audit_pending.lock();
            p.push((events, id, done));
            p.len() == 1
        };
        // A caller that goes away before a writer took its events takes them back, so that
        // nothing is written for it (as when it waited for the lock itself): a caller that
        // gave up may send them again without doubling any. Once taken, they are written.
        struct Withdraw<'a>(&'a Pending, u64);
        impl Drop for Withdraw<'_> {
            fn drop(&mut self) {
                self.0.withdraw(self.1);
            }
        }
        let _withdraw = Withdraw(&self.audit_pending, id);
        if first {
            match self.me.upgrade() {
                Some(me) => {
                    tokio::spawn(async move { me.write_pending().await });
                }
                // The server is going away: write here.
                None => self.write_pending().await,
            }
        }
        match answer.await {
            Ok(r) => r,
            Err(_) => Err(AuthError::Internal(
                "the audit writer stopped before it answered".into(),
            )),
        }
    }

    /// Writes what callers queued, batch after batch (at most [`BATCH_EVENTS`] events each,
    /// every caller's whole), until the queue is empty.
    async fn write_pending(&self) {
        // If this writer dies (a panic, its task cancelled at shutdown) the callers still
        // queued must hear so, and the queue must be left empty so that the next append
        // starts a writer: a writer that vanished with callers queued would hang every
        // append after it.
        struct Stopped<'a>(&'a Pending, bool);
        impl Drop for Stopped<'_> {
            fn drop(&mut self) {
                if !self.1 {
                    self.0.fail_all();
                }
            }
        }
        let mut stopped = Stopped(&self.audit_pending, false);
        loop {
            let _guard = self.audit_lock.lock().await;
            let batch = self.audit_pending.take(BATCH_EVENTS);
            if batch.is_empty() {
                stopped.1 = true;
                return;
            }
            let mut events = Vec::new();
            let mut callers = Vec::with_capacity(batch.len());
            for (e, _, done) in batch {
                events.extend(e);
                callers.push(done);
            }
            let r = self.append(events).await;
            for done in callers {
                let _ = done.send(r.clone());
            }
        }
    }

    /// One transaction appending `events` (the chain's lock held).
    async fn append(&self, events: Vec<Event>) -> Result<(), AuthError> {
        let added = events.len() as i64;
        let mut tx = self.backend.pool.begin().await?;
        let (mut seq, mut hash) = self.lock_head(&mut tx).await?;
        let now = time::OffsetDateTime::now_utc();
        for event in events {
            let event = event.storable();
            let (record, sealed) =
                audit::seal(&event, &self.config.cluster_name, seq + 1, &hash, now);
            sqlx::query("INSERT INTO audit_events (seq, time, event_type, user_name, record, hash) VALUES ($1, $2, $3, $4, $5, $6)")
                .bind(seq + 1)
                .bind(now.unix_timestamp())
                .bind(event.event.name())
                .bind(event.user.clone())
                .bind(record.to_string())
                .bind(&sealed)
                .execute(&mut *tx)
                .await?;
            seq += 1;
            hash = sealed;
        }
        sqlx::query("INSERT INTO cluster_state (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = excluded.value")
            .bind(HEAD)
            .bind(format!("{seq}:{hash}"))
            .execute(&mut *tx)
            .await?;
        // A checkpoint that cannot be signed is logged, never a reason to lose the record.
        let signed = match &self.audit_anchor {
            Some(a) => match self
                .sign_checkpoint(&mut tx, a, seq, &hash, Some(added))
                .await
            {
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
        let name = event.event;
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
        let signed = self.sign_checkpoint(&mut tx, a, seq, &hash, None).await?;
        tx.commit().await?;
        Ok(signed.map(|cp| {
            a.remember(&cp);
            cp.seq
        }))
    }

    /// Writes the chain head of an empty log (record 0, GENESIS) unless there is one: the row
    /// [`lock_head`](Self::lock_head) locks must exist before the first record, or two
    /// instances writing their first records at once would both take record 1 (one of them
    /// then failing on the key).
    pub(crate) async fn seed_audit_head(&self) -> Result<(), AuthError> {
        self.backend
            .init_state(HEAD, &format!("0:{GENESIS}"))
            .await
            .map(|_| ())
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
    /// checkpoint are checked to link to it; `only_when_due`, with the records just added:
    /// only when they reached or passed a multiple of `every` records past it.
    async fn sign_checkpoint(
        &self,
        tx: &mut Transaction<'_, Any>,
        a: &Anchor,
        head_seq: i64,
        head_hash: &str,
        only_when_due: Option<i64>,
    ) -> Result<Option<Checkpoint>, AuthError> {
        let last = sqlx::query(
            "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints ORDER BY seq DESC LIMIT 1",
        )
        .fetch_optional(&mut **tx)
        .await?
        .map(|r| checkpoint_row(&r))
        .transpose()?;
        let last_seq = last.as_ref().map_or(0, |cp| cp.seq);
        let pending = head_seq - last_seq;
        // Added one at a time, this is "at a multiple of `every`"; a batch may step over one.
        let not_due = |added: i64| pending / a.every == (pending - added).max(0) / a.every;
        if pending <= 0 || only_when_due.is_some_and(not_due) {
            return Ok(None);
        }
        let prev_seq = self
            .check_before_signing(tx, a, last.as_ref(), head_seq, head_hash)
            .await
            .map_err(|e| match e {
                AuthError::Conflict(why) => {
                    let why = format!(
                        "not signing an audit checkpoint: {why}; run `sallyctl audit verify`"
                    );
                    a.set_stopped(Some(why.clone()));
                    AuthError::Conflict(why)
                }
                other => other,
            })?;
        let cp = Checkpoint::sign(
            &a.key,
            &self.config.cluster_name,
            head_seq,
            head_hash,
            sallyport_core::unix_now(),
            prev_seq,
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

    /// What must hold before a checkpoint over the head is signed; returns the seq of the
    /// database's newest checkpoint (the new one's `prev_seq`).
    ///
    /// The records are checked from the last checkpoint this server remembers signing, which
    /// must still be in the database exactly as signed: the database's own newest checkpoint
    /// is no ground to stand on, since a writer who removes checkpoints and re-hashes the
    /// records after them leaves a chain that links to an older one (or to GENESIS), and
    /// signing over it would launder the rewrite. Checkpoints after the remembered one (signed
    /// by another instance, or not remembered because the file could not be written) must be
    /// signed, follow each other and name the hash their record has. Only with no remembered
    /// checkpoint (first start, or an operator who removed the file to accept a restored
    /// backup) is the database's newest checkpoint the start, its signature checked.
    async fn check_before_signing(
        &self,
        tx: &mut Transaction<'_, Any>,
        a: &Anchor,
        last: Option<&Checkpoint>,
        head_seq: i64,
        head_hash: &str,
    ) -> Result<i64, AuthError> {
        let cluster = &self.config.cluster_name;
        let key = a.key.public_key();
        let (from_seq, from_hash) = match a.remembered().filter(|r| r.is_signed_by(key, cluster)) {
            Some(r) => {
                let stored = sqlx::query(
                    "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints WHERE seq = $1",
                )
                .bind(r.seq)
                .fetch_optional(&mut **tx)
                .await?
                .map(|row| checkpoint_row(&row))
                .transpose()?;
                match stored {
                    None => {
                        return Err(AuthError::Conflict(format!(
                            "checkpoint {}, the last this server signed, is missing from the database: checkpoints were removed",
                            r.seq
                        )));
                    }
                    Some(s) if s != r => {
                        return Err(AuthError::Conflict(format!(
                            "checkpoint {} in the database is not the one this server signed: checkpoints were replaced",
                            r.seq
                        )));
                    }
                    Some(_) => {}
                }
                // The record it signed, directly: the records after it only show that they
                // link to *a* record with that hash.
                let record: Option<String> =
                    sqlx::query("SELECT record FROM audit_events WHERE seq = $1")
                        .bind(r.seq)
                        .fetch_optional(&mut **tx)
                        .await?
                        .map(|row| row.try_get(0))
                        .transpose()?;
                let intact = record
                    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
                    .is_some_and(|v| {
                        v.as_object().is_some_and(|m| {
                            m.get("hash").and_then(Value::as_str) == Some(r.hash.as_str())
                                && audit::chain_hash(m) == r.hash
                        })
                    });
                if !intact {
                    return Err(AuthError::Conflict(format!(
                        "record {} is missing or does not have the hash checkpoint {} signed",
                        r.seq, r.seq
                    )));
                }
                (r.seq, r.hash)
            }
            None => match last {
                Some(cp) if !cp.is_signed_by(key, cluster) => {
                    return Err(AuthError::Conflict(format!(
                        "the last audit checkpoint ({}) is not signed by the checkpoint key",
                        cp.seq
                    )));
                }
                Some(cp) => (cp.seq, cp.hash.clone()),
                None => (0, GENESIS.to_string()),
            },
        };
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
            return Err(AuthError::Conflict(v.message));
        }
        let tail = records
            .last()
            .and_then(|r| r.get("hash"))
            .and_then(Value::as_str);
        if v.checked as i64 != head_seq - from_seq || tail != Some(head_hash) {
            return Err(AuthError::Conflict(format!(
                "the chain head is record {head_seq} but the records after checkpoint {from_seq} end elsewhere"
            )));
        }
        let later = sqlx::query(
            "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints WHERE seq > $1 ORDER BY seq",
        )
        .bind(from_seq)
        .fetch_all(&mut **tx)
        .await?;
        let mut prev_seq = from_seq;
        for row in &later {
            let cp = checkpoint_row(row)?;
            let hash = usize::try_from(cp.seq - from_seq - 1)
                .ok()
                .and_then(|i| records.get(i))
                .and_then(|r| r.get("hash"))
                .and_then(Value::as_str);
            if !cp.is_signed_by(key, cluster)
                || cp.prev_seq != prev_seq
                || hash != Some(cp.hash.as_str())
            {
                return Err(AuthError::Conflict(format!(
                    "checkpoint {} is not signed, does not follow checkpoint {prev_seq} or does not match its record",
                    cp.seq
                )));
            }
            prev_seq = cp.seq;
        }
        Ok(prev_seq)
    }

    /// Records matching `q`, oldest first, each checked against the chain before it is handed
    /// out: its own hash, then (with a checkpoint key) the signed span it lies in.
    pub async fn audit_search(&self, q: &AuditQuery) -> Result<AuditSearch, AuthError> {
        let limit = i64::from(q.limit.unwrap_or(1000).min(10_000));
        // Paging forward (any `after`, 0 too: from the first record) takes the oldest after the
        // cursor; everything else the newest.
        let forward = q.after.is_some_and(|a| a >= 0);
        let sql = match (self.backend.kind, forward) {
            (Kind::Sqlite, false) => search_sqlite!("DESC"),
            (Kind::Sqlite, true) => search_sqlite!("ASC"),
            (Kind::Postgres, false) => search_postgres!("DESC"),
            (Kind::Postgres, true) => search_postgres!("ASC"),
        };
        // The end of `until`'s second, as the text a record's `time` is compared with.
        let until = q
            .until
            .filter(|u| *u > 0)
            .map(|u| since_text(u.saturating_add(1)))
            .unwrap_or_default();
        let since = q
            .since
            .filter(|s| *s > 0)
            .map(since_text)
            .unwrap_or_default();
        // A type is looked up under today's and former names, so that a saved query goes on
        // finding new records and an old name finds old ones; a name that never was an event
        // is a mistake worth saying rather than an empty answer.
        let event_type = match q.event_type.as_deref().filter(|t| !t.is_empty()) {
            None => None,
            Some(name) => Some(EventType::find(name).ok_or_else(|| {
                AuthError::BadRequest(
                    audit::catalogue::UnknownEventType { name: name.into() }.to_string(),
                )
            })?),
        };
        let rows = sqlx::query(sql)
            .bind(event_type.map(EventType::name).unwrap_or_default())
            .bind(q.user.clone().unwrap_or_default())
            .bind(since)
            .bind(limit)
            .bind(
                event_type
                    .and_then(EventType::former_name)
                    .unwrap_or_default(),
            )
            .bind(q.node.clone().unwrap_or_default())
            .bind(q.session.clone().unwrap_or_default())
            .bind(until)
            .bind(q.before.filter(|b| *b > 0).unwrap_or(0))
            .bind(q.after.filter(|a| *a >= 0).unwrap_or(0))
            .fetch_all(&self.backend.pool)
            .await?;
        let mut records = Vec::with_capacity(rows.len());
        // Oldest first, whichever way the rows came.
        let ordered: Vec<_> = if forward {
            rows.iter().collect()
        } else {
            rows.iter().rev().collect()
        };
        for r in ordered {
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
            records.push((seq, record));
        }
        let unanchored_from = match &self.audit_anchor {
            Some(a) if !records.is_empty() => self.check_against_chain(a, &records).await?,
            _ => None,
        };
        Ok(AuditSearch {
            records: records.into_iter().map(|(_, r)| r).collect(),
            unanchored_from,
        })
    }

    /// Checks search results (ascending, each already hashing to its own `hash`) against the
    /// chain: a result a checkpoint covers must be in the span that checkpoint signed (the
    /// records from the checkpoint before it link, one by one, to the signed hash); a result
    /// past the last checkpoint must link from it up to the chain head. A database writer's
    /// re-hash therefore cannot pass a search either. Returns the first result no checkpoint
    /// covers yet.
    async fn check_against_chain(
        &self,
        a: &Anchor,
        records: &[(i64, Value)],
    ) -> Result<Option<i64>, AuthError> {
        let pool = &self.backend.pool;
        let tampered =
            |what: String| AuthError::Conflict(format!("{what}; run `sallyctl audit verify`"));
        // With checkpoints removed, every result would look merely "not yet anchored".
        if let Some(r) = a
            .remembered()
            .filter(|r| r.is_signed_by(a.key.public_key(), &self.config.cluster_name))
        {
            let stored = sqlx::query(
                "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints WHERE seq = $1",
            )
            .bind(r.seq)
            .fetch_optional(pool)
            .await?
            .map(|row| checkpoint_row(&row))
            .transpose()?;
            if stored.as_ref() != Some(&r) {
                return Err(tampered(format!(
                    "audit checkpoint {} is missing from the database or not the one auth signed: checkpoints were removed",
                    r.seq
                )));
            }
        }
        // Read after the results, so that every result is at or below it.
        let (head_seq, head_hash) = match self.backend.get_state(HEAD).await? {
            Some(h) => match h.split_once(':') {
                Some((s, h)) => (s.parse::<i64>().unwrap_or(0), h.to_string()),
                None => (0, GENESIS.to_string()),
            },
            None => (0, GENESIS.to_string()),
        };
        let mut span: Option<Span> = None;
        let mut unanchored_from = None;
        for (seq, record) in records {
            let covered = span.as_ref().is_some_and(|s| s.from < *seq && *seq <= s.to);
            if !covered {
                let next = self.checkpoint_from(*seq).await?;
                span = Some(match next {
                    Some(cp) => self.signed_span(a, &cp).await?,
                    None => {
                        if *seq > head_seq {
                            return Err(tampered(format!(
                                "audit record {seq} is past the chain head (record {head_seq}): it was added in the database"
                            )));
                        }
                        let tail = self.unsigned_tail(a, head_seq, &head_hash).await?;
                        if tail.from < *seq {
                            unanchored_from = Some(*seq);
                            tail
                        } else {
                            // The background task anchored this record between the two reads:
                            // its checkpoint is there now.
                            match self.checkpoint_from(*seq).await? {
                                Some(cp) => self.signed_span(a, &cp).await?,
                                None => tail,
                            }
                        }
                    }
                });
            }
            let expected = span.as_ref().and_then(|s| {
                usize::try_from(seq - s.from - 1)
                    .ok()
                    .and_then(|i| s.hashes.get(i))
            });
            let actual = record
                .get("hash")
                .and_then(Value::as_str)
                .and_then(|h| hex::decode(h).ok());
            if actual.as_deref() != expected.map(|h| h.as_slice()) {
                // What the result was checked against, for whoever reads the log after a
                // search refused its results.
                if let Some(s) = &span {
                    tracing::warn!(
                        seq,
                        span_from = s.from,
                        span_to = s.to,
                        span_records = s.hashes.len(),
                        head_seq,
                        expected = %expected.map(hex::encode).unwrap_or_default(),
                        actual = %actual.as_deref().map(hex::encode).unwrap_or_default(),
                        "an audit search result does not match the chain"
                    );
                }
                return Err(tampered(format!(
                    "audit record {seq} is not the one in the checked chain: it was changed in the database"
                )));
            }
        }
        Ok(unanchored_from)
    }

    /// The first checkpoint at or after record `seq`: the one whose span holds it.
    async fn checkpoint_from(&self, seq: i64) -> Result<Option<Checkpoint>, AuthError> {
        sqlx::query(
            "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints WHERE seq >= $1 ORDER BY seq LIMIT 1",
        )
        .bind(seq)
        .fetch_optional(&self.backend.pool)
        .await?
        .map(|row| checkpoint_row(&row))
        .transpose()
    }

    /// The span checkpoint `cp` signs: the records after the checkpoint before it up to `cp`,
    /// checked to link from that checkpoint's signed hash to `cp`'s. Checked once per
    /// checkpoint and kept, so repeated searches read one checkpoint row per span.
    async fn signed_span(&self, a: &Anchor, cp: &Checkpoint) -> Result<Span, AuthError> {
        let cached = a
            .spans
            .lock()
            .ok()
            .and_then(|spans| spans.get(&(cp.seq, cp.hash.clone())).cloned());
        if let Some(hashes) = cached {
            return Ok(Span {
                from: cp.prev_seq,
                to: cp.seq,
                hashes,
            });
        }
        let cluster = &self.config.cluster_name;
        let key = a.key.public_key();
        let pool = &self.backend.pool;
        if !cp.is_signed_by(key, cluster) {
            return Err(AuthError::Conflict(format!(
                "audit checkpoint {} is not signed by the checkpoint key: it was forged or altered in the database; run `sallyctl audit verify`",
                cp.seq
            )));
        }
        let from_hash = if cp.prev_seq == 0 {
            GENESIS.to_string()
        } else {
            let prev = sqlx::query(
                "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints WHERE seq = $1",
            )
            .bind(cp.prev_seq)
            .fetch_optional(pool)
            .await?
            .map(|row| checkpoint_row(&row))
            .transpose()?;
            match prev {
                Some(p) if p.is_signed_by(key, cluster) => p.hash,
                _ => {
                    return Err(AuthError::Conflict(format!(
                        "audit checkpoint {}, which checkpoint {} follows, is missing from the database or not signed: checkpoints were removed; run `sallyctl audit verify`",
                        cp.prev_seq, cp.seq
                    )));
                }
            }
        };
        let hashes = read_span(pool, cp.prev_seq, cp.seq, &from_hash, &cp.hash)
            .await?
            .map_err(|why| {
                let which = if cp.prev_seq + 1 == cp.seq {
                    format!("audit record {} does", cp.seq)
                } else {
                    format!("audit records {} to {} do", cp.prev_seq + 1, cp.seq)
                };
                AuthError::Conflict(format!(
                    "{which} not match the signed checkpoint {} ({why}): the database was changed and the chain re-hashed; run `sallyctl audit verify`",
                    cp.seq
                ))
            })?;
        let hashes = Arc::new(hashes);
        if let Ok(mut spans) = a.spans.lock() {
            spans.insert((cp.seq, cp.hash.clone()), hashes.clone());
            // Bounded: the oldest spans go first (searches mostly ask for recent records).
            while spans.values().map(|h| h.len()).sum::<usize>() > SPAN_CACHE_RECORDS
                && spans.len() > 1
            {
                spans.pop_first();
            }
        }
        Ok(Span {
            from: cp.prev_seq,
            to: cp.seq,
            hashes,
        })
    }

    /// The records after the last checkpoint, checked to link from it up to the chain head.
    /// Not kept: the tail grows, and no signature vouches for it yet.
    async fn unsigned_tail(
        &self,
        a: &Anchor,
        head_seq: i64,
        head_hash: &str,
    ) -> Result<Span, AuthError> {
        let pool = &self.backend.pool;
        let last = sqlx::query(
            "SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints WHERE seq <= $1 ORDER BY seq DESC LIMIT 1",
        )
        .bind(head_seq)
        .fetch_optional(pool)
        .await?
        .map(|row| checkpoint_row(&row))
        .transpose()?;
        let (from, from_hash) = match last {
            Some(cp) if cp.is_signed_by(a.key.public_key(), &self.config.cluster_name) => {
                (cp.seq, cp.hash)
            }
            Some(cp) => {
                return Err(AuthError::Conflict(format!(
                    "audit checkpoint {} is not signed by the checkpoint key: it was forged or altered in the database; run `sallyctl audit verify`",
                    cp.seq
                )));
            }
            None => (0, GENESIS.to_string()),
        };
        let hashes = read_span(pool, from, head_seq, &from_hash, head_hash)
            .await?
            .map_err(|why| {
                AuthError::Conflict(format!(
                    "the audit records after checkpoint {from} do not lead to the chain head ({why}): they were changed in the database; run `sallyctl audit verify`"
                ))
            })?;
        Ok(Span {
            from,
            to: head_seq,
            hashes: Arc::new(hashes),
        })
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
            // The seeded head of an empty log names no record.
            let head = self
                .backend
                .get_state(HEAD)
                .await?
                .filter(|h| !h.starts_with("0:"));
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

    /// Why auth stopped signing audit checkpoints, if it did (see [`Anchor`]).
    pub fn audit_anchoring_stopped(&self) -> Option<String> {
        self.audit_anchor
            .as_ref()
            .and_then(|a| a.stopped.lock().ok().and_then(|s| s.clone()))
    }

    pub async fn audit_count(&self) -> Result<u64, AuthError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM audit_events")
            .fetch_one(&self.backend.pool)
            .await?
            .try_get(0)?;
        Ok(n.max(0) as u64)
    }
}

/// What an audit search found: the records, oldest first, and the first of them that no
/// signed checkpoint covers yet (sent as the [`audit::UNANCHORED_HEADER`] header).
pub struct AuditSearch {
    pub records: Vec<Value>,
    pub unanchored_from: Option<i64>,
}

/// Checked spans' record hashes by (checkpoint seq, checkpoint hash).
type SpanCache = BTreeMap<(i64, String), Arc<Vec<[u8; 32]>>>;

/// At most this many record hashes of checked spans are kept (32 bytes each: 32 MiB).
const SPAN_CACHE_RECORDS: usize = 1 << 20;

/// Records `from + 1 ..= to` of the chain, checked: their hashes, in order.
struct Span {
    from: i64,
    to: i64,
    hashes: Arc<Vec<[u8; 32]>>,
}

/// Reads records `from + 1 ..= to` and checks that they link from `from_hash` to `to_hash`;
/// the outer error is the database's, the inner one what does not hold.
async fn read_span(
    pool: &sqlx::AnyPool,
    from: i64,
    to: i64,
    from_hash: &str,
    to_hash: &str,
) -> Result<Result<Vec<[u8; 32]>, String>, AuthError> {
    let rows =
        sqlx::query("SELECT record FROM audit_events WHERE seq > $1 AND seq <= $2 ORDER BY seq")
            .bind(from)
            .bind(to)
            .fetch_all(pool)
            .await?;
    let mut records = Vec::with_capacity(rows.len());
    for r in &rows {
        let text: String = r.try_get(0)?;
        records.push(serde_json::from_str::<Value>(&text).unwrap_or(Value::Null));
    }
    let v = audit::verify_from(from, from_hash, &records);
    if !v.ok {
        return Ok(Err(v.message));
    }
    if v.checked as i64 != to - from {
        return Ok(Err(format!(
            "record {} is missing",
            from + v.checked as i64 + 1
        )));
    }
    let last = records
        .last()
        .and_then(|r| r.get("hash"))
        .and_then(Value::as_str);
    if to > from && last != Some(to_hash) {
        return Ok(Err(format!("record {to} does not have the signed hash")));
    }
    let mut hashes = Vec::with_capacity(records.len());
    for r in &records {
        let mut h = [0u8; 32];
        // verify_from checked each hash is the SHA-256 it computes: always 64 hex digits.
        let hex = r.get("hash").and_then(Value::as_str).unwrap_or("");
        if hex::decode_to_slice(hex, &mut h).is_err() {
            return Ok(Err(format!(
                "record {} has no hash",
                from + hashes.len() as i64 + 1
            )));
        }
        hashes.push(h);
    }
    Ok(Ok(hashes))
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
    use super::*;
    use crate::AuthConfig;
    use std::time::Duration;

    async fn auth() -> (tempfile::TempDir, Arc<AuthServer>) {
        sallyport_core::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let url = format!("sqlite:{}?mode=rwc", dir.path().join("a.db").display());
        let auth = AuthServer::open(AuthConfig::new("pending", &url))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        (dir, auth)
    }

    fn event(n: u32) -> Event {
        Event::new(EventType::UserDelete, Some("admin")).with("name", format!("u{n}"))
    }

    #[tokio::test]
    async fn a_caller_that_goes_away_before_its_records_are_taken_writes_nothing() {
        let (_dir, auth) = auth().await;
        let base = auth.audit_count().await.unwrap_or_else(|e| panic!("{e}"));
        // The chain busy (the lock held, as by a writer or the anchorer): the caller queues.
        let busy = auth.audit_lock.lock().await;
        let mut gone = Box::pin(auth.emit(event(1)));
        assert!(
            tokio::time::timeout(Duration::from_millis(50), &mut gone)
                .await
                .is_err()
        );
        drop(gone);
        assert!(
            auth.audit_pending.lock().is_empty(),
            "the caller took its records back"
        );
        let stays = tokio::spawn({
            let auth = auth.clone();
            async move { auth.emit(event(2)).await }
        });
        drop(busy);
        assert!(matches!(stays.await, Ok(Ok(()))));
        assert_eq!(
            auth.audit_count().await.unwrap_or_else(|e| panic!("{e}")),
            base + 1,
            "only the caller that stayed is written"
        );
    }

    #[tokio::test]
    async fn a_writer_that_dies_leaves_no_caller_waiting_and_the_next_append_goes_through() {
        let (_dir, auth) = auth().await;
        let base = auth.audit_count().await.unwrap_or_else(|e| panic!("{e}"));
        let busy = auth.audit_lock.lock().await;
        let waiting = tokio::spawn({
            let auth = auth.clone();
            async move { auth.emit(event(1)).await }
        });
        // Queued (however slow the machine) before the writer "dies".
        while auth.audit_pending.lock().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // What the writer's guard does when its task dies with callers queued.
        auth.audit_pending.fail_all();
        match waiting.await {
            Ok(Err(e)) => assert!(e.to_string().contains("not written"), "{e}"),
            other => panic!("the queued caller must hear of it: {other:?}"),
        }
        drop(busy);
        // The queue is empty again, so the next append starts a writer of its own.
        tokio::time::timeout(Duration::from_secs(10), auth.emit(event(2)))
            .await
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            auth.audit_count().await.unwrap_or_else(|e| panic!("{e}")),
            base + 1
        );
    }

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
