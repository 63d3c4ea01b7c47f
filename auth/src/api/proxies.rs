//! Proxy services: the join (a token, no certificate yet), renewals and heartbeats (the proxy's
//! own certificate, for its own id only), and what admins list and remove (`proxy` rules).

use axum::extract::{Path, State};
use axum::{Extension, Json};
use sallyport_core::api::{
    PresenceRefresh, PresenceRefreshed, ProxyHeartbeat, ProxyInfo, ProxyJoinRequest, ProxyJoined,
};
use sallyport_core::https::RemoteAddr;

use super::{Allowed, Auth, Proxy, done, rule};
use crate::AuthError;

pub(super) async fn join(
    State(auth): Auth,
    remote: Option<Extension<RemoteAddr>>,
    Json(req): Json<ProxyJoinRequest>,
) -> Result<Json<ProxyJoined>, AuthError> {
    let remote = remote.map(|r| r.0.0.ip().to_string()).unwrap_or_default();
    Ok(Json(auth.join_proxy(&req, &remote).await?))
}

/// A proxy speaks for itself only.
fn itself(proxy: &Proxy, id: &str) -> Result<(), AuthError> {
    if proxy.name == id {
        Ok(())
    } else {
        Err(AuthError::AccessDenied(format!(
            "proxy {} cannot act as proxy {id}",
            proxy.name
        )))
    }
}

pub(super) async fn renew(
    State(auth): Auth,
    proxy: Proxy,
    Path(id): Path<String>,
    Json(req): Json<ProxyJoinRequest>,
) -> Result<Json<ProxyJoined>, AuthError> {
    itself(&proxy, &id)?;
    Ok(Json(auth.renew_proxy(&id, &req).await?))
}

pub(super) async fn heartbeat(
    State(auth): Auth,
    proxy: Proxy,
    Path(id): Path<String>,
    Json(hb): Json<ProxyHeartbeat>,
) -> Result<Json<Vec<ProxyInfo>>, AuthError> {
    itself(&proxy, &id)?;
    Ok(Json(auth.proxy_heartbeat(&id, &hb).await?))
}

/// The presence of the agents a proxy still holds tunnels of, refreshed in one request.
pub(super) async fn presence(
    State(auth): Auth,
    proxy: Proxy,
    Path(id): Path<String>,
    Json(req): Json<PresenceRefresh>,
) -> Result<Json<PresenceRefreshed>, AuthError> {
    itself(&proxy, &id)?;
    Ok(Json(PresenceRefreshed {
        unknown: auth.presence_refresh(&id, &req.nodes).await?,
    }))
}

pub(super) async fn list(
    State(auth): Auth,
    _: Allowed<rule::ProxyList>,
) -> Result<Json<Vec<ProxyInfo>>, AuthError> {
    Ok(Json(auth.list_proxies().await?))
}

pub(super) async fn remove(
    State(auth): Auth,
    caller: Allowed<rule::ProxyDelete>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.remove_proxy(&name, caller.name()).await?;
    Ok(done())
}
