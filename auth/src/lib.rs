//! The auth service: owner of the certificate authorities, users, roles, sign-up tokens and the
//! audit log. It is the only crate that touches the backend; everything else asks it through
//! its HTTPS API on port 3025 (mutual TLS), or, inside the all-in-one daemon, through
//! [`AuthServer`] directly.

pub mod access;
pub mod api;
pub mod audit_log;
pub mod authority;
pub mod backend;
pub mod connections;
pub mod failures;
pub mod kube;
pub mod locks;
pub mod login;
pub mod nodes;
pub mod oidc;
pub mod proxies;
pub mod recordings;
pub mod roles;
pub mod ssh_access;
pub mod users;
pub mod web_sessions;

use std::sync::Arc;
use std::time::Duration;

use sallyport_core::api::{Ping, Status};
use sallyport_core::ca::CaKind;

pub use authority::Authorities;
pub use backend::Backend;

/// What callers of the auth service match on. Each message is written for the person who will
/// read it: what failed and what to do.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AuthError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthenticated(String),
    #[error("access denied: {0}")]
    AccessDenied(String),
    /// Refused because the user is locked (`sallyctl lock`); 403 like `AccessDenied`, with
    /// its own code on the wire.
    #[error("access denied: {0}")]
    UserLocked(String),
    /// Refused because a limit of the roles is reached (`max_sessions`, `max_connections`).
    #[error("access denied: {0}")]
    OverLimit(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Locked(String),
    /// Too much work in progress (password checks): come back in a moment.
    #[error("{0}")]
    Busy(String),
    /// A system Sallyport depends on (an identity provider) failed.
    #[error("{0}")]
    Upstream(String),
    #[error("storage: {0}")]
    Storage(String),
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<sqlx::Error> for AuthError {
    fn from(e: sqlx::Error) -> Self {
        AuthError::Storage(e.to_string())
    }
}

impl From<serde_json::Error> for AuthError {
    fn from(e: serde_json::Error) -> Self {
        AuthError::Internal(format!("json: {e}"))
    }
}

/// How the auth service runs.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub cluster_name: String,
    /// `sqlite:PATH` or `postgres://...`.
    pub storage_url: String,
    /// Whether local logins need a TOTP code.
    pub second_factor: bool,
    /// Failed logins within `lockout_window` that lock an account.
    pub max_login_attempts: u32,
    pub lockout_window: Duration,
    pub lockout_duration: Duration,
    /// Names the services answer to, for their TLS certificates.
    pub public_names: Vec<String>,
    /// Where the proxy in this process writes session recordings (`<id>.cast`): read first,
    /// for a running session's and one not yet uploaded.
    pub recordings_dir: Option<std::path::PathBuf>,
    /// Where finished recordings are kept (`recordings:` in the config); none: only
    /// `recordings_dir`.
    pub recording_store: Option<sallyport_recordings::RecordingStore>,
    /// The Ed25519 key that signs audit checkpoints (OpenSSH format, 0600, made at first
    /// start), outside the database; none: the chain is not anchored.
    pub audit_checkpoint_key: Option<std::path::PathBuf>,
    /// A checkpoint is signed at every this many records...
    pub audit_checkpoint_every: u64,
    /// ...and at most this long after a record was written.
    pub audit_checkpoint_interval: Duration,
    /// How long agents' and proxies' certificates last; they renew at two thirds.
    pub host_cert_ttl: Duration,
}

impl AuthConfig {
    pub fn new(cluster_name: &str, storage_url: &str) -> Self {
        AuthConfig {
            cluster_name: cluster_name.into(),
            storage_url: storage_url.into(),
            second_factor: true,
            max_login_attempts: 5,
            lockout_window: Duration::from_secs(30 * 60),
            lockout_duration: Duration::from_secs(30 * 60),
            public_names: vec!["localhost".into(), "127.0.0.1".into(), "::1".into()],
            recordings_dir: None,
            recording_store: None,
            audit_checkpoint_key: None,
            audit_checkpoint_every: 100,
            audit_checkpoint_interval: Duration::from_secs(60),
            host_cert_ttl: Duration::from_secs(365 * 86400),
        }
    }
}

/// The auth service's state, shared by its API handlers.
pub struct AuthServer {
    pub config: AuthConfig,
    pub backend: Backend,
    pub authorities: Authorities,
    pub(crate) audit_lock: tokio::sync::Mutex<()>,
    /// Appends waiting for the chain's writer, written together (`audit_log`, group commit).
    pub(crate) audit_pending: audit_log::Pending,
    /// This server, for the audit writer's task.
    pub(crate) me: std::sync::Weak<AuthServer>,
    /// The audit checkpoint key, when the chain is anchored.
    pub(crate) audit_anchor: Option<audit_log::Anchor>,
    /// A precomputed argon2 hash so that logins for unknown users cost the same.
    pub(crate) dummy_hash: String,
    /// Failed authentications being aggregated for the audit log.
    pub(crate) failures: failures::Failures,
    /// Password checks (argon2: ~19 MiB each) run at most this many at a time.
    pub(crate) password_checks: login::PasswordChecks,
}

impl AuthServer {
    /// Opens the backend, runs migrations, and creates on first start the cluster name, the
    /// four CAs and the preset roles. A restart finds and keeps all of them.
    pub async fn open(mut config: AuthConfig) -> Result<Arc<Self>, AuthError> {
        let backend = Backend::open(&config.storage_url).await?;
        let stored = backend
            .init_state("cluster_name", &config.cluster_name)
            .await?;
        if stored != config.cluster_name {
            tracing::warn!(configured = %config.cluster_name, stored = %stored,
                "the cluster name is fixed at first start; keeping the stored one");
            config.cluster_name = stored;
        }
        let authorities = Authorities::load_or_create(&backend, &config.cluster_name).await?;
        roles::create_presets(&backend).await?;
        let audit_anchor = audit_log::Anchor::load(&config)?;
        let dummy_hash =
            login::hash_password("not a real password; timing equaliser".into()).await?;
        let auth = Arc::new_cyclic(|me| AuthServer {
            config,
            backend,
            authorities,
            audit_lock: tokio::sync::Mutex::new(()),
            audit_pending: Default::default(),
            me: me.clone(),
            audit_anchor,
            dummy_hash,
            failures: failures::Failures::default(),
            password_checks: login::PasswordChecks::new(),
        });
        auth.seed_audit_head().await?;
        auth.check_checkpoint_key().await?;
        failures::spawn_flusher(Arc::downgrade(&auth));
        audit_log::spawn_anchorer(Arc::downgrade(&auth));
        Ok(auth)
    }

    pub fn ping(&self) -> Ping {
        Ping {
            cluster_name: self.config.cluster_name.clone(),
            second_factor: if self.config.second_factor {
                "otp"
            } else {
                "off"
            }
            .into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            auth_connectors: vec![],
            local_users: false,
        }
    }

    /// What `sallyctl status` shows: the CAs' pins and fingerprints, counts, anchoring.
    pub async fn status(&self) -> Result<Status, AuthError> {
        let fps = |k| {
            self.authorities
                .ssh_public_keys(k)
                .iter()
                .map(sallyport_core::sshcert::fingerprint)
                .collect()
        };
        Ok(Status {
            cluster_name: self.config.cluster_name.clone(),
            ca_pins: self.authorities.pins()?,
            ssh_ca_fingerprints: [
                ("user".to_string(), fps(CaKind::User)),
                ("host".to_string(), fps(CaKind::Host)),
                ("openssh".to_string(), fps(CaKind::OpenSsh)),
            ]
            .into(),
            users: self.user_count().await?,
            roles: self.role_count().await?,
            audit_events: self.audit_count().await?,
            audit_anchoring_stopped: self.audit_anchoring_stopped(),
        })
    }
}
