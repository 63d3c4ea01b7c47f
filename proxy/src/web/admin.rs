//! The admin pages' API: users (with their locks), sign-up links, locks, join tokens — what
//! `sallyctl users`, `lock`, `rm lock/ID` and `tokens` do, through the same auth routes, asked
//! as the web session's own certificate: auth decides from the caller's current roles (a
//! plain user gets auth's 403, said).
//!
//! Secrets are shown once and never kept or logged here: a sign-up token only inside the link
//! `https://HOST:PORT/web/signup#TOKEN` (the fragment never reaches a server log or a Referer),
//! a join token only inside the agent's command. HOST:PORT is the proxy's own origin the
//! request came from (checked exact before anything else).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::{
    AddJoinToken, AddLock, AddUser, JoinToken, LockInfo, SignupToken, Status, TokenInfo, TokenKind,
    UserInfo,
};
use sallyport_core::routes::auth;
use serde::Deserialize;

use super::browser::{ApiError, from_auth, json_body};
use super::sessions::WebSession;

type Web = State<Arc<super::Web>>;

/// The request's `Origin`, already checked to be one of the proxy's own by `changing`.
fn origin(headers: &HeaderMap) -> String {
    headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn get<T: serde::de::DeserializeOwned>(s: &WebSession, path: &str) -> Result<T, ApiError> {
    s.auth
        .json::<(), T>(reqwest::Method::GET, path, None)
        .await
        .map_err(from_auth)
}

async fn send<B: serde::Serialize, T: serde::de::DeserializeOwned>(
    s: &WebSession,
    method: reqwest::Method,
    path: &str,
    body: Option<&B>,
) -> Result<T, ApiError> {
    s.auth.json(method, path, body).await.map_err(from_auth)
}

fn ttl(name: &str, text: Option<&str>) -> Result<Option<u64>, ApiError> {
    text.filter(|t| !t.is_empty())
        .map(|t| {
            sallyport_core::duration::parse(t)
                .map(|d| d.as_secs())
                .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, format!("{name}: {e}")))
        })
        .transpose()
}

/// `GET /v1/webapi/users`: `[{name, type, roles, logins, status, locked, locks: [{id,
/// message, expires}], login_locked_until}]` — `locked` when a lock or too many failed logins
/// keep the user out.
pub(crate) async fn users(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let users: Vec<UserInfo> = get(&s, auth::USERS).await?;
    let locks: Vec<LockInfo> = get(&s, auth::LOCKS).await?;
    let mut by_user: BTreeMap<&str, Vec<serde_json::Value>> = BTreeMap::new();
    for l in &locks {
        by_user
            .entry(l.user.as_str())
            .or_default()
            .push(serde_json::json!({"id": l.id, "message": l.message, "expires": l.expires}));
    }
    let out: Vec<serde_json::Value> = users
        .iter()
        .map(|u| {
            let locks = by_user.get(u.name.as_str()).cloned().unwrap_or_default();
            serde_json::json!({
                "name": u.name,
                "type": u.user_type,
                "roles": u.roles,
                "logins": u.traits.get("internal.logins").cloned().unwrap_or_default(),
                "status": u.status,
                "locked": !locks.is_empty() || u.locked_until.is_some(),
                "locks": locks,
                "login_locked_until": u.locked_until,
            })
        })
        .collect();
    Ok(Json(out).into_response())
}

/// A sign-up token as the page shows it, once: the link, and when it stops working.
fn signup_link(headers: &HeaderMap, t: &SignupToken) -> Response {
    Json(serde_json::json!({
        "user": t.user,
        "expires": t.expires,
        "signup_url": format!("{}/web/signup#{}", origin(headers), t.token),
    }))
    .into_response()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewUser {
    name: String,
    roles: Vec<String>,
    #[serde(default)]
    logins: Vec<String>,
}

/// `POST /v1/webapi/users` `{name, roles, logins}`: `{user, expires, signup_url}`.
pub(crate) async fn add_user(
    State(web): Web,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let new: NewUser = json_body(&headers, body).await?;
    let t: SignupToken = send(
        &s,
        reqwest::Method::POST,
        auth::USERS,
        Some(&AddUser {
            name: new.name,
            roles: new.roles,
            logins: new.logins,
        }),
    )
    .await?;
    Ok(signup_link(&headers, &t))
}

/// `POST /v1/webapi/users/{name}/reset`: clears the password and authenticator;
/// `{user, expires, signup_url}`.
pub(crate) async fn reset_user(
    State(web): Web,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let t: SignupToken =
        send::<(), _>(&s, reqwest::Method::POST, &auth::user_reset(&name), None).await?;
    Ok(signup_link(&headers, &t))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewLock {
    user: String,
    #[serde(default)]
    message: Option<String>,
    /// A duration (`30m`, `8h`); none locks until the lock is removed.
    #[serde(default)]
    ttl: Option<String>,
}

/// `POST /v1/webapi/locks` `{user, message?, ttl?}`: the lock (`{id, user, message, expires,
/// created_by, created}`). The user's web sessions and connections end within the 2 s poll.
pub(crate) async fn add_lock(
    State(web): Web,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let new: NewLock = json_body(&headers, body).await?;
    let lock: LockInfo = send(
        &s,
        reqwest::Method::POST,
        auth::LOCKS,
        Some(&AddLock {
            user: new.user,
            message: new.message.filter(|m| !m.is_empty()),
            ttl_secs: ttl("ttl", new.ttl.as_deref())?,
        }),
    )
    .await?;
    Ok(Json(lock).into_response())
}

/// `DELETE /v1/webapi/locks/{id}`: `{}`.
pub(crate) async fn remove_lock(
    State(web): Web,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let _: serde_json::Value =
        send::<(), _>(&s, reqwest::Method::DELETE, &auth::lock(&id), None).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// `GET /v1/webapi/tokens`: the pending tokens (`[{type, user, expires}]`, never a secret).
pub(crate) async fn tokens(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let list: Vec<TokenInfo> = get(&s, auth::TOKENS).await?;
    Ok(Json(list).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewToken {
    #[serde(rename = "type")]
    kind: TokenKind,
    /// A duration, `30m` when none.
    #[serde(default)]
    ttl: Option<String>,
}

/// `POST /v1/webapi/tokens` `{type: node|kube, ttl?}`: `{type, expires, command}`, the
/// command an agent starts with (as `sallyctl tokens add` prints it), shown once.
pub(crate) async fn add_token(
    State(web): Web,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let new: NewToken = json_body(&headers, body).await?;
    if new.kind == TokenKind::Signup {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "type: node or kube (a sign-up token comes with a new user or a reset)",
        ));
    }
    let ttl_secs = ttl("ttl", new.ttl.as_deref())?.unwrap_or(30 * 60);
    let t: JoinToken = send(
        &s,
        reqwest::Method::POST,
        auth::JOIN_TOKENS,
        Some(&AddJoinToken {
            kind: new.kind,
            ttl_secs,
        }),
    )
    .await?;
    let status: Status = get(&s, auth::STATUS).await?;
    let pin = status.ca_pins.first().cloned().unwrap_or_default();
    let origin = origin(&headers);
    let proxy = origin.strip_prefix("https://").unwrap_or(&origin);
    let command = match new.kind {
        TokenKind::Kube => format!(
            "sallyport start --roles=kube --proxy={proxy} --token={} --ca-pin={pin} --data-dir /var/lib/sallyport --kube-cluster NAME --kubeconfig FILE --labels env=dev",
            t.token
        ),
        _ => format!(
            "sallyport start --roles=node --proxy={proxy} --token={} --ca-pin={pin} --data-dir /var/lib/sallyport --labels env=dev",
            t.token
        ),
    };
    Ok(Json(serde_json::json!({
        "type": new.kind,
        "expires": t.expires,
        "command": command,
    }))
    .into_response())
}
