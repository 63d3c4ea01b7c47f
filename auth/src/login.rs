//! Local login: argon2id passwords, TOTP with replay protection, server-side lockout, and the
//! certificates a successful login earns. Nothing here ever logs or audits a password or code.

use std::time::Duration;

use argon2::Argon2;
use argon2::password_hash::{PasswordHasher, PasswordVerifier};
use russh::keys::ssh_key::PublicKey;
use sallyport_core::api::{Certs, LoginRequest};
use sallyport_core::audit::Event;
use sallyport_core::sshcert::{self, Permits, UserCertRequest};
use sallyport_core::x509::{Subject, ed25519_spki};
use sqlx::Row;

use crate::users::rfc3339;
use crate::{AuthError, AuthServer};

const BAD_CREDENTIALS: &str = "invalid user name or password";

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

/// Verifies in constant time (argon2 compares the outputs in constant time).
pub async fn verify_password(password: String, hash: String) -> bool {
    tokio::task::spawn_blocking(move || {
        argon2::password_hash::phc::PasswordHash::new(&hash)
            .map(|h| {
                Argon2::default()
                    .verify_password(password.as_bytes(), &h)
                    .is_ok()
            })
            .unwrap_or(false)
    })
    .await
    .unwrap_or(false)
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

impl AuthServer {
    /// When `user` is locked out, until when (Unix seconds).
    pub async fn locked_until(&self, user: &str) -> Result<Option<i64>, AuthError> {
        let now = sallyport_core::unix_now();
        let window = self.config.lockout_window.as_secs() as i64;
        let lock = self.config.lockout_duration.as_secs() as i64;
        let max = i64::from(self.config.max_login_attempts.max(1));
        // Failures newer than window + lock can still hold a lock in place.
        let rows = sqlx::query(
            "SELECT at FROM login_failures WHERE user_name = $1 AND at > $2 ORDER BY at",
        )
        .bind(user)
        .bind(now - window - lock)
        .fetch_all(&self.backend.pool)
        .await?;
        let times: Vec<i64> = rows
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()?;
        // A lock starts at the failure that made `max` within one window.
        let mut until = None;
        for i in (max as usize - 1)..times.len() {
            if times[i] - times[i + 1 - max as usize] <= window {
                until = Some(times[i] + lock);
            }
        }
        Ok(until.filter(|&u| u > now))
    }

    async fn record_failure(&self, user: &str) -> Result<(), AuthError> {
        sqlx::query("INSERT INTO login_failures (user_name, at) VALUES ($1, $2)")
            .bind(user)
            .bind(sallyport_core::unix_now())
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

    /// Refuses the login: counts the failure, audits it, and says whether it locked the account.
    async fn fail_login(&self, user: &str, remote: &str, err: AuthError) -> AuthError {
        let counted = self.record_failure(user).await;
        let mut err = err;
        if counted.is_ok()
            && let Ok(Some(until)) = self.locked_until(user).await
        {
            err = AuthError::Locked(format!("{err}; {}", self.locked_message(user, until)));
        }
        self.emit_logged(
            Event::new("user.login", Some(user))
                .with("success", false)
                .with("method", "local")
                .with("error", err.to_string())
                .with("remote_addr", remote),
        )
        .await;
        err
    }

    /// Password (+ TOTP) login; issues certificates bound to the caller's public key.
    pub async fn login(&self, req: &LoginRequest, remote: &str) -> Result<Certs, AuthError> {
        let user = req.user.as_str();
        if sallyport_core::names::validate("user", user).is_err() {
            return Err(AuthError::Unauthenticated(BAD_CREDENTIALS.into()));
        }
        if let Some(until) = self.locked_until(user).await? {
            let err = AuthError::Locked(self.locked_message(user, until));
            self.emit_logged(
                Event::new("user.login", Some(user))
                    .with("success", false)
                    .with("method", "local")
                    .with("error", err.to_string())
                    .with("remote_addr", remote),
            )
            .await;
            return Err(err);
        }
        let record = self.get_user(user).await?;
        let hash = record.as_ref().and_then(|r| r.password_hash.clone());
        let ok = verify_password(
            req.password.clone(),
            hash.clone().unwrap_or_else(|| self.dummy_hash.clone()),
        )
        .await;
        let record = match (record, hash, ok) {
            (Some(r), Some(_), true) => r,
            _ => {
                return Err(self
                    .fail_login(
                        user,
                        remote,
                        AuthError::Unauthenticated(BAD_CREDENTIALS.into()),
                    )
                    .await);
            }
        };
        if self.config.second_factor {
            let Some(secret) = record.totp_secret.as_deref() else {
                return Err(self
                    .fail_login(
                        user,
                        remote,
                        AuthError::Unauthenticated(
                            "no authenticator is enrolled; ask an admin to reset your account"
                                .into(),
                        ),
                    )
                    .await);
            };
            let code = req.otp_code.as_deref().unwrap_or("");
            let step = match check_totp_code(
                secret,
                user,
                &self.config.cluster_name,
                code,
                record.totp_last_step,
            ) {
                Ok(s) => s,
                Err(e) => return Err(self.fail_login(user, remote, e).await),
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
                let e = AuthError::Unauthenticated(
                    "this one-time code was already used; wait for the next code (30 s)".into(),
                );
                return Err(self.fail_login(user, remote, e).await);
            }
        }
        if let Err(e) = self.check_lock(user).await {
            self.emit_logged(
                Event::new("user.login", Some(user))
                    .with("success", false)
                    .with("method", "local")
                    .with("error", e.to_string())
                    .with("remote_addr", remote),
            )
            .await;
            return Err(e);
        }
        sqlx::query("DELETE FROM login_failures WHERE user_name = $1")
            .bind(user)
            .execute(&self.backend.pool)
            .await?;
        let certs = self.issue_user_certs(&record, req).await?;
        self.emit(
            Event::new("user.login", Some(user))
                .with("success", true)
                .with("method", "local")
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
