//! Users and their sign-up tokens. A token is stored only as its SHA-256, expires after an hour
//! and is spent by the sign-up that uses it.

use std::time::Duration;

use sallyport_core::api::{
    AddUser, SignupFinish, SignupStart, SignupStarted, SignupToken, TokenInfo, TokenKind,
    UpdateUser, UserInfo,
};
use sallyport_core::audit::{Event, EventType};
use sallyport_core::identity::{Traits, internal_traits};
use sqlx::Row;
use sqlx::any::AnyRow;

use crate::login::{check_totp_code, hash_password, new_totp};
use crate::{AuthError, AuthServer};

pub const SIGNUP_TOKEN_TTL: Duration = Duration::from_secs(3600);
pub const MIN_PASSWORD_LEN: usize = 8;

/// A user as stored.
#[derive(Clone)]
pub struct UserRecord {
    pub name: String,
    pub user_type: String,
    pub roles: Vec<String>,
    pub traits: Traits,
    pub password_hash: Option<String>,
    pub totp_secret: Option<String>,
    pub totp_last_step: i64,
    pub created: i64,
}

impl UserRecord {
    fn from_row(r: &AnyRow) -> Result<Self, AuthError> {
        let name: String = r.try_get("name")?;
        let bad =
            |e: serde_json::Error| AuthError::Storage(format!("user {name} is unreadable: {e}"));
        Ok(UserRecord {
            user_type: r.try_get("user_type")?,
            roles: serde_json::from_str(&r.try_get::<String, _>("roles")?).map_err(bad)?,
            traits: serde_json::from_str(&r.try_get::<String, _>("traits")?).map_err(bad)?,
            password_hash: r.try_get("password_hash")?,
            totp_secret: r.try_get("totp_secret")?,
            totp_last_step: r.try_get("totp_last_step")?,
            created: r.try_get("created")?,
            name,
        })
    }

    pub fn logins(&self) -> Vec<String> {
        self.traits
            .get("internal.logins")
            .cloned()
            .unwrap_or_default()
    }
}

pub use sallyport_core::rfc3339;

/// Who a single sign-on user is to their provider: the connector they came through, the
/// issuer that signed their ID token and its `sub` for them, which the provider never
/// reassigns (OpenID Connect Core 5.7). Names and emails can change; this does not.
#[derive(Debug, Clone, Copy)]
pub struct SsoIdentity<'a> {
    pub connector: &'a str,
    pub issuer: &'a str,
    pub subject: &'a str,
}

/// An SSO user after [`AuthServer::upsert_sso_user`]; `adopted` when a user from before
/// identities were stored was linked to this identity now.
pub struct SsoUser {
    pub record: UserRecord,
    pub adopted: bool,
}

/// How a one-time secret (sign-up and join tokens, SSO state and responses) is stored: the
/// hex SHA-256, so the database never holds one that works.
pub(crate) fn token_hash(token: &str) -> String {
    hex::encode(sallyport_core::sha256(token.as_bytes()))
}

impl AuthServer {
    pub async fn get_user(&self, name: &str) -> Result<Option<UserRecord>, AuthError> {
        let row = sqlx::query("SELECT name, user_type, roles, traits, password_hash, totp_secret, totp_last_step, created FROM users WHERE name = $1")
            .bind(name)
            .fetch_optional(&self.backend.pool)
            .await?;
        row.as_ref().map(UserRecord::from_row).transpose()
    }

    pub async fn has_local_users(&self) -> Result<bool, AuthError> {
        Ok(
            sqlx::query("SELECT name FROM users WHERE user_type = 'local' LIMIT 1")
                .fetch_optional(&self.backend.pool)
                .await?
                .is_some(),
        )
    }

    /// Creates or refreshes a user who signed in through SSO: type `sso`, roles and traits from
    /// the provider's claims at this login. The user is keyed on `identity`: a name already
    /// held by a local user or by another identity is refused, never taken over, and an
    /// identity already linked to another name is refused too (the provider renamed the person:
    /// an admin decides, by removing the old user, since locks, sessions and recordings are
    /// kept under the old name). An SSO user from before identities were stored is linked to
    /// the first identity that signs in as it through the connector it last signed in with
    /// (read from its last successful `user.login` in the audit log); one with no such record
    /// is linked to the first identity on any connector.
    pub async fn upsert_sso_user(
        &self,
        name: &str,
        identity: &SsoIdentity<'_>,
        roles: &[String],
        traits: &sallyport_core::identity::Traits,
    ) -> Result<SsoUser, AuthError> {
        let SsoIdentity {
            connector,
            issuer,
            subject,
        } = *identity;
        let linked = sqlx::query(
            "SELECT name FROM users WHERE sso_connector = $1 AND sso_issuer = $2 AND sso_subject = $3",
        )
        .bind(connector)
        .bind(issuer)
        .bind(subject)
        .fetch_optional(&self.backend.pool)
        .await?
        .map(|r| r.try_get::<String, _>("name"))
        .transpose()?;
        if let Some(linked) = linked
            && linked != name
        {
            return Err(AuthError::Conflict(format!(
                "your identity at connector {connector} belongs to user {linked}, but the provider now names you {name}; ask an admin to remove user {linked} (`sallyctl users rm {linked}`) if {name} should replace it"
            )));
        }
        let taken = |u: Option<UserRecord>| match u {
            Some(u) if u.user_type != "sso" => AuthError::Conflict(format!(
                "a local user named {name} exists; single sign-on cannot log in as a local user"
            )),
            _ => AuthError::Conflict(format!(
                "user {name} is already linked to another identity; ask an admin"
            )),
        };
        if let Some(u) = self.get_user(name).await?
            && u.user_type != "sso"
        {
            return Err(taken(Some(u)));
        }
        self.roles_named(roles)
            .await
            .map_err(|e| AuthError::BadRequest(format!("the roles your claims map to: {e}")))?;
        let (roles, traits) = (
            serde_json::to_string(roles)?,
            serde_json::to_string(traits)?,
        );
        // Each statement below changes only a row of this identity (or an unlinked SSO row),
        // so concurrent logins cannot interleave into a takeover.
        let inserted = sqlx::query(
            "INSERT INTO users (name, user_type, roles, traits, created, sso_connector, sso_issuer, sso_subject)
             VALUES ($1, 'sso', $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(&roles)
        .bind(&traits)
        .bind(sallyport_core::unix_now())
        .bind(connector)
        .bind(issuer)
        .bind(subject)
        .execute(&self.backend.pool)
        .await?
        .rows_affected()
            == 1;
        if !inserted {
            self.check_legacy_connector(name, connector).await?;
        }
        let adopted = !inserted
            && sqlx::query(
                "UPDATE users SET sso_connector = $1, sso_issuer = $2, sso_subject = $3
                 WHERE name = $4 AND user_type = 'sso' AND sso_subject IS NULL",
            )
            .bind(connector)
            .bind(issuer)
            .bind(subject)
            .bind(name)
            .execute(&self.backend.pool)
            .await?
            .rows_affected()
                == 1;
        let refreshed = sqlx::query(
            "UPDATE users SET roles = $1, traits = $2
             WHERE name = $3 AND user_type = 'sso' AND sso_connector = $4 AND sso_issuer = $5 AND sso_subject = $6",
        )
        .bind(&roles)
        .bind(&traits)
        .bind(name)
        .bind(connector)
        .bind(issuer)
        .bind(subject)
        .execute(&self.backend.pool)
        .await?;
        if refreshed.rows_affected() != 1 {
            return Err(taken(self.get_user(name).await?));
        }
        let record = self
            .get_user(name)
            .await?
            .ok_or_else(|| AuthError::Internal(format!("user {name} vanished")))?;
        Ok(SsoUser { record, adopted })
    }

    /// For an SSO user from before identities were stored (migration 0006): refuses linking it
    /// through another connector than the one it last signed in with, so that after the upgrade
    /// a second connector presenting the same name does not take over the user's history. The
    /// users table never recorded the connector; every successful SSO login's audit event did.
    async fn check_legacy_connector(&self, name: &str, connector: &str) -> Result<(), AuthError> {
        let legacy = sqlx::query(
            "SELECT name FROM users WHERE name = $1 AND user_type = 'sso' AND sso_subject IS NULL",
        )
        .bind(name)
        .fetch_optional(&self.backend.pool)
        .await?
        .is_some();
        if !legacy {
            return Ok(());
        }
        // The newest successful OIDC login names the connector. Read newest first in bounded
        // pages (keyset on seq) and stop at the first match: a user with years of logins must
        // not make every sign-in load its whole login history.
        const PAGE: i64 = 100;
        let mut before = i64::MAX;
        let last = loop {
            let rows = sqlx::query(
                "SELECT seq, record FROM audit_events WHERE event_type = $4 AND user_name = $1 AND seq < $2 ORDER BY seq DESC LIMIT $3",
            )
            .bind(name)
            .bind(before)
            .bind(PAGE)
            .bind(EventType::UserLogin.name())
            .fetch_all(&self.backend.pool)
            .await?;
            let found = rows.iter().find_map(|r| {
                let text: String = r.try_get("record").ok()?;
                let e: serde_json::Value = serde_json::from_str(&text).ok()?;
                (e["success"] == true && e["method"] == "oidc")
                    .then(|| e["connector"].as_str().map(str::to_string))
                    .flatten()
            });
            let next = rows.last().and_then(|r| r.try_get::<i64, _>("seq").ok());
            match (found, next) {
                (Some(c), _) => break Some(c),
                (None, Some(seq)) if rows.len() as i64 == PAGE => before = seq,
                _ => break None,
            }
        };
        match last {
            Some(last) if last != connector => Err(AuthError::Conflict(format!(
                "user {name} signs in through connector {last}, not {connector}; ask an admin to remove user {name} (`sallyctl users rm {name}`) if connector {connector} should have it"
            ))),
            _ => Ok(()),
        }
    }

    /// Creates a local user and returns its first sign-up token.
    pub async fn add_user(&self, req: &AddUser, by: &str) -> Result<SignupToken, AuthError> {
        sallyport_core::names::validate("user", &req.name)
            .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        for l in &req.logins {
            sallyport_core::names::validate("login", l)
                .map_err(|e| AuthError::BadRequest(e.to_string()))?;
        }
        if req.roles.is_empty() {
            return Err(AuthError::BadRequest(
                "a user needs at least one role (--roles)".into(),
            ));
        }
        self.roles_named(&req.roles).await?;
        let traits = internal_traits(&req.logins, &[], &[]);
        let inserted = sqlx::query(
            "INSERT INTO users (name, user_type, roles, traits, created) VALUES ($1, 'local', $2, $3, $4)
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(&req.name)
        .bind(serde_json::to_string(&req.roles)?)
        .bind(serde_json::to_string(&traits)?)
        .bind(sallyport_core::unix_now())
        .execute(&self.backend.pool)
        .await?;
        if inserted.rows_affected() == 0 {
            return Err(AuthError::Conflict(format!(
                "user {} already exists",
                req.name
            )));
        }
        self.emit(
            Event::new(EventType::UserCreate, Some(by))
                .with("name", req.name.clone())
                .with("roles", req.roles.clone())
                .with("logins", req.logins.clone()),
        )
        .await?;
        self.new_signup_token(&req.name).await
    }

    /// Replaces any earlier token of `user` with a new one.
    pub async fn new_signup_token(&self, user: &str) -> Result<SignupToken, AuthError> {
        let token = sallyport_core::random_hex(32);
        let expires = sallyport_core::unix_now() + SIGNUP_TOKEN_TTL.as_secs() as i64;
        let mut tx = self.backend.pool.begin().await?;
        sqlx::query("DELETE FROM signup_tokens WHERE user_name = $1")
            .bind(user)
            .execute(&mut *tx)
            .await?;
        sqlx::query(
            "INSERT INTO signup_tokens (token_hash, user_name, expires) VALUES ($1, $2, $3)",
        )
        .bind(token_hash(&token))
        .bind(user)
        .bind(expires)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(SignupToken {
            user: user.into(),
            token,
            expires: rfc3339(expires),
        })
    }

    /// `sallyctl users reset`: clears the password and second factor and issues a new token.
    pub async fn reset_user(&self, name: &str, by: &str) -> Result<SignupToken, AuthError> {
        let r = sqlx::query("UPDATE users SET password_hash = NULL, totp_secret = NULL, totp_last_step = 0 WHERE name = $1 AND user_type = 'local'")
            .bind(name)
            .execute(&self.backend.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!("no local user {name}")));
        }
        self.emit(Event::new(EventType::UserReset, Some(by)).with("name", name))
            .await?;
        self.new_signup_token(name).await
    }

    pub async fn remove_user(&self, name: &str, by: &str) -> Result<(), AuthError> {
        let mut tx = self.backend.pool.begin().await?;
        let r = sqlx::query("DELETE FROM users WHERE name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!("user {name} does not exist")));
        }
        sqlx::query("DELETE FROM signup_tokens WHERE user_name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM login_attempts WHERE user_name = $1")
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.emit(Event::new(EventType::UserDelete, Some(by)).with("name", name))
            .await
    }

    pub async fn list_users(&self) -> Result<Vec<UserInfo>, AuthError> {
        let rows = sqlx::query("SELECT name, user_type, roles, traits, password_hash, totp_secret, totp_last_step, created FROM users ORDER BY name")
            .fetch_all(&self.backend.pool)
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in &rows {
            let u = UserRecord::from_row(r)?;
            let locked = self.locked_until(&u.name).await?;
            out.push(UserInfo {
                status: if u.password_hash.is_some() || u.user_type == "sso" {
                    "active"
                } else {
                    "pending"
                }
                .into(),
                created: rfc3339(u.created),
                locked_until: locked.map(rfc3339),
                name: u.name,
                user_type: u.user_type,
                roles: u.roles,
                traits: u.traits,
            });
        }
        Ok(out)
    }

    pub async fn user_count(&self) -> Result<u64, AuthError> {
        let n: i64 = sqlx::query("SELECT COUNT(*) FROM users")
            .fetch_one(&self.backend.pool)
            .await?
            .try_get(0)?;
        Ok(n.max(0) as u64)
    }

    /// Looks up a live token: not expired, not spent.
    async fn signup_token(
        &self,
        token: &str,
    ) -> Result<(String, String, Option<String>), AuthError> {
        let h = token_hash(token);
        let row = sqlx::query("SELECT user_name, expires, used, totp_secret FROM signup_tokens WHERE token_hash = $1")
            .bind(&h)
            .fetch_optional(&self.backend.pool)
            .await?
            .ok_or_else(|| {
                AuthError::Unauthenticated(
                    "sign-up token not found: it was mistyped, replaced by a newer one, or the user was removed; ask an admin for a new one (`sallyctl users reset NAME`)".into(),
                )
            })?;
        let user: String = row.try_get(0)?;
        let expires: i64 = row.try_get(1)?;
        let used: i64 = row.try_get(2)?;
        if used != 0 {
            return Err(AuthError::Unauthenticated(format!(
                "this sign-up token was already used; ask an admin for a new one (`sallyctl users reset {user}`)"
            )));
        }
        if expires <= sallyport_core::unix_now() {
            return Err(AuthError::Unauthenticated(format!(
                "this sign-up token expired at {}; ask an admin for a new one (`sallyctl users reset {user}`)",
                rfc3339(expires)
            )));
        }
        Ok((h, user, row.try_get(3)?))
    }

    /// First step of sign-up: returns the TOTP enrollment URI (when the cluster needs one).
    pub async fn signup_start(&self, req: &SignupStart) -> Result<SignupStarted, AuthError> {
        let (hash, user, existing) = self.signup_token(&req.token).await?;
        if !self.config.second_factor {
            return Ok(SignupStarted {
                user,
                otpauth_uri: None,
            });
        }
        let secret = match existing {
            Some(s) => s,
            None => {
                let secret = totp_rs::Secret::generate().to_base32();
                sqlx::query("UPDATE signup_tokens SET totp_secret = $1 WHERE token_hash = $2")
                    .bind(&secret)
                    .bind(&hash)
                    .execute(&self.backend.pool)
                    .await?;
                secret
            }
        };
        let totp = new_totp(&secret, &user, &self.config.cluster_name)?;
        let uri = totp
            .to_url()
            .map_err(|e| AuthError::Internal(format!("otpauth URI: {e}")))?;
        Ok(SignupStarted {
            user,
            otpauth_uri: Some(uri),
        })
    }

    /// Second step: sets the password and enrolls the authenticator; spends the token.
    pub async fn signup_finish(&self, req: &SignupFinish, remote: &str) -> Result<(), AuthError> {
        let (hash, user, secret) = self.signup_token(&req.token).await?;
        if req.password.chars().count() < MIN_PASSWORD_LEN {
            return Err(AuthError::BadRequest(format!(
                "the password must be at least {MIN_PASSWORD_LEN} characters"
            )));
        }
        let mut step = 0i64;
        if self.config.second_factor {
            let secret = secret.as_deref().ok_or_else(|| {
                AuthError::BadRequest(
                    "start the sign-up first: the authenticator was not enrolled".into(),
                )
            })?;
            let code = req.otp_code.as_deref().unwrap_or("");
            step = check_totp_code(secret, &user, &self.config.cluster_name, code, 0)?;
        }
        let password_hash = hash_password(req.password.clone()).await?;
        let mut tx = self.backend.pool.begin().await?;
        let spent =
            sqlx::query("UPDATE signup_tokens SET used = 1 WHERE token_hash = $1 AND used = 0")
                .bind(&hash)
                .execute(&mut *tx)
                .await?;
        if spent.rows_affected() != 1 {
            return Err(AuthError::Unauthenticated(
                "this sign-up token was already used".into(),
            ));
        }
        sqlx::query("UPDATE users SET password_hash = $1, totp_secret = $2, totp_last_step = $3 WHERE name = $4")
            .bind(password_hash)
            .bind(if self.config.second_factor { secret } else { None })
            .bind(step)
            .bind(&user)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        self.emit(Event::new(EventType::UserSignup, Some(&user)).with("remote_addr", remote))
            .await
    }

    pub async fn user_info(&self, name: &str) -> Result<UserInfo, AuthError> {
        self.list_users()
            .await?
            .into_iter()
            .find(|u| u.name == name)
            .ok_or_else(|| AuthError::NotFound(format!("user {name} does not exist")))
    }

    /// `sallyctl users update`: replaces roles and/or logins; the user's next login (and every
    /// admin request at once) sees them.
    pub async fn update_user(
        &self,
        name: &str,
        req: &UpdateUser,
        by: &str,
    ) -> Result<UserInfo, AuthError> {
        let mut user = self
            .get_user(name)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("user {name} does not exist")))?;
        if let Some(roles) = &req.roles {
            if roles.is_empty() {
                return Err(AuthError::BadRequest(
                    "a user needs at least one role".into(),
                ));
            }
            self.roles_named(roles).await?;
            user.roles = roles.clone();
        }
        if let Some(logins) = &req.logins {
            for l in logins {
                sallyport_core::names::validate("login", l)
                    .map_err(|e| AuthError::BadRequest(e.to_string()))?;
            }
            user.traits.insert("internal.logins".into(), logins.clone());
        }
        sqlx::query("UPDATE users SET roles = $1, traits = $2 WHERE name = $3")
            .bind(serde_json::to_string(&user.roles)?)
            .bind(serde_json::to_string(&user.traits)?)
            .bind(name)
            .execute(&self.backend.pool)
            .await?;
        self.emit(
            Event::new(EventType::UserUpdate, Some(by))
                .with("name", name)
                .with("roles", user.roles.clone())
                .with("logins", user.logins()),
        )
        .await?;
        self.user_info(name).await
    }

    /// Pending sign-up tokens (their secrets are never stored, so never shown).
    /// Pending sign-up tokens, then pending join tokens, each soonest to expire first; never
    /// a secret (only hashes are kept).
    pub async fn list_tokens(&self) -> Result<Vec<TokenInfo>, AuthError> {
        let now = sallyport_core::unix_now();
        let rows = sqlx::query("SELECT user_name, expires FROM signup_tokens WHERE used = 0 AND expires > $1 ORDER BY expires")
            .bind(now)
            .fetch_all(&self.backend.pool)
            .await?;
        let mut out = rows
            .iter()
            .map(|r| {
                Ok(TokenInfo {
                    kind: TokenKind::Signup,
                    user: Some(r.try_get::<String, _>(0)?),
                    expires: rfc3339(r.try_get::<i64, _>(1)?),
                })
            })
            .collect::<Result<Vec<_>, AuthError>>()?;
        let joins = sqlx::query(
            "SELECT kind, expires FROM join_tokens WHERE used = 0 AND expires > $1 ORDER BY expires",
        )
        .bind(now)
        .fetch_all(&self.backend.pool)
        .await?;
        for r in &joins {
            // A kind this version does not know is left out rather than failing the list.
            let Ok(kind) = r.try_get::<String, _>(0)?.parse::<TokenKind>() else {
                continue;
            };
            out.push(TokenInfo {
                kind,
                user: None,
                expires: rfc3339(r.try_get::<i64, _>(1)?),
            });
        }
        Ok(out)
    }
}
