//! The audit log (`event` rules) and the failed authentications proxies report for their doors.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use sallyport_core::api::{AuditQuery, AuditVerify, AuthFailure};

use super::{Allowed, Auth, Proxy, done, rule};
use crate::AuthError;

pub(super) async fn search(
    State(auth): Auth,
    _: Allowed<rule::EventList>,
    Query(q): Query<AuditQuery>,
) -> Result<(HeaderMap, Json<Vec<serde_json::Value>>), AuthError> {
    let found = auth.audit_search(&q).await?;
    // Beside the body, which stays the plain list of records older clients read.
    let mut headers = HeaderMap::new();
    if let Some(seq) = found.unanchored_from {
        headers.insert(
            HeaderName::from_static(sallyport_core::audit::UNANCHORED_HEADER),
            HeaderValue::from(seq),
        );
    }
    Ok((headers, Json(found.records)))
}

pub(super) async fn verify(
    State(auth): Auth,
    _: Allowed<rule::EventRead>,
) -> Result<Json<AuditVerify>, AuthError> {
    Ok(Json(auth.audit_verify().await?))
}

/// Failed authentications the proxy saw at its SSH and tunnel doors, in batches.
pub(super) async fn auth_failures(
    State(auth): Auth,
    _proxy: Proxy,
    Json(batch): Json<Vec<AuthFailure>>,
) -> Result<Json<serde_json::Value>, AuthError> {
    // The report's shape is checked whole before any of it counts.
    if batch.len() > crate::failures::MAX_BATCH {
        return Err(AuthError::BadRequest(format!(
            "at most {} failures per report",
            crate::failures::MAX_BATCH
        )));
    }
    if let Some(f) = batch
        .iter()
        .find(|f| !matches!(f.door.as_str(), "ssh" | "tunnel"))
    {
        return Err(AuthError::BadRequest(format!(
            "unknown door {:?}: ssh or tunnel",
            f.door
        )));
    }
    for f in &batch {
        // A proxy's count of the reports its full queue dropped stands for that many.
        auth.auth_failed_times(crate::failures::Failure::reported(f), f.count.unwrap_or(1))
            .await;
    }
    Ok(done())
}
