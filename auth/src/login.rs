//! Local login: argon2id passwords, TOTP with replay protection, server-side lockout, and the
//! certificates a successful login earns. Nothing here ever logs or audits a password or code.

use std::time::Duration;

use argon2::password_hash::PasswordHasher;
use argon2::{Algorithm, Argon2, Block, Params, Version};
use russh::keys::ssh_key::PublicKey;
use sallyport_core::api::{Certs, LoginRequest};
use sallyport_core::audit::{Event, EventType};
use sallyport_core::sshcert::{self, Permits, UserCertRequest};
use sallyport_core::x509::{Subject, ed25519_spki};
use sqlx::Row;

use crate::failures::Failure;
use crate::users::rfc3339;
use crate::{AuthError, AuthServer};

/// The one answer to every wrong credential: which part was wrong is never said, so a password
/// cannot be confirmed without the second factor, nor a user name without the password.
const BAD_CREDENTIALS: &str = "invalid user name or password";
const BAD_CREDENTIALS_OTP: &str = "invalid user name, password or one-time code";
/// The answer when every password check slot is taken and the queue did not move in time.
pub const BUSY: &str = "too many logins in progress; try again in a few seconds";
/// How long a login waits for a password check slot.
const CHECK_QUEUE: Duration = Duration::from_secs(3);
/// Logins waiting per slot before new ones are told to come back at once.
const WAITING_PER_SLOT: usize = 32;

/// Bounds concurrent password checks: argon2id works in ~19 MiB, so 200 unbounded parallel
/// logins took the daemon to 2.3 GB. Checks run at most one per core; others wait briefly in
/// line, and past that are answered 503 with [`BUSY`]. Each slot keeps its argon2 memory:
/// allocating 19 MiB per check left that much behind in every malloc arena the blocking
/// threads touched (measured: 537 MiB after 200 logins with only two checks at a time).
pub struct PasswordChecks {
    slots: std::sync::Arc<tokio::sync::Semaphore>,
    max_waiting: usize,
    waiting: std::sync::atomic::AtomicUsize,
    memory: Pool,
}

type Pool = std::sync::Arc<std::sync::Mutex<Vec<Vec<Block>>>>;

/// A password check slot, with its working memory. It is owned, not borrowed: the check runs
/// on a blocking thread that outlives the login when the client hangs up, and the slot goes
/// with it, so a check in progress keeps its slot (and its memory) until it has finished.
struct CheckSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    memory: Option<Vec<Block>>,
    pool: Pool,
}

impl Drop for CheckSlot {
    fn drop(&mut self) {
        // The memory goes back before the permit (dropped after this), so whoever takes the
        // permit next finds it.
        if let (Some(m), Ok(mut pool)) = (self.memory.take(), self.pool.lock()) {
            pool.push(m);
        }
    }
}

/// One login waiting in line for a slot; leaves the line however the wait ends, a client that
/// hung up included (otherwise every cancelled wait would shorten the line for good).
struct InLine<'a>(&'a std::sync::atomic::AtomicUsize);

impl Drop for InLine<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl CheckSlot {
    /// Checks `password` against a PHC argon2 hash in this slot's memory, on a blocking thread
    /// that owns the slot until the check is over.
    async fn verify(mut self, password: String, hash: String) -> bool {
        tokio::task::spawn_blocking(move || {
            let memory = self.memory.get_or_insert_with(Vec::new);
            let ok = verify_in(password.as_bytes(), &hash, memory);
            // What the check left in memory is derived from the password.
            memory.iter_mut().for_each(|b| *b = Block::new());
            ok
        })
        .await
        .unwrap_or(false)
    }
}

/// argon2's own verification, in memory the caller keeps (same parameters, salt and
/// constant-time comparison of the output as `PasswordVerifier`).
fn verify_in(password: &[u8], phc: &str, memory: &mut Vec<Block>) -> bool {
    use subtle::ConstantTimeEq;
    let Ok(hash) = argon2::password_hash::phc::PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (&hash.salt, &hash.hash) else {
        return false;
    };
    let Ok(algorithm) = Algorithm::try_from(hash.algorithm.as_str()) else {
        return false;
    };
    let version = match hash.version.map(Version::try_from) {
        None => Version::default(),
        Some(Ok(v)) => v,
        Some(Err(_)) => return false,
    };
    let Ok(params) = Params::try_from(&hash) else {
        return false;
    };
    let blocks = params.block_count();
    if memory.len() < blocks {
        memory.resize(blocks, Block::new());
    }
    let Some(work) = memory.get_mut(..blocks) else {
        return false;
    };
    let mut out = vec![0u8; expected.len()];
    Argon2::new(algorithm, version, params)
        .hash_password_into_with_memory(password, salt, &mut out, work)
        .is_ok()
        && bool::from(out.as_slice().ct_eq(expected.as_bytes()))
}

impl PasswordChecks {
    pub fn new() -> Self {
        Self::with_slots(std::thread::available_parallelism().map_or(2, |n| n.get()))
    }

    fn with_slots(slots: usize) -> Self {
        PasswordChecks {
            slots: std::sync::Arc::new(tokio::sync::Semaphore::new(slots)),
            max_waiting: slots * WAITING_PER_SLOT,
            waiting: std::sync::atomic::AtomicUsize::new(0),
            memory: Pool::default(),
        }
    }

    async fn slot(&self) -> Result<CheckSlot, AuthError> {
        use std::sync::atomic::Ordering;
        let busy = || AuthError::Busy(BUSY.into());
        let permit = match self.slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let in_line = self.waiting.fetch_add(1, Ordering::AcqRel);
                let _leaves = InLine(&self.waiting);
                if in_line >= self.max_waiting {
                    return Err(busy());
                }
                let acquire = self.slots.clone().acquire_owned();
                match tokio::time::timeout(CHECK_QUEUE, acquire).await {
                    Ok(Ok(p)) => p,
                    _ => return Err(busy()),
                }
            }
        };
        // At most one memory per permit is ever taken out, so the pool never grows past them.
        let memory = self.memory.lock().ok().and_then(|mut m| m.pop());
        Ok(CheckSlot {
            _permit: permit,
            memory: Some(memory.unwrap_or_default()),
            pool: self.memory.clone(),
        })
    }
}

impl Default for PasswordChecks {
    fn default() -> Self {
        Self::new()
    }
}

pub async fn hash_password(password: String) -> Result<String, AuthError> {
    tokio::task::spawn_blocking(move || {
        Argon2::default()
            .hash_password(password.as_bytes())
            .map(|h| h.to_string())
            .map_err(|e| AuthError::Internal(format!("password hashing: {e}")))
    })
    .await
    .map_err(|e| AuthError::Internal(e.to_string()))?
}

/// RFC 6238 with the parameters every authenticator app supports: SHA-1, 6 digits, 30 s.
pub fn new_totp(secret_b32: &str, user: &str, cluster: &str) -> Result<totp_rs::Totp, AuthError> {
    let secret = totp_rs::Secret::try_from_base32(secret_b32)
        .map_err(|e| AuthError::Storage(format!("TOTP secret unreadable: {e:?}")))?;
    totp_rs::Builder::new()
        .with_secret(secret)
        .with_account_name(user.replace(':', "_"))
        .with_issuer(Some(format!("Sallyport {}", cluster.replace(':', "_"))))
        .build()
        .map_err(|e| AuthError::Internal(format!("TOTP: {e:?}")))
}

/// Checks a code (±1 step of skew) and returns its step, which must be newer than `last_step`.
pub fn check_totp_code(
    secret: &str,
    user: &str,
    cluster: &str,
    code: &str,
    last_step: i64,
) -> Result<i64, AuthError> {
    let totp = new_totp(secret, user, cluster)?;
    let code = code.trim();
    if code.len() != 6 || !code.bytes().all(|b| b.is_ascii_digit()) {
        return Err(AuthError::Unauthenticated(
            "invalid one-time code: enter the 6 digits your authenticator shows".into(),
        ));
    }
    match totp.check_current(code) {
        None => Err(AuthError::Unauthenticated("invalid one-time code".into())),
        Some(step) if (step as i64) <= last_step => Err(AuthError::Unauthenticated(
            "this one-time code was already used; wait for the next code (30 s)".into(),
        )),
        Some(step) => Ok(step as i64),
    }
}

fn hhmm(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .map(|t| format!("{:02}:{:02} UTC", t.hour(), t.minute()))
        .unwrap_or_default()
}

/// What the login endpoint audits about a refused login.
struct Refusal<'a> {
    user: &'a str,
    user_exists: bool,
    remote: &'a str,
    /// Why, for the admin reading the audit log (never shown to the client).
    reason: &'a str,
    /// `local`, or `web` for a browser's web session.
    method: &'static str,
}

/// A reserved attempt not yet checked; see [`AuthServer::unchecked`].
struct Unchecked {
    pool: Option<sqlx::AnyPool>,
    user: String,
    max: i64,
}

impl Unchecked {
    /// The password check has started: the attempt counts.
    fn checked(mut self) {
        self.pool = None;
    }
}

impl Drop for Unchecked {
    fn drop(&mut self) {
        let Some(pool) = self.pool.take() else {
            return;
        };
        // Drop cannot wait: the give-back runs on its own (a dropped login is not awaited).
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (user, max) = (std::mem::take(&mut self.user), self.max);
        runtime.spawn(async move {
            let given_back = sqlx::query(
                "UPDATE login_attempts SET failures = failures - 1,
                    locked_until = CASE WHEN failures - 1 < $2 THEN 0 ELSE locked_until END
                 WHERE user_name = $1 AND failures > 0",
            )
            .bind(&user)
            .bind(max)
            .execute(&pool)
            .await;
            if let Err(e) = given_back {
                tracing::warn!(error = %e, "could not give back an unchecked login attempt");
            }
        });
    }
}

/// What reserving an attempt found.
enum Attempt {
    /// Go ahead; `Some(until)` when a failure of this attempt locks the account until then.
    Reserved(Option<i64>),
    /// The account is locked until then: no password check.
    Locked(i64),
}

impl AuthServer {
    /// When `user` is locked out, until when (Unix seconds).
    pub async fn locked_until(&self, user: &str) -> Result<Option<i64>, AuthError> {
        let row = sqlx::query("SELECT locked_until FROM login_attempts WHERE user_name = $1")
            .bind(user)
            .fetch_optional(&self.backend.pool)
            .await?;
        let until: Option<i64> = row.map(|r| r.try_get(0)).transpose()?;
        Ok(until.filter(|&u| u > sallyport_core::unix_now()))
    }

    /// Counts this attempt as a failure before anything is checked, in one statement, so that
    /// of any number of concurrent attempts at most `max_login_attempts` get a password check
    /// in a window; the attempt that takes the last one sets the lock. A login that succeeds
    /// clears the count ([`Self::clear_attempts`]). The window starts at the first failure, and
    /// an expired lock starts a new one.
    async fn reserve_attempt(&self, user: &str) -> Result<Attempt, AuthError> {
        let now = sallyport_core::unix_now();
        let window_start = now - self.config.lockout_window.as_secs() as i64;
        let lock = self.config.lockout_duration.as_secs() as i64;
        let max = i64::from(self.config.max_login_attempts.max(1));
        sqlx::query(
            "INSERT INTO login_attempts (user_name, failures, window_start, locked_until) VALUES ($1, 0, $2, 0) ON CONFLICT (user_name) DO NOTHING",
        )
        .bind(user)
        .bind(now)
        .execute(&self.backend.pool)
        .await?;
        // `(window_start <= $3 OR (locked_until <> 0 AND locked_until <= $2))`, repeated below:
        // the window passed or the lock expired, so this attempt starts a new count. Every SET
        // expression reads the row as it was; PostgreSQL re-checks the WHERE after waiting for
        // a concurrent update's row lock, so each attempt sees the count before it.
        let sql = "UPDATE login_attempts SET
                failures = CASE WHEN (window_start <= $3 OR (locked_until <> 0 AND locked_until <= $2)) THEN 1 ELSE failures + 1 END,
                window_start = CASE WHEN (window_start <= $3 OR (locked_until <> 0 AND locked_until <= $2)) THEN $2 ELSE window_start END,
                locked_until = CASE WHEN (window_start <= $3 OR (locked_until <> 0 AND locked_until <= $2)) THEN (CASE WHEN 1 >= $4 THEN $2 + $5 ELSE 0 END)
                                    WHEN failures + 1 >= $4 THEN $2 + $5 ELSE locked_until END
             WHERE user_name = $1 AND ((window_start <= $3 OR (locked_until <> 0 AND locked_until <= $2)) OR (failures < $4 AND locked_until <= $2))
             RETURNING locked_until";
        let reserved = sqlx::query(sql)
            .bind(user)
            .bind(now)
            .bind(window_start)
            .bind(max)
            .bind(lock)
            .fetch_optional(&self.backend.pool)
            .await?;
        if let Some(row) = reserved {
            let until: i64 = row.try_get(0)?;
            return Ok(Attempt::Reserved((until > now).then_some(until)));
        }
        // Refused only while a lock is in force; a row removed meanwhile means no lock.
        Ok(match self.locked_until(user).await? {
            Some(until) => Attempt::Locked(until),
            None => Attempt::Locked(now + lock),
        })
    }

    /// An attempt just reserved, given back unless [`Unchecked::checked`] is called: a login
    /// that never reached its password check (the server was too busy, or the client hung up
    /// while waiting in line) is not a failed guess.
    fn unchecked(&self, user: &str) -> Unchecked {
        Unchecked {
            pool: Some(self.backend.pool.clone()),
            user: user.into(),
            max: i64::from(self.config.max_login_attempts.max(1)),
        }
    }

    async fn clear_attempts(&self, user: &str) -> Result<(), AuthError> {
        sqlx::query("DELETE FROM login_attempts WHERE user_name = $1")
            .bind(user)
            .execute(&self.backend.pool)
            .await?;
        Ok(())
    }

    /// Forgets counts whose window and lock are both over (names anyone typed included).
    pub async fn forget_stale_login_attempts(&self) -> Result<(), AuthError> {
        let now = sallyport_core::unix_now();
        sqlx::query("DELETE FROM login_attempts WHERE locked_until <= $1 AND window_start <= $2")
            .bind(now)
            .bind(now - self.config.lockout_window.as_secs() as i64)
            .execute(&self.backend.pool)
            .await?;
        Ok(())
    }

    fn locked_message(&self, user: &str, until: i64) -> String {
        format!(
            "account {user} is locked after {} failed logins; try again after {} ({}), or ask an admin",
            self.config.max_login_attempts,
            hhmm(until),
            sallyport_core::duration::format(Duration::from_secs(
                (until - sallyport_core::unix_now()).max(0) as u64
            )),
        )
    }

    fn bad_credentials(&self) -> AuthError {
        AuthError::Unauthenticated(
            if self.config.second_factor {
                BAD_CREDENTIALS_OTP
            } else {
                BAD_CREDENTIALS
            }
            .into(),
        )
    }

    /// Audits a refused login (aggregated: see [`crate::failures`]) and returns `err`.
    async fn refuse(&self, r: Refusal<'_>, err: AuthError) -> AuthError {
        self.auth_failed(Failure {
            event: EventType::UserLogin,
            door: "api".into(),
            remote_addr: r.remote.into(),
            reason: r.reason.into(),
            user: Some(r.user.into()),
            user_exists: r.user_exists,
            event_fields: vec![
                ("method".into(), r.method.into()),
                ("error".into(), err.to_string().into()),
            ],
        })
        .await;
        err
    }

    /// Password (+ TOTP) login; issues certificates bound to the caller's public key.
    ///
    /// Every wrong credential gets the same answer after the same work: unknown users are
    /// checked against a dummy hash, and a wrong code reads like a wrong password.
    pub async fn login(&self, req: &LoginRequest, remote: &str) -> Result<Certs, AuthError> {
        let user = req.user.as_str();
        if sallyport_core::names::validate("user", user).is_err() {
            return Err(self.bad_credentials());
        }
        let code = req.otp_code.as_deref().unwrap_or("").trim();
        // The shape of a code says nothing about the account: checked before anything else.
        if self.config.second_factor
            && (code.len() != 6 || !code.bytes().all(|b| b.is_ascii_digit()))
        {
            return Err(AuthError::BadRequest(
                "invalid one-time code: enter the 6 digits your authenticator shows".into(),
            ));
        }
        let record = self.get_user(user).await?;
        let method = if req.web { "web" } else { "local" };
        let refusal = |reason| Refusal {
            user,
            user_exists: record.is_some(),
            remote,
            reason,
            method,
        };
        let lock_on_failure = match self.reserve_attempt(user).await? {
            Attempt::Reserved(until) => until,
            Attempt::Locked(until) => {
                let err = AuthError::Locked(self.locked_message(user, until));
                return Err(self.refuse(refusal("account locked"), err).await);
            }
        };
        // A wrong credential: the same answer, plus the lock when this failure made it.
        let wrong = |reason| {
            let err = match lock_on_failure {
                Some(until) => AuthError::Locked(format!(
                    "{}; {}",
                    self.bad_credentials(),
                    self.locked_message(user, until)
                )),
                None => self.bad_credentials(),
            };
            self.refuse(refusal(reason), err)
        };
        let unchecked = self.unchecked(user);
        let hash = record.as_ref().and_then(|r| r.password_hash.clone());
        // Busy: `unchecked` gives the attempt back as it goes.
        let slot = self.password_checks.slot().await?;
        unchecked.checked();
        let ok = slot
            .verify(
                req.password.clone(),
                hash.clone().unwrap_or_else(|| self.dummy_hash.clone()),
            )
            .await;
        let record = match (record.clone(), hash, ok) {
            (Some(r), Some(_), true) => r,
            (None, _, _) => return Err(wrong("unknown user").await),
            (Some(_), None, _) => return Err(wrong("no password set (sign-up not finished)").await),
            (Some(_), Some(_), false) => return Err(wrong("wrong password").await),
        };
        if self.config.second_factor {
            let Some(secret) = record.totp_secret.as_deref() else {
                return Err(
                    wrong("no authenticator enrolled; an admin must reset the account").await,
                );
            };
            let step = match check_totp_code(
                secret,
                user,
                &self.config.cluster_name,
                code,
                record.totp_last_step,
            ) {
                Ok(s) => s,
                Err(AuthError::Unauthenticated(m)) if m.contains("already used") => {
                    return Err(wrong("one-time code already used").await);
                }
                Err(AuthError::Unauthenticated(_)) => {
                    return Err(wrong("wrong one-time code").await);
                }
                Err(e) => return Err(e),
            };
            // Atomic: of two logins racing with one code, only one advances the step.
            let claimed = sqlx::query(
                "UPDATE users SET totp_last_step = $1 WHERE name = $2 AND totp_last_step < $1",
            )
            .bind(step)
            .bind(user)
            .execute(&self.backend.pool)
            .await?;
            if claimed.rows_affected() != 1 {
                return Err(wrong("one-time code already used").await);
            }
        }
        // The credentials were right: whatever follows is not a failed guess.
        self.clear_attempts(user).await?;
        if let Err(e) = self.check_lock(user).await {
            return Err(self.refuse(refusal("user locked by an admin"), e).await);
        }
        let certs = self.issue_user_certs(&record, req).await?;
        self.emit(
            Event::new(EventType::UserLogin, Some(user))
                .with("success", true)
                .with("method", method)
                .with("remote_addr", remote)
                .with("roles", certs.roles.clone())
                .with("valid_until", certs.valid_until.clone()),
        )
        .await?;
        Ok(certs)
    }

    pub(crate) async fn issue_user_certs(
        &self,
        user: &crate::users::UserRecord,
        req: &LoginRequest,
    ) -> Result<Certs, AuthError> {
        let key = PublicKey::from_openssh(req.ssh_public_key.trim()).map_err(|e| {
            AuthError::BadRequest(format!("the public key is not an OpenSSH public key: {e}"))
        })?;
        let raw = sshcert::ed25519_bytes(&key)
            .map_err(|_| AuthError::BadRequest("the public key must be Ed25519".into()))?;
        let set = self.role_set(&user.roles, &user.traits).await?;
        let requested = req.ttl_secs.map_or(
            sallyport_core::role::DEFAULT_SESSION_TTL,
            Duration::from_secs,
        );
        let ttl = requested.min(set.max_session_ttl());
        if ttl < Duration::from_secs(60) {
            return Err(AuthError::BadRequest(
                "the certificate TTL must be at least 1m".into(),
            ));
        }
        let now = sallyport_core::unix_now();
        let (after, before) = (now - 60, now + ttl.as_secs() as i64);
        let logins = set.logins();
        let permits = Permits {
            pty: true,
            port_forwarding: set.port_forwarding(),
            agent_forwarding: set.forward_agent(),
            x11_forwarding: set.permit_x11_forwarding(),
        };
        let ssh_cert = sshcert::issue_user(
            &self.authorities.user_signer().key,
            &UserCertRequest {
                public_key: &key,
                user: &user.name,
                roles: &user.roles,
                logins: &logins,
                valid_after: after as u64,
                valid_before: before as u64,
                permits,
            },
        )
        .map_err(|e| AuthError::Internal(e.to_string()))?;
        let at = |t: i64| {
            time::OffsetDateTime::from_unix_timestamp(t)
                .map_err(|e| AuthError::Internal(e.to_string()))
        };
        let tls_cert_pem = self
            .authorities
            .tls_user_signer()
            .sign(
                &ed25519_spki(&raw),
                &Subject {
                    common_name: user.name.clone(),
                    organizations: user.roles.clone(),
                    dns_names: vec![],
                    server: false,
                    not_before: at(after)?,
                    not_after: at(before)?,
                },
            )
            .map_err(|e| AuthError::Internal(e.to_string()))?;
        Ok(Certs {
            user: user.name.clone(),
            roles: user.roles.clone(),
            logins,
            cluster_name: self.config.cluster_name.clone(),
            ssh_cert: ssh_cert
                .to_openssh()
                .map_err(|e| AuthError::Internal(e.to_string()))?,
            tls_cert_pem,
            tls_host_ca_pem: self
                .authorities
                .tls_pem(sallyport_core::ca::CaKind::TlsHost),
            known_hosts: self.authorities.known_hosts(&self.config.cluster_name)?,
            valid_until: rfc3339(before),
        })
    }

    /// A certificate for a service of this cluster (`proxy`, `auth`, `node`, or `@admin`'s client
    /// identity), over a key the service generated itself.
    pub fn issue_service_cert(
        &self,
        spki_der: &[u8],
        common_name: &str,
        system_role: &str,
        dns_names: Vec<String>,
        ttl: Duration,
        user_ca: bool,
    ) -> Result<String, AuthError> {
        let now = time::OffsetDateTime::now_utc();
        let subject = Subject {
            common_name: common_name.into(),
            organizations: vec![system_role.into()],
            dns_names,
            server: !user_ca,
            not_before: now - time::Duration::minutes(1),
            not_after: now + ttl,
        };
        let ca = if user_ca {
            self.authorities.tls_user_signer()
        } else {
            self.authorities.tls_host_signer()
        };
        ca.sign(spki_der, &subject)
            .map_err(|e| AuthError::Internal(e.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn checks_in_kept_memory_agree_with_argon2() {
        let hash = hash_password("correct horse".into())
            .await
            .unwrap_or_default();
        let mut memory = vec![];
        for (password, phc, ok) in [
            ("correct horse", hash.as_str(), true),
            ("correct horsf", hash.as_str(), false),
            ("", hash.as_str(), false),
            (
                "correct horse",
                "$argon2id$v=19$m=19456,t=2,p=1$bm90IGEgaGFzaA",
                false,
            ),
            ("correct horse", "not a hash", false),
        ] {
            assert_eq!(
                verify_in(password.as_bytes(), phc, &mut memory),
                ok,
                "{password} {phc}"
            );
        }
        // The memory is kept for the next check, not allocated again.
        assert_eq!(memory.len(), Params::default().block_count());
    }

    /// A login whose client hangs up during its check (its future dropped) leaves the check
    /// running in its slot and memory: the slot is free, and the memory back, only when the
    /// check has ended. Otherwise every hang-up would start one more 19 MiB check.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_check_keeps_its_slot_when_its_login_is_dropped() {
        let hash = hash_password("correct horse".into())
            .await
            .unwrap_or_default();
        let checks = PasswordChecks::with_slots(1);
        let slot = checks.slot().await.unwrap();
        let check = slot.verify("wrong horse".into(), hash);
        // Started, then dropped, as a login is when its client hangs up.
        assert!(
            tokio::time::timeout(Duration::from_micros(1), check)
                .await
                .is_err()
        );
        assert_eq!(
            checks.slots.available_permits(),
            0,
            "the slot left with the login"
        );
        let busy = tokio::time::timeout(Duration::from_millis(1), checks.slot()).await;
        assert!(busy.is_err(), "a second check started beside the first");
        // The check ends on its own; then the slot and its memory are back.
        let next = tokio::time::timeout(Duration::from_secs(10), checks.slot()).await;
        let next = next.unwrap().unwrap();
        assert_eq!(
            next.memory.as_ref().map(Vec::len),
            Some(Params::default().block_count()),
            "the slot's memory was not kept"
        );
    }

    /// Logins cancelled while waiting in line leave it: the line is not left full for good
    /// (which answered every later login that found the slots busy with "too many logins").
    #[tokio::test]
    async fn logins_cancelled_in_line_leave_it() {
        let checks = PasswordChecks::with_slots(1);
        let held = checks.slot().await.unwrap();
        for _ in 0..3 * WAITING_PER_SLOT {
            let waited = tokio::time::timeout(Duration::from_millis(1), checks.slot()).await;
            assert!(waited.is_err(), "a slot was free");
        }
        assert_eq!(checks.waiting.load(std::sync::atomic::Ordering::Acquire), 0);
        // A login that finds the slot busy waits for it, rather than being told to come back.
        let release = async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            drop(held);
        };
        let (next, ()) = tokio::join!(checks.slot(), release);
        assert!(next.is_ok(), "a login found the line full");
    }
}
