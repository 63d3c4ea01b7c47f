//! The cluster as a whole: ping (anyone the handshake verified), status (`read` on `cluster`)
//! and the CAs' public halves.

use axum::Json;
use axum::extract::{Path, State};
use sallyport_core::api::{CaExport, Ping, Status};
use sallyport_core::ca::CaKind;

use super::{Allowed, Auth, Caller, rule};
use crate::AuthError;

pub(super) async fn ping(State(auth): Auth) -> Result<Json<Ping>, AuthError> {
    let mut p = auth.ping();
    // Every `sally ssh` pings (for the SSH port): names only, no connector specs read.
    p.auth_connectors = auth.connector_names().await?;
    p.local_users = auth.has_local_users().await?;
    Ok(Json(p))
}

pub(super) async fn status(
    State(auth): Auth,
    _: Allowed<rule::ClusterRead>,
) -> Result<Json<Status>, AuthError> {
    Ok(Json(auth.status().await?))
}

/// CA public keys are public: any caller the handshake verified may read them.
pub(super) async fn export_ca(
    State(auth): Auth,
    _caller: Caller,
    Path(kind): Path<String>,
) -> Result<Json<CaExport>, AuthError> {
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
