//! Sessions: the grants, checks and reports the proxy makes for them, and what people may list
//! and replay (everyone's with `list` on `event`, otherwise their own with `list` on `session`).

use axum::Json;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::{
    GrantCheck, SessionDetail, SessionEnd, SessionEvent, SessionGrant, SessionInfo, SessionKind,
    SessionRequest,
};

use super::{Auth, Caller, Proxy, done};
use crate::{AuthError, AuthServer};

pub(super) async fn grant(
    State(auth): Auth,
    proxy: Proxy,
    Json(req): Json<SessionRequest>,
) -> Result<Json<SessionGrant>, AuthError> {
    Ok(Json(auth.session_grant(&req, &proxy.name).await?))
}

/// A proxy's registered connections that closed (`max_connections` across proxies): only its
/// own, as its certificate says.
pub(super) async fn connections_closed(
    State(auth): Auth,
    proxy: Proxy,
    Json(closed): Json<sallyport_core::api::ClosedConnections>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.connections_closed(&proxy.name, &closed).await?;
    Ok(done())
}

pub(super) async fn end(
    State(auth): Auth,
    _proxy: Proxy,
    Path(id): Path<String>,
    Json(end): Json<SessionEnd>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.session_end(&id, &end).await?;
    Ok(done())
}

/// The proxy checks a running session's grant again (a forward's new connection).
pub(super) async fn check(
    State(auth): Auth,
    _proxy: Proxy,
    Path(id): Path<String>,
) -> Result<Json<GrantCheck>, AuthError> {
    Ok(Json(auth.session_check(&id).await?))
}

pub(super) async fn update(
    State(auth): Auth,
    _proxy: Proxy,
    Path(id): Path<String>,
    Json(end): Json<SessionEnd>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.session_update(
        &id,
        end.kind.unwrap_or(SessionKind::Shell),
        end.command.as_deref(),
    )
    .await?;
    Ok(done())
}

pub(super) async fn events(
    State(auth): Auth,
    _proxy: Proxy,
    Path(id): Path<String>,
    Json(events): Json<Vec<SessionEvent>>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.session_events(&id, &events).await?;
    Ok(done())
}

/// Whose sessions `caller` may see: everyone's with `list` on `event` (auditors, editors),
/// otherwise only their own, with `list` on `session`.
async fn scope(auth: &AuthServer, caller: &Caller) -> Result<Option<String>, AuthError> {
    if auth.authorize(caller, "event", "list").await.is_ok() {
        return Ok(None);
    }
    auth.authorize(caller, "session", "list").await?;
    Ok(Some(caller.name().to_string()))
}

pub(super) async fn list(
    State(auth): Auth,
    caller: Caller,
) -> Result<Json<Vec<SessionInfo>>, AuthError> {
    let scope = scope(&auth, &caller).await?;
    Ok(Json(auth.list_sessions(scope.as_deref()).await?))
}

/// One session's record and its recording's size, for whom may replay it (the scope of
/// [`list`]; another user's session is a 403, as its recording is).
pub(super) async fn get(
    State(auth): Auth,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Json<SessionDetail>, AuthError> {
    let scope = scope(&auth, &caller).await?;
    Ok(Json(auth.session_detail(&id, scope.as_deref()).await?))
}

pub(super) async fn recording(
    State(auth): Auth,
    caller: Caller,
    Path(id): Path<String>,
) -> Result<Response, AuthError> {
    let scope = scope(&auth, &caller).await?;
    let stream = auth.open_recording(&id, scope.as_deref()).await?;
    // Streamed as it is read: a recording may be as large as `max_recording_size` (a GiB by
    // default), and auth must not hold one, let alone several, in memory.
    let body = axum::body::Body::from_stream(stream);
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/x-asciicast")],
        body,
    )
        .into_response())
}
