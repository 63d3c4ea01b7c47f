//! Browsers' web sessions and SSO sign-ins in progress, for the proxies that serve browsers
//! (`Proxy` callers only): every proxy behind a load balancer finds here what another opened.

use axum::Json;
use axum::extract::{Path, State};
use sallyport_core::api::{
    WebSessionCheck, WebSessionCreated, WebSessionEnding, WebSessionRecord, WebSessionState,
    WebSessionTouch, WebSsoPending,
};

use super::{Auth, Proxy, done};
use crate::AuthError;

pub(super) async fn create(
    State(auth): Auth,
    proxy: Proxy,
    Json(s): Json<WebSessionRecord>,
) -> Result<Json<WebSessionCreated>, AuthError> {
    Ok(Json(auth.create_web_session(&proxy.name, &s).await?))
}

pub(super) async fn get(
    State(auth): Auth,
    _: Proxy,
    Path(hash): Path<String>,
) -> Result<Json<WebSessionRecord>, AuthError> {
    Ok(Json(auth.web_session(&hash).await?))
}

pub(super) async fn touch(
    State(auth): Auth,
    _: Proxy,
    Path(hash): Path<String>,
    Json(t): Json<WebSessionTouch>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.touch_web_session(&hash, t.last_input_ms).await?;
    Ok(done())
}

pub(super) async fn end(
    State(auth): Auth,
    _: Proxy,
    Path(hash): Path<String>,
    Json(why): Json<WebSessionEnding>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.end_web_session(&hash, &why).await?;
    Ok(done())
}

pub(super) async fn check(
    State(auth): Auth,
    _: Proxy,
    Json(c): Json<WebSessionCheck>,
) -> Result<Json<Vec<WebSessionState>>, AuthError> {
    Ok(Json(auth.check_web_sessions(&c.id_hashes).await?))
}

pub(super) async fn put_sso(
    State(auth): Auth,
    _: Proxy,
    Json(p): Json<WebSsoPending>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.put_web_sso(&p).await?;
    Ok(done())
}

pub(super) async fn get_sso(
    State(auth): Auth,
    _: Proxy,
    Path(hash): Path<String>,
) -> Result<Json<WebSsoPending>, AuthError> {
    Ok(Json(auth.web_sso(&hash).await?))
}

pub(super) async fn remove_sso(
    State(auth): Auth,
    _: Proxy,
    Path(hash): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.remove_web_sso(&hash).await?;
    Ok(done())
}
