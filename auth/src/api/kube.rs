//! Kubernetes access: the clusters a person reaches (`kube_cluster` rules for admins who see
//! them all), kubeconfig certificates, and what the proxy's kube door asks and reports.

use axum::extract::State;
use axum::{Extension, Json};
use sallyport_core::api::{
    KubeAccess, KubeAccessRequest, KubeCert, KubeCertRequest, KubeClusterInfo, KubeRecord,
};
use sallyport_core::https::PeerCertificates;

use super::{Auth, Caller, Proxy, done};
use crate::AuthError;

pub(super) async fn clusters(
    State(auth): Auth,
    caller: Caller,
) -> Result<Json<Vec<KubeClusterInfo>>, AuthError> {
    if auth
        .authorize(&caller, "kube_cluster", "list")
        .await
        .is_ok()
    {
        return Ok(Json(auth.kube_clusters_for(None).await?));
    }
    match &caller {
        Caller::User { roles, traits, .. } => {
            let set = auth.role_set(roles, traits).await?;
            Ok(Json(auth.kube_clusters_for(Some(&set)).await?))
        }
        _ => Err(AuthError::AccessDenied(format!(
            "{} cannot list Kubernetes clusters",
            caller.name()
        ))),
    }
}

/// A person's kubeconfig certificate: over the key of the certificate they called with, and
/// expiring with it, so it outlives no login.
pub(super) async fn cert(
    State(auth): Auth,
    caller: Caller,
    Extension(peer): Extension<PeerCertificates>,
    Json(req): Json<KubeCertRequest>,
) -> Result<Json<KubeCert>, AuthError> {
    let Caller::User { name, .. } = &caller else {
        return Err(AuthError::AccessDenied(format!(
            "{} is not a person: only people get kubeconfig certificates",
            caller.name()
        )));
    };
    let leaf = peer
        .0
        .first()
        .ok_or_else(|| AuthError::Unauthenticated("a client certificate is required".into()))?;
    let (spki, not_after) = sallyport_core::x509::spki_and_expiry(leaf)
        .map_err(|e| AuthError::Unauthenticated(e.to_string()))?;
    Ok(Json(
        auth.kube_cert(name, &req.cluster, &spki, not_after).await?,
    ))
}

pub(super) async fn access(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<KubeAccessRequest>,
) -> Result<Json<KubeAccess>, AuthError> {
    Ok(Json(auth.kube_access(&req).await?))
}

pub(super) async fn requests(
    State(auth): Auth,
    _proxy: Proxy,
    Json(records): Json<Vec<KubeRecord>>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.kube_records(&records).await?;
    Ok(done())
}
