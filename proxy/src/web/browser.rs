//! The browser's API: sign-in, the web session, sign-out and the nodes list, each checked in
//! the order a request meets them — the exact `Origin` (every request that changes something,
//! and every WebSocket upgrade), the session cookie, the CSRF token, then a JSON body of at
//! most 64 KiB. Refusals are JSON (`{"error": ...}`): 401 not signed in, 403 cross-origin or
//! without the token, 413, 415.
//!
//! Sign-in has no session yet, hence no CSRF token: the exact `Origin` and a JSON body (which a
//! cross-site form cannot send) guard it.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::{Extension, http::Method};
use sallyport_core::api::{Certs, ErrorBody, LoginRequest, NodeInfo, NodeKind, RefusalCode};
use sallyport_core::https::RemoteAddr;
use sallyport_core::routes::auth;
use serde::Deserialize;

use super::MAX_BODY;
use super::sessions::{self, Earned, WebSession, WebSessions};
use crate::auth_client::ClientError;
use crate::state::ProxyState;

/// What the browser's API needs beside the auth client.
pub struct Browser {
    pub state: Arc<ProxyState>,
    pub sessions: Arc<WebSessions>,
    /// The proxy's own public origins (`https://host:port`), matched exactly.
    pub origins: Vec<String>,
}

pub const CSRF_HEADER: &str = "x-csrf-token";

/// An API refusal, as JSON.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(ErrorBody {
                error: self.message,
                code: None,
            }),
        )
            .into_response()
    }
}

pub const NOT_SIGNED_IN: &str =
    "not signed in, or your web session ended (signed out, idle or expired); sign in again";

impl Browser {
    /// The request's `Origin` must be exactly one of the proxy's own.
    pub fn same_origin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let origin = headers
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .unwrap_or("");
        if !origin.is_empty() && self.origins.iter().any(|o| o == origin) {
            return Ok(());
        }
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            if origin.is_empty() {
                "cross-origin request refused: no Origin header".to_string()
            } else {
                format!("cross-origin request refused: {origin} is not this proxy's origin")
            },
        ))
    }

    /// The web session the request's cookie names (this proxy's cache, or auth's: another
    /// proxy may have opened it).
    pub async fn signed_in(&self, headers: &HeaderMap) -> Result<Arc<WebSession>, ApiError> {
        let Some(id) = sessions::cookie_value(headers) else {
            return Err(ApiError::new(StatusCode::UNAUTHORIZED, NOT_SIGNED_IN));
        };
        self.sessions
            .find(&id)
            .await
            .map_err(from_auth)?
            .ok_or_else(|| ApiError::new(StatusCode::UNAUTHORIZED, NOT_SIGNED_IN))
    }

    /// What every request that changes something passes: the exact origin, a session, and
    /// that session's CSRF token. A request that passes is the person's activity
    /// (`web_idle_timeout`).
    pub async fn changing(&self, headers: &HeaderMap) -> Result<Arc<WebSession>, ApiError> {
        self.same_origin(headers)?;
        let session = self.signed_in(headers).await?;
        let token = headers
            .get(CSRF_HEADER)
            .and_then(|t| t.to_str().ok())
            .unwrap_or("");
        if token.is_empty() || !session.csrf_matches(token) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "missing or wrong X-CSRF-Token: take it from GET /v1/webapi/web/session (reload the page)",
            ));
        }
        session.touch();
        Ok(session)
    }
}

/// A JSON body of at most [`MAX_BODY`] bytes: 415 for anything but `application/json`, 413
/// past the limit, 400 when it does not read as `T`.
pub async fn json_body<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Body,
) -> Result<T, ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|c| c.to_str().ok())
        .and_then(|c| c.split(';').next())
        .is_some_and(|c| c.trim().eq_ignore_ascii_case("application/json"));
    if !json {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "the body must be JSON (Content-Type: application/json)",
        ));
    }
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is larger than {} KiB", MAX_BODY / 1024),
        )
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("unreadable request: {e}")))
}

/// Auth's refusal as the browser gets it; anything else is auth being unreachable.
pub(crate) fn from_auth(e: ClientError) -> ApiError {
    match e {
        ClientError::Refused {
            status, message, ..
        } => ApiError::new(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
            message,
        ),
        e => {
            tracing::error!(error = %e, "auth unreachable");
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "the auth service is unreachable; try again shortly",
            )
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WebLogin {
    user: String,
    password: String,
    #[serde(default)]
    totp: Option<String>,
}

/// What the browser learns of its session (`GET /v1/webapi/web/session`, and sign-in's answer).
fn session_json(s: &WebSession) -> serde_json::Value {
    serde_json::json!({
        "user": s.user,
        "roles": s.roles,
        "logins": s.logins,
        "expires": s.valid_until,
        "idle_timeout_secs": s.idle.as_secs(),
        "csrf_token": s.csrf_token(),
    })
}

type Web = State<Arc<super::Web>>;

/// `POST /v1/webapi/web/login`: a local login that opens a web session. The proxy makes the
/// key; auth checks the password, the one-time code (its step claimed once), the lockout and
/// locks as for `sally login`, audits `user.login` with `method: web`, and certifies the key.
pub(crate) async fn login(
    State(web): Web,
    Extension(remote): Extension<RemoteAddr>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    web.browser.same_origin(&headers)?;
    let form: WebLogin = json_body(&headers, body).await?;
    let internal = |e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "cannot make a web session's key");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the proxy could not make a key for the session",
        )
    };
    let key = sallyport_core::sshcert::generate_ed25519().map_err(|e| internal(&e))?;
    let public = key.public_key().to_openssh().map_err(|e| internal(&e))?;
    let req = LoginRequest {
        user: form.user,
        password: form.password,
        otp_code: form.totp,
        ssh_public_key: public,
        ttl_secs: None,
        remote_addr: Some(remote.0.to_string()),
        web: true,
    };
    let certs: Certs = web
        .auth
        .json(reqwest::Method::POST, auth::LOGIN, Some(&req))
        .await
        .map_err(from_auth)?;
    let (session, id) = open_session(&web.browser.sessions, certs, &key).await?;
    let mut resp = Json(session_json(&session)).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&sessions::set_cookie(&id)) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// A web session for the certificates auth issued over `key` (the proxy's own, made for this
/// sign-in), kept by auth for every proxy: auth is called as them from now on. Returns the
/// session and the id for the cookie.
pub(crate) async fn open_session(
    sessions: &Arc<WebSessions>,
    certs: Certs,
    key: &russh::keys::PrivateKey,
) -> Result<(Arc<WebSession>, String), ApiError> {
    let internal = |e: &dyn std::fmt::Display| {
        tracing::error!(error = %e, "cannot open a web session");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the proxy could not open the web session",
        )
    };
    let seed = key
        .key_data()
        .ed25519()
        .map(|k| k.private.to_bytes())
        .ok_or_else(|| internal(&"not Ed25519"))?;
    let key_pem =
        sallyport_core::x509::to_pem("PRIVATE KEY", &sallyport_core::x509::ed25519_pkcs8(&seed));
    let expires = time::OffsetDateTime::parse(
        &certs.valid_until,
        &time::format_description::well_known::Rfc3339,
    )
    .map(|t| t.unix_timestamp().max(0) as u64)
    .map_err(|e| internal(&e))?;
    sessions
        .create(Earned {
            user: certs.user,
            roles: certs.roles,
            logins: certs.logins,
            expires,
            valid_until: certs.valid_until,
            cert_chain_pem: certs.tls_cert_pem,
            key_pem,
        })
        .await
        .map_err(|e| match e {
            ClientError::Setup(_) => internal(&e),
            e => from_auth(e),
        })
}

/// `GET /v1/webapi/web/session`: who is signed in, until when, and the CSRF token. Reading it
/// is not activity (a page polling it does not keep the session alive).
pub(crate) async fn session(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    Ok(Json(session_json(&s)).into_response())
}

/// `DELETE /v1/webapi/web/session`: signs out; the session is forgotten and its terminals end.
/// Every proxy's terminals of the session end within seconds (they ask auth every 2 s). A
/// session auth does not know (gone already) is 401 with the cookie removed, and the page says
/// so; auth out of reach is 502 and the session lives on (try again).
pub(crate) async fn logout(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = match web.browser.changing(&headers).await {
        Ok(s) => s,
        Err(e) if e.status == StatusCode::UNAUTHORIZED => {
            let mut resp = e.into_response();
            if let Ok(v) = header::HeaderValue::from_str(&sessions::clear_cookie()) {
                resp.headers_mut().insert(header::SET_COOKIE, v);
            }
            return Ok(resp);
        }
        Err(e) => return Err(e),
    };
    web.browser.sessions.sign_out(&s).await.map_err(from_auth)?;
    let mut resp = Json(serde_json::json!({})).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&sessions::clear_cookie()) {
        resp.headers_mut().insert(header::SET_COOKIE, v);
    }
    Ok(resp)
}

/// One node as the browser lists it. Labels and names come from agents: the page shows them as
/// text, never as HTML.
#[derive(serde::Serialize)]
struct WebNode {
    name: String,
    labels: std::collections::BTreeMap<String, String>,
    /// `online` or `offline` (an agent's tunnel); agentless nodes are `online`.
    status: &'static str,
    /// The logins the roles allow on this node.
    logins: Vec<String>,
}

/// `GET /v1/webapi/nodes`: the nodes the user's current roles reach, asked of auth as the web
/// session's certificate.
pub(crate) async fn nodes(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let nodes = user_nodes(&s).await.map_err(from_auth)?;
    let mut out: Vec<WebNode> = nodes
        .into_iter()
        .filter(|n| n.kind != NodeKind::Kube)
        .map(|n| WebNode {
            name: n.hostname,
            labels: n.labels,
            status: if n.online { "online" } else { "offline" },
            logins: n.logins.unwrap_or_default(),
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(out).into_response())
}

/// The nodes the session's user reaches, as auth says to the session's certificate.
pub async fn user_nodes(s: &WebSession) -> Result<Vec<NodeInfo>, ClientError> {
    s.auth
        .json::<(), Vec<NodeInfo>>(reqwest::Method::GET, auth::NODES, None)
        .await
}

/// Whether auth refused because the user is locked.
pub fn is_locked(e: &ClientError) -> bool {
    matches!(
        e,
        ClientError::Refused {
            code: Some(RefusalCode::Locked),
            ..
        }
    )
}

/// Unknown paths under `/v1/webapi/`: a JSON 404.
pub async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        format!("no such API route: {method} {}", uri.path()),
    )
}

/// A known API route asked with a method it does not answer: a JSON 405.
pub async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} does not answer {method}", uri.path()),
    )
}
