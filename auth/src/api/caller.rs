//! Who is calling the auth API, as the TLS handshake proved it (the `PeerCertificates` request
//! extension `core::https` sets, never a header), and what they may do.
//!
//! [`Caller`] and [`Proxy`] are axum extractors: a handler names the caller it needs in its
//! arguments and the request is refused (401/403, audited by `audit_refusals`) before the handler
//! runs or its body is read. Resolving a caller re-checks the certificate against this cluster's
//! TLS CAs and the clock on every request, re-reads a user's roles from the backend and checks
//! their locks, so a removed, locked or expired user is refused at once, even on an HTTP/2
//! connection that was opened while they were still valid.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::ClientCertVerifier;
use sallyport_core::ca::{CaKind, TLS_HOST_CA_CN, TLS_USER_CA_CN};
use sallyport_core::https::PeerCertificates;
use sallyport_core::identity::Traits;

use super::{ADMIN, PROXY_ROLE};
use crate::{AuthError, AuthServer};

/// Who is calling, as proven by the TLS handshake.
#[derive(Debug, Clone)]
pub enum Caller {
    Admin,
    User {
        name: String,
        roles: Vec<String>,
        traits: Traits,
    },
    Service {
        name: String,
        role: String,
    },
}

impl Caller {
    pub fn name(&self) -> &str {
        match self {
            Caller::Admin => ADMIN,
            Caller::User { name, .. } | Caller::Service { name, .. } => name,
        }
    }

    /// A proxy of this cluster (host TLS CA, system role `proxy`).
    pub fn is_proxy(&self) -> bool {
        matches!(self, Caller::Service { role, .. } if role == PROXY_ROLE)
    }
}

/// A caller that must be one of this cluster's proxies: the routes the proxy calls for the
/// people and nodes it speaks for (logins, sign-ups, joins, session grants and reports).
#[derive(Debug, Clone)]
pub struct Proxy {
    pub name: String,
}

/// What a route requires: `VERB` on `RESOURCE`, by role `rules` (the admin identity may do
/// everything, services nothing).
pub trait Rule {
    const RESOURCE: &'static str;
    const VERB: &'static str;
}

/// A caller that role rules allow `R`. As an extractor it refuses the request before its body is
/// read: a caller without the right learns nothing from how the route would parse it.
pub struct Allowed<R>(pub Caller, PhantomData<R>);

impl<R> std::ops::Deref for Allowed<R> {
    type Target = Caller;
    fn deref(&self) -> &Caller {
        &self.0
    }
}

macro_rules! rules {
    ($($name:ident: $resource:literal $verb:literal,)*) => {
        $(
            #[doc = concat!("`", $verb, "` on `", $resource, "`.")]
            pub struct $name;
            impl Rule for $name {
                const RESOURCE: &'static str = $resource;
                const VERB: &'static str = $verb;
            }
        )*
    };
}

/// The rules the admin routes require, one type each.
pub mod rule {
    use super::Rule;
    rules! {
        ClusterRead: "cluster" "read",
        UserList: "user" "list",
        UserRead: "user" "read",
        UserCreate: "user" "create",
        UserUpdate: "user" "update",
        UserDelete: "user" "delete",
        RoleList: "role" "list",
        RoleRead: "role" "read",
        RoleCreate: "role" "create",
        RoleDelete: "role" "delete",
        ConnectorList: "connector" "list",
        ConnectorCreate: "connector" "create",
        ConnectorDelete: "connector" "delete",
        NodeCreate: "node" "create",
        NodeDelete: "node" "delete",
        ProxyList: "proxy" "list",
        ProxyDelete: "proxy" "delete",
        TokenList: "token" "list",
        TokenCreate: "token" "create",
        LockCreate: "lock" "create",
        LockDelete: "lock" "delete",
        EventList: "event" "list",
        EventRead: "event" "read",
    }
}

impl AuthServer {
    /// The caller a verified client certificate names (attributed by its issuer's CN; the chain
    /// itself is checked by the TLS layer and again by [`PeerVerifier`]).
    pub async fn caller(&self, peer: &PeerCertificates) -> Result<Caller, AuthError> {
        let leaf = peer.0.first().ok_or_else(no_certificate)?;
        let s = sallyport_core::x509::parse_subject(leaf)
            .map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
        // A kubeconfig certificate opens one cluster's door and nothing else.
        if sallyport_core::kube::KubeCertExt::from_cert(leaf).is_some() {
            return Err(AuthError::Unauthenticated(
                "a kubeconfig certificate is for kubectl only; use the login's certificate".into(),
            ));
        }
        match s.issuer_common_name.as_str() {
            TLS_USER_CA_CN if s.common_name == ADMIN => Ok(Caller::Admin),
            TLS_USER_CA_CN => {
                let u = self.get_user(&s.common_name).await?.ok_or_else(|| {
                    AuthError::Unauthenticated(format!("user {} no longer exists", s.common_name))
                })?;
                self.check_lock(&u.name).await?;
                Ok(Caller::User {
                    name: u.name,
                    roles: u.roles,
                    traits: u.traits,
                })
            }
            TLS_HOST_CA_CN => {
                let role = s.organizations.into_iter().next().unwrap_or_default();
                // A removed proxy's certificate is refused at once, not at its expiry.
                if role == PROXY_ROLE && !self.proxy_registered(&s.common_name).await? {
                    return Err(AuthError::Unauthenticated(format!(
                        "proxy {} is not registered in this cluster (removed?); join it again with a token from `sallyctl tokens add --type=proxy`",
                        s.common_name
                    )));
                }
                Ok(Caller::Service {
                    name: s.common_name,
                    role,
                })
            }
            other => Err(AuthError::Unauthenticated(format!(
                "certificate from an unknown CA {other:?}"
            ))),
        }
    }

    /// May `caller` use `verb` on `resource`? Explains a refusal.
    pub async fn authorize(
        &self,
        caller: &Caller,
        resource: &str,
        verb: &str,
    ) -> Result<(), AuthError> {
        match caller {
            Caller::Admin => Ok(()),
            Caller::Service { name, .. } => Err(AuthError::AccessDenied(format!(
                "service {name} cannot `{verb}` on `{resource}`"
            ))),
            Caller::User { roles, traits, .. } => {
                let d = self
                    .role_set(roles, traits)
                    .await?
                    .check_rule(resource, verb);
                if d.allowed {
                    Ok(())
                } else {
                    Err(AuthError::AccessDenied(d.explanation))
                }
            }
        }
    }
}

fn no_certificate() -> AuthError {
    AuthError::Unauthenticated("a client certificate is required".into())
}

/// Checks a presented chain against this cluster's user and host TLS CAs at the time of each
/// request, with the same verifier the TLS layer uses at the handshake. The handshake alone is
/// not enough: a connection outlives the certificate it was opened with, and the caller is
/// attributed by its issuer's name, which only a verified chain makes true.
///
/// The leaf's expiry is checked on every request; the chain's signatures, which cannot change,
/// once per [`VERIFIED_FOR`] for the exact bytes presented (a proxy asks several times per
/// session, and a verification is most of what a request to auth costs its CPU). What they are
/// checked against cannot change either: the roots are read once, when auth's router is built.
/// A CA rotated in a running auth would have to clear this memory with the verifier.
pub struct PeerVerifier {
    verifier: Result<Arc<dyn ClientCertVerifier>, String>,
    /// Chains verified lately, by the SHA-256 of their certificates, and when.
    verified: std::sync::Mutex<HashMap<[u8; 32], Instant>>,
}

/// How long a chain's verification stands for the same bytes (the leaf's expiry aside, which
/// every request checks): far below any CA certificate's lifetime.
const VERIFIED_FOR: Duration = Duration::from_secs(60);

/// Chains remembered at most; past that the memory starts afresh.
const VERIFIED_MAX: usize = 4096;

/// The SHA-256 of a chain's certificates, each prefixed by its length.
fn chain_digest(chain: &[CertificateDer<'_>]) -> [u8; 32] {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA256);
    for cert in chain {
        ctx.update(&(cert.len() as u64).to_be_bytes());
        ctx.update(cert);
    }
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

impl PeerVerifier {
    pub fn new(auth: &AuthServer) -> Self {
        let build = || -> Result<Arc<dyn ClientCertVerifier>, String> {
            let mut roots = rustls::RootCertStore::empty();
            for kind in [CaKind::TlsUser, CaKind::TlsHost] {
                let ders = sallyport_core::x509::pem_to_ders(&auth.authorities.tls_pem(kind))
                    .map_err(|e| e.to_string())?;
                for der in ders {
                    roots.add(der).map_err(|e| e.to_string())?;
                }
            }
            rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .map_err(|e| e.to_string())
        };
        PeerVerifier {
            verifier: build(),
            verified: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn check(&self, chain: &[CertificateDer<'static>]) -> Result<(), AuthError> {
        let (leaf, intermediates) = chain.split_first().ok_or_else(no_certificate)?;
        let subject = sallyport_core::x509::parse_subject(leaf)
            .map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
        if subject.not_after < sallyport_core::unix_now() {
            return Err(AuthError::Unauthenticated(format!(
                "the client certificate of {} expired at {}; log in again (`sally login`)",
                subject.common_name,
                sallyport_core::rfc3339(subject.not_after)
            )));
        }
        // Fail closed: without a verifier no caller is believed.
        let verifier = self
            .verifier
            .as_ref()
            .map_err(|e| AuthError::Internal(format!("cannot check client certificates: {e}")))?;
        let digest = chain_digest(chain);
        let lately = self
            .verified
            .lock()
            .ok()
            .and_then(|v| v.get(&digest).copied())
            .is_some_and(|at| at.elapsed() < VERIFIED_FOR);
        if lately {
            return Ok(());
        }
        verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .map_err(|e| {
                AuthError::Unauthenticated(format!(
                    "the client certificate of {} is not one this cluster issued: {e}",
                    subject.common_name
                ))
            })?;
        // Only a chain that verified is remembered.
        if let Ok(mut v) = self.verified.lock() {
            if v.len() >= VERIFIED_MAX {
                v.clear();
            }
            v.insert(digest, Instant::now());
        }
        Ok(())
    }
}

/// The caller of a request: its verified peer certificates, checked again now.
async fn resolve(parts: &Parts, auth: &AuthServer) -> Result<Caller, AuthError> {
    // `core::https` sets both on every request; a request without them proved nothing.
    let peer = parts
        .extensions
        .get::<PeerCertificates>()
        .cloned()
        .unwrap_or_default();
    if peer.0.is_empty() {
        return Err(no_certificate());
    }
    parts
        .extensions
        .get::<Arc<PeerVerifier>>()
        .ok_or_else(|| AuthError::Internal("no client certificate verifier".into()))?
        .check(&peer.0)?;
    auth.caller(&peer).await
}

impl FromRequestParts<Arc<AuthServer>> for Caller {
    type Rejection = AuthError;

    async fn from_request_parts(
        parts: &mut Parts,
        auth: &Arc<AuthServer>,
    ) -> Result<Self, Self::Rejection> {
        resolve(parts, auth).await
    }
}

impl FromRequestParts<Arc<AuthServer>> for Proxy {
    type Rejection = AuthError;

    async fn from_request_parts(
        parts: &mut Parts,
        auth: &Arc<AuthServer>,
    ) -> Result<Self, Self::Rejection> {
        let caller = resolve(parts, auth).await?;
        if caller.is_proxy() {
            Ok(Proxy {
                name: caller.name().to_string(),
            })
        } else {
            Err(AuthError::AccessDenied(format!(
                "{} is not a proxy",
                caller.name()
            )))
        }
    }
}

impl<R: Rule> FromRequestParts<Arc<AuthServer>> for Allowed<R> {
    type Rejection = AuthError;

    async fn from_request_parts(
        parts: &mut Parts,
        auth: &Arc<AuthServer>,
    ) -> Result<Self, Self::Rejection> {
        let caller = resolve(parts, auth).await?;
        auth.authorize(&caller, R::RESOURCE, R::VERB).await?;
        Ok(Allowed(caller, PhantomData))
    }
}
