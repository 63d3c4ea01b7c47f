//! The auth API (port 3025, mutual TLS). The caller is whoever the verified client certificate
//! says: a user (user TLS CA; roles re-read from the backend on every request), the local admin
//! identity `sallyport start` writes, or a cluster service (host TLS CA). Every admin route is
//! authorized by role `rules`.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use sallyport_core::api::*;
use sallyport_core::ca::{CaKind, TLS_HOST_CA_CN, TLS_USER_CA_CN};
use sallyport_core::https::PeerCertificates;
use sallyport_core::identity::Traits;
use serde::Deserialize;

use crate::{AuthError, AuthServer};

/// The built-in administrator's user name (no real user name can start with `@`).
pub const ADMIN: &str = "@admin";
/// The system role of proxies in their host certificates.
pub const PROXY_ROLE: &str = "proxy";

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let status = match &self {
            AuthError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AuthError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            AuthError::AccessDenied(_) => StatusCode::FORBIDDEN,
            AuthError::NotFound(_) => StatusCode::NOT_FOUND,
            AuthError::Conflict(_) => StatusCode::CONFLICT,
            AuthError::Locked(_) => StatusCode::TOO_MANY_REQUESTS,
            AuthError::Busy(_) => StatusCode::SERVICE_UNAVAILABLE,
            AuthError::Upstream(_) => StatusCode::BAD_GATEWAY,
            AuthError::Storage(_) | AuthError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        if status == StatusCode::INTERNAL_SERVER_ERROR {
            tracing::error!(error = %self, "auth request failed");
        }
        let message = self.to_string();
        let mut resp = (
            status,
            Json(ErrorBody {
                error: message.clone(),
            }),
        )
            .into_response();
        match self {
            // For `audit_refusals`, which audits them at the door.
            AuthError::Unauthenticated(_) => {
                resp.extensions_mut().insert(Unauthenticated(message));
            }
            AuthError::Busy(_) => {
                resp.headers_mut().insert(
                    axum::http::header::RETRY_AFTER,
                    axum::http::HeaderValue::from_static("2"),
                );
            }
            _ => {}
        }
        resp
    }
}

/// Why a request was answered 401 (a response extension, never sent).
#[derive(Clone)]
struct Unauthenticated(String);

/// The client's address as the proxy forwarded it, for a refusal of a request the proxy made
/// on the client's behalf (a response extension, never sent): the refusal is the client's, not
/// the proxy's.
#[derive(Clone)]
struct ForwardedFor(String);

/// `result` as a response, carrying the forwarded client address when it is a refusal.
fn for_client<T: serde::Serialize>(
    result: Result<T, AuthError>,
    remote: Option<String>,
) -> Response {
    match result {
        Ok(v) => Json(v).into_response(),
        Err(e) => {
            let mut resp = e.into_response();
            if let Some(r) = remote.filter(|r| !r.is_empty()) {
                resp.extensions_mut().insert(ForwardedFor(r));
            }
            resp
        }
    }
}

/// Audits every request this API refused as unauthenticated (`auth.failed`, door `api`, with
/// the client certificate it presented), aggregated. The login endpoint audits its own
/// refusals as unsuccessful `user.login` events, so it is left out here.
async fn audit_refusals(
    State(auth): Auth,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let path = req.uri().path().to_string();
    let remote = req
        .extensions()
        .get::<sallyport_core::https::RemoteAddr>()
        .map(|a| a.0.to_string())
        .unwrap_or_default();
    let peer = req.extensions().get::<PeerCertificates>().cloned();
    let resp = next.run(req).await;
    if let Some(Unauthenticated(reason)) = resp.extensions().get::<Unauthenticated>()
        && path != "/v1/login"
    {
        let remote = resp
            .extensions()
            .get::<ForwardedFor>()
            .map_or(remote, |f| f.0.clone());
        let mut presented = serde_json::Map::new();
        if let Some(s) = peer
            .as_ref()
            .and_then(|p| p.0.first())
            .and_then(|leaf| sallyport_core::x509::parse_subject(leaf).ok())
        {
            presented.insert("cert_subject_cn".into(), s.common_name.into());
            presented.insert("cert_issuer_cn".into(), s.issuer_common_name.into());
        }
        auth.auth_failed(crate::failures::Failure {
            event: "auth.failed",
            door: "api".into(),
            remote_addr: remote,
            reason: reason.clone(),
            user: None,
            user_exists: false,
            event_fields: vec![
                ("presented".into(), presented.into()),
                ("path".into(), path.into()),
            ],
        })
        .await;
    }
    resp
}

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
}

impl AuthServer {
    pub async fn caller(&self, peer: &PeerCertificates) -> Result<Caller, AuthError> {
        let leaf = peer
            .0
            .first()
            .ok_or_else(|| AuthError::Unauthenticated("a client certificate is required".into()))?;
        let s = sallyport_core::x509::parse_subject(leaf)
            .map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
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
            TLS_HOST_CA_CN => Ok(Caller::Service {
                name: s.common_name,
                role: s.organizations.into_iter().next().unwrap_or_default(),
            }),
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

type Auth = State<Arc<AuthServer>>;

async fn caller_of(auth: &AuthServer, peer: &PeerCertificates) -> Result<Caller, AuthError> {
    auth.caller(peer).await
}

async fn require_proxy(auth: &AuthServer, peer: &PeerCertificates) -> Result<(), AuthError> {
    match caller_of(auth, peer).await? {
        Caller::Service { role, .. } if role == PROXY_ROLE => Ok(()),
        c => Err(AuthError::AccessDenied(format!(
            "{} is not a proxy",
            c.name()
        ))),
    }
}

pub fn router(auth: Arc<AuthServer>) -> Router {
    Router::new()
        .route("/v1/ping", get(ping))
        .route("/v1/signup/start", post(signup_start))
        .route("/v1/signup/finish", post(signup_finish))
        .route("/v1/login", post(login))
        .route("/v1/status", get(status))
        .route("/v1/users", get(list_users).post(add_user))
        .route(
            "/v1/users/{name}",
            get(get_user).put(update_user).delete(remove_user),
        )
        .route("/v1/users/{name}/reset", post(reset_user))
        .route("/v1/ca/{kind}", get(export_ca))
        .route("/v1/audit", get(audit_search))
        .route("/v1/audit/verify", get(audit_verify))
        .route("/v1/roles", get(list_roles).post(put_role))
        .route("/v1/roles/{name}", get(get_role).delete(delete_role))
        .route("/v1/tokens", get(list_tokens))
        .route("/v1/nodes", get(list_nodes).post(add_node))
        .route("/v1/nodes/{name}", axum::routing::delete(remove_node))
        .route("/v1/access/check", post(access_check))
        .route("/v1/tokens/join", post(add_join_token))
        .route("/v1/join", post(join))
        .route("/v1/nodes/{name}/presence", post(presence))
        .route("/v1/nodes/{name}/proxy-host-cert", post(proxy_host_cert))
        .route("/v1/nodes/{name}/host-key", post(pin_host_key))
        .route("/v1/sessions", get(list_sessions).post(session_grant))
        .route("/v1/locks", get(list_locks).post(add_lock))
        .route("/v1/connectors", get(list_connectors).post(put_connector))
        .route(
            "/v1/connectors/{name}",
            axum::routing::delete(remove_connector),
        )
        .route("/v1/oidc/start", post(oidc_start))
        .route("/v1/oidc/callback", post(oidc_callback))
        .route("/v1/oidc/finish", post(oidc_finish))
        .route("/v1/locks/{id}", axum::routing::delete(remove_lock))
        .route("/v1/sessions/{id}/end", post(session_end))
        .route("/v1/sessions/{id}/check", post(session_check))
        .route("/v1/sessions/{id}/update", post(session_update))
        .route("/v1/sessions/{id}/events", post(session_events))
        .route("/v1/sessions/{id}/recording", get(recording))
        .route("/v1/auth-failures", post(auth_failures))
        .layer(axum::middleware::from_fn_with_state(
            auth.clone(),
            audit_refusals,
        ))
        .with_state(auth)
}

async fn ping(State(auth): Auth) -> Result<Json<Ping>, AuthError> {
    let mut p = auth.ping();
    // Every `sally ssh` pings (for the SSH port): names only, no connector specs read.
    p.auth_connectors = auth.connector_names().await?;
    p.local_users = auth.has_local_users().await?;
    Ok(Json(p))
}

async fn list_connectors(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<sallyport_core::oidc::OidcConnector>>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "connector", "list").await?;
    Ok(Json(auth.list_connectors().await?))
}

async fn put_connector(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<PutConnector>,
) -> Result<(StatusCode, Json<PutRoleResult>), AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "connector", "create").await?;
    if req.overwrite {
        auth.authorize(&caller, "connector", "update").await?;
    }
    let created = auth
        .put_connector(&req.connector, req.overwrite, caller.name())
        .await?;
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(PutRoleResult {
            name: req.connector.metadata.name.clone(),
            created,
        }),
    ))
}

async fn remove_connector(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "connector", "delete").await?;
    auth.remove_connector(&name, caller.name()).await?;
    Ok(Json(serde_json::json!({})))
}

async fn oidc_start(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<crate::oidc::OidcStart>,
) -> Result<Json<crate::oidc::OidcStarted>, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(Json(auth.oidc_start(&req).await?))
}

async fn oidc_callback(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<crate::oidc::OidcCallback>,
) -> Result<Json<crate::oidc::OidcRedirect>, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(Json(auth.oidc_callback(&req).await?))
}

async fn oidc_finish(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<crate::oidc::OidcFinish>,
) -> Result<Json<Certs>, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(Json(auth.oidc_finish(&req).await?))
}

async fn signup_start(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<Forwarded<SignupStart>>,
) -> Result<Response, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(for_client(
        auth.signup_start(&req.body).await,
        req.remote_addr,
    ))
}

#[derive(Deserialize)]
struct Forwarded<T> {
    #[serde(flatten)]
    body: T,
    #[serde(default)]
    remote_addr: Option<String>,
}

async fn signup_finish(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<Forwarded<SignupFinish>>,
) -> Result<Response, AuthError> {
    require_proxy(&auth, &peer).await?;
    let done = auth
        .signup_finish(&req.body, req.remote_addr.as_deref().unwrap_or(""))
        .await
        .map(|()| serde_json::json!({}));
    Ok(for_client(done, req.remote_addr))
}

async fn login(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<LoginRequest>,
) -> Result<Json<Certs>, AuthError> {
    require_proxy(&auth, &peer).await?;
    let remote = req.remote_addr.clone().unwrap_or_default();
    Ok(Json(auth.login(&req, &remote).await?))
}

/// Failed authentications the proxy saw at its SSH and tunnel doors, in batches.
async fn auth_failures(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(batch): Json<Vec<AuthFailure>>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    if batch.len() > crate::failures::MAX_BATCH {
        return Err(AuthError::BadRequest(format!(
            "at most {} failures per report",
            crate::failures::MAX_BATCH
        )));
    }
    for f in &batch {
        if !matches!(f.door.as_str(), "ssh" | "tunnel") {
            return Err(AuthError::BadRequest(format!(
                "unknown door {:?}: ssh or tunnel",
                f.door
            )));
        }
    }
    for f in &batch {
        // A proxy's count of the reports its full queue dropped stands for that many.
        auth.auth_failed_times(crate::failures::Failure::reported(f), f.count.unwrap_or(1))
            .await;
    }
    Ok(Json(serde_json::json!({})))
}

async fn status(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Status>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "cluster", "read").await?;
    let fps = |k| {
        auth.authorities
            .ssh_public_keys(k)
            .iter()
            .map(sallyport_core::sshcert::fingerprint)
            .collect()
    };
    Ok(Json(Status {
        cluster_name: auth.config.cluster_name.clone(),
        ca_pins: auth.authorities.pins()?,
        ssh_ca_fingerprints: [
            ("user".to_string(), fps(CaKind::User)),
            ("host".to_string(), fps(CaKind::Host)),
            ("openssh".to_string(), fps(CaKind::OpenSsh)),
        ]
        .into(),
        users: auth.user_count().await?,
        roles: auth.role_count().await?,
        audit_events: auth.audit_count().await?,
        audit_anchoring_stopped: auth.audit_anchoring_stopped(),
    }))
}

async fn list_users(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<UserInfo>>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "user", "list").await?;
    Ok(Json(auth.list_users().await?))
}

async fn add_user(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<AddUser>,
) -> Result<(StatusCode, Json<SignupToken>), AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "user", "create").await?;
    Ok((
        StatusCode::CREATED,
        Json(auth.add_user(&req, caller.name()).await?),
    ))
}

async fn remove_user(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "user", "delete").await?;
    auth.remove_user(&name, caller.name()).await?;
    Ok(Json(serde_json::json!({})))
}

async fn reset_user(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<SignupToken>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "user", "update").await?;
    Ok(Json(auth.reset_user(&name, caller.name()).await?))
}

/// CA public keys are public: any caller the handshake verified may read them.
async fn export_ca(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(kind): Path<String>,
) -> Result<Json<CaExport>, AuthError> {
    caller_of(&auth, &peer).await?;
    let k = CaKind::parse(&kind).ok_or_else(|| {
        AuthError::BadRequest(format!(
            "unknown CA type {kind:?}: use user, host, openssh, tls-user or tls-host"
        ))
    })?;
    Ok(Json(CaExport {
        kind,
        text: auth.authorities.export(k, &auth.config.cluster_name)?,
    }))
}

async fn audit_search(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Query(q): Query<AuditQuery>,
) -> Result<(axum::http::HeaderMap, Json<Vec<serde_json::Value>>), AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "event", "list").await?;
    let found = auth.audit_search(&q).await?;
    // Beside the body, which stays the plain list of records older clients read.
    let mut headers = axum::http::HeaderMap::new();
    if let Some(seq) = found.unanchored_from {
        headers.insert(
            axum::http::HeaderName::from_static(sallyport_core::audit::UNANCHORED_HEADER),
            axum::http::HeaderValue::from(seq),
        );
    }
    Ok((headers, Json(found.records)))
}

async fn audit_verify(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<AuditVerify>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "event", "read").await?;
    Ok(Json(auth.audit_verify().await?))
}

async fn get_user(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<UserInfo>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "user", "read").await?;
    Ok(Json(auth.user_info(&name).await?))
}

async fn update_user(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
    Json(req): Json<UpdateUser>,
) -> Result<Json<UserInfo>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "user", "update").await?;
    Ok(Json(auth.update_user(&name, &req, caller.name()).await?))
}

async fn list_roles(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<sallyport_core::role::Role>>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "role", "list").await?;
    Ok(Json(auth.list_roles().await?))
}

async fn get_role(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<sallyport_core::role::Role>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "role", "read").await?;
    let role = auth
        .get_role(&name)
        .await?
        .ok_or_else(|| AuthError::NotFound(format!("role {name} does not exist")))?;
    Ok(Json(role))
}

async fn put_role(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<PutRole>,
) -> Result<Json<PutRoleResult>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "role", "create").await?;
    if req.overwrite {
        auth.authorize(&caller, "role", "update").await?;
    }
    let created = auth
        .put_role(&req.role, req.overwrite, caller.name())
        .await?;
    Ok(Json(PutRoleResult {
        name: req.role.metadata.name.clone(),
        created,
    }))
}

async fn delete_role(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "role", "delete").await?;
    auth.delete_role(&name, caller.name()).await?;
    Ok(Json(serde_json::json!({})))
}

async fn list_locks(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<LockInfo>>, AuthError> {
    // Proxies poll the locks to refuse and disconnect locked users at the SSH door.
    if require_proxy(&auth, &peer).await.is_err() {
        let caller = caller_of(&auth, &peer).await?;
        auth.authorize(&caller, "lock", "list").await?;
    }
    Ok(Json(auth.list_locks().await?))
}

async fn add_lock(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<AddLock>,
) -> Result<Json<LockInfo>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "lock", "create").await?;
    Ok(Json(auth.add_lock(&req, caller.name()).await?))
}

async fn remove_lock(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "lock", "delete").await?;
    auth.remove_lock(&id, caller.name()).await?;
    Ok(Json(serde_json::json!({})))
}

async fn list_tokens(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<TokenInfo>>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "token", "list").await?;
    Ok(Json(auth.list_tokens().await?))
}

async fn list_nodes(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<NodeInfo>>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    let nodes = auth.list_nodes().await?;
    // Admins with `list` on `node` see every node; everyone else sees what their roles reach.
    if auth.authorize(&caller, "node", "list").await.is_ok() {
        return Ok(Json(nodes));
    }
    match &caller {
        Caller::User { roles, traits, .. } => {
            let set = auth.role_set(roles, traits).await?;
            Ok(Json(
                nodes
                    .into_iter()
                    .filter(|n| set.can_see_node(&node_labels(n)))
                    .collect(),
            ))
        }
        _ => Err(AuthError::AccessDenied(format!(
            "{} cannot list nodes",
            caller.name()
        ))),
    }
}

/// The labels a node is matched by: its own, plus `hostname` and `id` as Teleport does.
/// A node's labels as roles see them: its own, then the built-in ones from the registry, which
/// win over anything stored (a row written before labels were checked cannot override them).
pub fn node_labels(n: &NodeInfo) -> std::collections::BTreeMap<String, String> {
    let mut l = n.labels.clone();
    l.insert("hostname".into(), n.hostname.clone());
    l.insert("id".into(), n.id.clone());
    l
}

async fn add_node(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<AddNode>,
) -> Result<(StatusCode, Json<NodeInfo>), AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "node", "create").await?;
    Ok((
        StatusCode::CREATED,
        Json(auth.add_node(&req, caller.name()).await?),
    ))
}

async fn remove_node(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "node", "delete").await?;
    auth.remove_node(&name, caller.name()).await?;
    Ok(Json(serde_json::json!({})))
}

async fn access_check(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<AccessCheck>,
) -> Result<Json<sallyport_core::role::Decision>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "role", "read").await?;
    auth.authorize(&caller, "user", "read").await?;
    Ok(Json(auth.access_check(&req).await?))
}

impl AuthServer {
    /// The decision the doors would make for `req`, with the role and rule that decide it.
    pub async fn access_check(
        &self,
        req: &AccessCheck,
    ) -> Result<sallyport_core::role::Decision, AuthError> {
        let user = self
            .get_user(&req.user)
            .await?
            .ok_or_else(|| AuthError::NotFound(format!("user {} does not exist", req.user)))?;
        let set = self.role_set(&user.roles, &user.traits).await?;
        if let Some(node) = &req.node {
            let login = req
                .login
                .as_deref()
                .ok_or_else(|| AuthError::BadRequest("--node needs --login".into()))?;
            let n = self
                .find_node(node)
                .await?
                .ok_or_else(|| AuthError::NotFound(format!("node {node} is not registered")))?;
            return Ok(set.check_node(login, &node_labels(&n)));
        }
        if let Some(resource) = &req.kube_resource {
            let parts: Vec<&str> = resource.split('/').collect();
            let [kind, namespace, name] = parts[..] else {
                return Err(AuthError::BadRequest(format!(
                    "--kube-resource {resource:?} must be kind/namespace/name"
                )));
            };
            let verb = req
                .verb
                .as_deref()
                .ok_or_else(|| AuthError::BadRequest("--kube-resource needs --verb".into()))?;
            let mut labels = req.kube_labels.clone();
            if let Some(c) = &req.kube_cluster {
                labels
                    .entry("kube_cluster".into())
                    .or_insert_with(|| c.clone());
            }
            return Ok(set.check_kube(
                &labels,
                &sallyport_core::role::KubeRequest {
                    kind,
                    namespace,
                    name,
                    verb,
                },
            ));
        }
        Err(AuthError::BadRequest("say what to check: --node NODE --login LOGIN, or --kube-resource kind/ns/name --verb VERB".into()))
    }
}

async fn add_join_token(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<AddJoinToken>,
) -> Result<Json<JoinToken>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    auth.authorize(&caller, "token", "create").await?;
    Ok(Json(auth.add_join_token(&req, caller.name()).await?))
}

async fn join(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<JoinRequest>,
) -> Result<Json<Joined>, AuthError> {
    require_proxy(&auth, &peer).await?;
    let remote = req.remote_addr.clone().unwrap_or_default();
    Ok(Json(auth.join(&req, &remote).await?))
}

async fn presence(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
    Json(p): Json<Presence>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    auth.presence(&id, &p).await?;
    Ok(Json(serde_json::json!({})))
}

#[derive(Deserialize)]
struct PublicKeyBody {
    public_key: String,
}

async fn proxy_host_cert(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(name): Path<String>,
    Json(b): Json<PublicKeyBody>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    let cert = auth.proxy_host_cert(&name, &b.public_key).await?;
    let node = auth
        .find_node(&name)
        .await?
        .ok_or_else(|| AuthError::NotFound(format!("node {name} is not registered")))?;
    Ok(Json(serde_json::json!({"cert": cert, "node": node})))
}

#[derive(Deserialize)]
struct HostKeyBody {
    host_key: String,
}

/// Trust on first use for agentless nodes: the first host key the proxy sees is pinned, and
/// the pinned key is returned every time after.
async fn pin_host_key(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
    Json(b): Json<HostKeyBody>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(Json(
        serde_json::json!({"host_key": auth.pin_host_key(&id, &b.host_key).await?}),
    ))
}

async fn session_grant(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<SessionRequest>,
) -> Result<Json<SessionGrant>, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(Json(auth.session_grant(&req).await?))
}

async fn session_end(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
    Json(end): Json<SessionEnd>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    auth.session_end(&id, &end).await?;
    Ok(Json(serde_json::json!({})))
}

/// The proxy checks a running session's grant again (a forward's new connection).
async fn session_check(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
) -> Result<Json<GrantCheck>, AuthError> {
    require_proxy(&auth, &peer).await?;
    Ok(Json(auth.session_check(&id).await?))
}

/// Whose sessions `caller` may see: everyone's with `list` on `event` (auditors, editors),
/// otherwise only their own, with `list` on `session`.
async fn session_scope(auth: &AuthServer, caller: &Caller) -> Result<Option<String>, AuthError> {
    if auth.authorize(caller, "event", "list").await.is_ok() {
        return Ok(None);
    }
    auth.authorize(caller, "session", "list").await?;
    Ok(Some(caller.name().to_string()))
}

async fn list_sessions(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
) -> Result<Json<Vec<SessionInfo>>, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    let scope = session_scope(&auth, &caller).await?;
    Ok(Json(auth.list_sessions(scope.as_deref()).await?))
}

async fn recording(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
) -> Result<Response, AuthError> {
    let caller = caller_of(&auth, &peer).await?;
    let scope = session_scope(&auth, &caller).await?;
    let s = auth
        .get_session(&id)
        .await?
        .ok_or_else(|| AuthError::NotFound(format!("session {id} does not exist")))?;
    if scope.as_deref().is_some_and(|u| u != s.user) {
        return Err(AuthError::AccessDenied(format!(
            "session {id} belongs to another user"
        )));
    }
    uuid::Uuid::parse_str(&id).map_err(|_| AuthError::BadRequest("not a session id".into()))?;
    let dir = auth
        .config
        .recordings_dir
        .clone()
        .ok_or_else(|| AuthError::NotFound("no recordings are kept here".into()))?;
    let file = tokio::fs::File::open(dir.join(format!("{id}.cast")))
        .await
        .map_err(|e| {
            AuthError::NotFound(format!("recording of session {id} is not available: {e}"))
        })?;
    // Streamed as it is read: a recording may be as large as `max_recording_size` (a GiB by
    // default), and auth must not hold one, let alone several, in memory.
    let body =
        axum::body::Body::from_stream(tokio_util::io::ReaderStream::with_capacity(file, 64 * 1024));
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-asciicast")],
        body,
    )
        .into_response())
}

async fn session_events(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
    Json(events): Json<Vec<sallyport_core::api::SessionEvent>>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    auth.session_events(&id, &events).await?;
    Ok(Json(serde_json::json!({})))
}

async fn session_update(
    State(auth): Auth,
    Extension(peer): Extension<PeerCertificates>,
    Path(id): Path<String>,
    Json(end): Json<SessionEnd>,
) -> Result<Json<serde_json::Value>, AuthError> {
    require_proxy(&auth, &peer).await?;
    auth.session_update(
        &id,
        end.kind.as_deref().unwrap_or("shell"),
        end.command.as_deref(),
    )
    .await?;
    Ok(Json(serde_json::json!({})))
}
