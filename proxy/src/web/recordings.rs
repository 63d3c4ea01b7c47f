//! Recorded sessions for the browser's player: the list (the scope of `sally recordings ls`:
//! everyone's for whom may list events, otherwise one's own), one session's record with its
//! recording's size, and the asciicast itself, streamed from auth as it arrives — never held
//! whole: a recording may be as large as `max_recording_size` (a GiB by default).
//!
//! Every answer is auth's, asked as the web session's own certificate, so the user's current
//! roles and locks decide; another user's session is auth's 403.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::{SessionDetail, SessionInfo};
use sallyport_core::routes::auth;

use super::browser::{ApiError, from_auth};

type Web = State<Arc<super::Web>>;

/// A recording's media type, as auth serves it.
pub const ASCIICAST: &str = "application/x-asciicast";

/// `GET /v1/webapi/recordings`: the sessions the user may replay, oldest first.
pub(crate) async fn list(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let list: Vec<SessionInfo> = s
        .auth
        .json::<(), _>(reqwest::Method::GET, auth::SESSIONS, None)
        .await
        .map_err(from_auth)?;
    Ok(Json(list).into_response())
}

/// `GET /v1/webapi/recordings/{id}`: one session's record and `recording_size` (bytes now).
pub(crate) async fn get(
    State(web): Web,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let detail: SessionDetail = s
        .auth
        .json::<(), _>(reqwest::Method::GET, &auth::session(&id), None)
        .await
        .map_err(from_auth)?;
    Ok(Json(detail).into_response())
}

/// `GET /v1/webapi/recordings/{id}/cast`: the asciicast, passed on chunk by chunk as auth
/// sends it (the proxy holds one chunk at a time; a browser that reads slowly slows auth's
/// read of the file, nothing piles up here).
pub(crate) async fn cast(
    State(web): Web,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let upstream = s
        .auth
        .stream(&auth::session_recording(&id))
        .await
        .map_err(from_auth)?;
    let mut resp = Body::from_stream(chunks(upstream)).into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(ASCIICAST));
    Ok(resp)
}

/// An answer of auth's as a stream of its chunks; a failure mid-way ends the stream with an
/// error (the browser sees a cut answer, never a made-up end).
pub(crate) fn chunks(
    resp: reqwest::Response,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send {
    futures::stream::unfold(Some(resp), |resp| async move {
        let mut resp = resp?;
        match resp.chunk().await {
            Ok(Some(b)) => Some((Ok(b), Some(resp))),
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(error = %e, "an answer streamed from auth was cut");
                Some((Err(std::io::Error::other(e)), None))
            }
        }
    })
}
