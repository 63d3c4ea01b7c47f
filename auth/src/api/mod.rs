//! The auth API (port 3025, mutual TLS), one module per resource. The caller is whoever the
//! verified client certificate says ([`caller`]): a user (user TLS CA; roles re-read from the
//! backend on every request), the local admin identity `sallyport start` writes, or a cluster
//! service (host TLS CA). Every admin route is authorized by role `rules`, named in its handler's
//! signature ([`Allowed`]`<rule::UserCreate>`) and checked before the body is read; the routes a
//! proxy calls for the people and nodes it speaks for take a [`Proxy`] caller.
//!
//! This layer owns HTTP only: who is calling, which rule applies, and the wire shape of answers.
//! What a request does is `AuthServer`'s, in the module that owns the data.
//!
//! Every route is listed once in `sallyport_core::routes::AUTH`; [`router`] is built from
//! [`handlers`], and a test holds the two equal.

mod audit;
mod caller;
mod cluster;
mod connectors;
mod kube;
mod locks;
mod login;
mod nodes;
mod proxies;
mod roles;
mod sessions;
mod tokens;
mod users;
mod web_sessions;

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::MethodRouter;
use axum::{Extension, Json, Router};
use sallyport_core::api::{ErrorBody, RefusalCode};
use sallyport_core::https::PeerCertificates;
use sallyport_core::routes::{self, Method, Route};
use serde::Deserialize;

use crate::{AuthError, AuthServer};

/// Where roles match nodes; kept here for callers of the old path.
pub use crate::access::node_labels;
pub use caller::{Allowed, Caller, PeerVerifier, Proxy, Rule, rule};

/// The built-in administrator's user name (no real user name can start with `@`).
pub const ADMIN: &str = "@admin";
/// The system role of proxies in their host certificates.
pub const PROXY_ROLE: &str = "proxy";

type Auth = State<Arc<AuthServer>>;

/// The empty JSON object routes answer when there is nothing more to say.
fn done() -> Json<serde_json::Value> {
    Json(serde_json::json!({}))
}

/// Every route with its handler; [`router`] serves exactly these.
pub fn handlers() -> Vec<(Route, MethodRouter<Arc<AuthServer>>)> {
    use Method::{Delete, Get, Post, Put};
    use routes::auth as p;
    vec![
        on(Get, p::PING, cluster::ping),
        on(Get, p::STATUS, cluster::status),
        on(Get, p::CA, cluster::export_ca),
        on(Post, p::SIGNUP_START, login::signup_start),
        on(Post, p::SIGNUP_FINISH, login::signup_finish),
        on(Post, p::LOGIN, login::login),
        on(Post, p::OIDC_START, login::oidc_start),
        on(Post, p::OIDC_CALLBACK, login::oidc_callback),
        on(Post, p::OIDC_FINISH, login::oidc_finish),
        on(Get, p::USERS, users::list),
        on(Post, p::USERS, users::add),
        on(Get, p::USER, users::get),
        on(Put, p::USER, users::update),
        on(Delete, p::USER, users::remove),
        on(Post, p::USER_RESET, users::reset),
        on(Get, p::AUDIT, audit::search),
        on(Get, p::AUDIT_VERIFY, audit::verify),
        on(Post, p::AUTH_FAILURES, audit::auth_failures),
        on(Get, p::ROLES, roles::list),
        on(Post, p::ROLES, roles::put),
        on(Get, p::ROLE, roles::get),
        on(Delete, p::ROLE, roles::delete),
        on(Post, p::ACCESS_CHECK, roles::access_check),
        on(Get, p::CONNECTORS, connectors::list),
        on(Post, p::CONNECTORS, connectors::put),
        on(Delete, p::CONNECTOR, connectors::remove),
        on(Get, p::TOKENS, tokens::list),
        on(Post, p::JOIN_TOKENS, tokens::add_join_token),
        on(Post, p::JOIN, nodes::join),
        on(Get, p::PROXIES, proxies::list),
        on(Delete, p::PROXY, proxies::remove),
        on(Post, p::PROXY_JOIN, proxies::join),
        on(Post, p::PROXY_HEARTBEAT, proxies::heartbeat),
        on(Post, p::PROXY_RENEW, proxies::renew),
        on(Post, p::PROXY_PRESENCE, proxies::presence),
        on(Get, p::NODES, nodes::list),
        on(Post, p::NODES, nodes::add),
        on(Delete, p::NODE, nodes::remove),
        on(Post, p::NODE_PRESENCE, nodes::presence),
        on(Post, p::NODE_PROXY_HOST_CERT, nodes::proxy_host_cert),
        on(Post, p::NODE_HOST_KEY, nodes::pin_host_key),
        on(Post, p::NODE_RENEW, nodes::renew),
        on(Get, p::SESSIONS, sessions::list),
        on(Get, p::SESSION, sessions::get),
        on(Post, p::SESSIONS, sessions::grant),
        on(Post, p::CONNECTIONS_CLOSED, sessions::connections_closed),
        on(Post, p::SESSION_END, sessions::end),
        on(Post, p::SESSION_CHECK, sessions::check),
        on(Post, p::SESSION_UPDATE, sessions::update),
        on(Post, p::SESSION_EVENTS, sessions::events),
        on(Get, p::SESSION_RECORDING, sessions::recording),
        on(Get, p::LOCKS, locks::list),
        on(Post, p::LOCKS, locks::add),
        on(Delete, p::LOCK, locks::remove),
        on(Get, p::KUBE_CLUSTERS, kube::clusters),
        on(Post, p::KUBE_CERTS, kube::cert),
        on(Post, p::KUBE_ACCESS, kube::access),
        on(Post, p::KUBE_REQUESTS, kube::requests),
        on(Post, p::WEB_SESSIONS, web_sessions::create),
        on(Get, p::WEB_SESSION, web_sessions::get),
        on(Post, p::WEB_SESSION_TOUCH, web_sessions::touch),
        on(Post, p::WEB_SESSION_END, web_sessions::end),
        on(Post, p::WEB_SESSIONS_CHECK, web_sessions::check),
        on(Post, p::WEB_SSO, web_sessions::put_sso),
        on(Get, p::WEB_SSO_ONE, web_sessions::get_sso),
        on(Delete, p::WEB_SSO_ONE, web_sessions::remove_sso),
    ]
}

/// One route: the method in the table and the one axum serves come from the same argument.
fn on<H, T>(
    method: Method,
    pattern: &'static str,
    handler: H,
) -> (Route, MethodRouter<Arc<AuthServer>>)
where
    H: axum::handler::Handler<T, Arc<AuthServer>>,
    T: 'static,
{
    let served = match method {
        Method::Get => axum::routing::get(handler),
        Method::Post => axum::routing::post(handler),
        Method::Put => axum::routing::put(handler),
        Method::Delete => axum::routing::delete(handler),
    };
    (Route { method, pattern }, served)
}

pub fn router(auth: Arc<AuthServer>) -> Router {
    let verifier = Arc::new(PeerVerifier::new(&auth));
    let mut router = Router::new();
    // A pattern listed under several methods is merged into one route by axum.
    for (route, handler) in handlers() {
        router = router.route(route.pattern, handler);
    }
    router
        .layer(axum::middleware::from_fn_with_state(
            auth.clone(),
            audit_refusals,
        ))
        .layer(Extension(verifier))
        .layer(axum::middleware::from_fn(request_latency))
        .with_state(auth)
}

/// Each request's time to its answer's headers, in `sallyport_auth_request_duration_seconds`
/// under its route's pattern (never the concrete path: a name in it is no label).
async fn request_latency(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use sallyport_core::metrics::{RouteLabel, StatusClass, metrics};
    let route = RouteLabel::of(
        sallyport_core::routes::AUTH,
        req.method().as_str(),
        req.uri().path(),
    );
    let started = std::time::Instant::now();
    let resp = next.run(req).await;
    let status = StatusClass::of(resp.status().as_u16());
    metrics().auth_request(route, status, started.elapsed());
    resp
}

impl IntoResponse for AuthError {
    fn into_response(self) -> Response {
        let status = match &self {
            AuthError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AuthError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            AuthError::AccessDenied(_) | AuthError::UserLocked(_) | AuthError::OverLimit(_) => {
                StatusCode::FORBIDDEN
            }
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
        let code = match &self {
            AuthError::AccessDenied(_) => Some(RefusalCode::Denied),
            AuthError::UserLocked(_) => Some(RefusalCode::Locked),
            AuthError::OverLimit(_) => Some(RefusalCode::Limit),
            _ => None,
        };
        let mut resp = (
            status,
            Json(ErrorBody {
                error: message.clone(),
                code,
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

/// A request the proxy makes for a client, with the client's address it saw.
#[derive(Deserialize)]
struct Forwarded<T> {
    #[serde(flatten)]
    body: T,
    #[serde(default)]
    remote_addr: Option<String>,
}

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

/// Audits every request this API refused as unauthenticated (`auth.fail`, door `api`, with
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
        && path != routes::auth::LOGIN
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
            event: sallyport_core::audit::EventType::AuthFail,
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

#[cfg(test)]
mod tests {
    #[test]
    fn the_router_serves_exactly_the_route_table() {
        let mut served: Vec<_> = super::handlers().into_iter().map(|(r, _)| r).collect();
        served.sort();
        let mut listed = sallyport_core::routes::AUTH.to_vec();
        listed.sort();
        assert_eq!(served, listed);
    }
}
