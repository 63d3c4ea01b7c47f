//! Nodes (`node` rules for people), and what the proxy reports for them: joins, presence from
//! their tunnels, the host certificates it serves under their names, agentless host keys.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sallyport_core::api::{AddNode, JoinRequest, Joined, NodeInfo, Presence};
use serde::Deserialize;

use super::{Allowed, Auth, Caller, Proxy, done, rule};
use crate::AuthError;
use crate::access::with_node_labels;

pub(super) async fn list(
    State(auth): Auth,
    caller: Caller,
) -> Result<Json<Vec<NodeInfo>>, AuthError> {
    let nodes = auth.list_nodes().await?;
    // Admins with `list` on `node` see every node; everyone else sees what their roles reach.
    let sees_all = auth.authorize(&caller, "node", "list").await.is_ok();
    match &caller {
        Caller::User { roles, traits, .. } => {
            let set = auth.role_set(roles, traits).await?;
            let logins = set.logins();
            let mut listed = Vec::with_capacity(nodes.len());
            for mut n in nodes {
                // Shown, and what a login chooser may offer on it: the decision a session
                // grant makes.
                let allowed = with_node_labels(&mut n, |labels| {
                    (sees_all || set.can_see_node(labels)).then(|| {
                        logins
                            .iter()
                            .filter(|l| set.allows_node(l, labels))
                            .cloned()
                            .collect()
                    })
                });
                if allowed.is_some() {
                    n.logins = allowed;
                    listed.push(n);
                }
            }
            Ok(Json(listed))
        }
        _ if sees_all => Ok(Json(nodes)),
        _ => Err(AuthError::AccessDenied(format!(
            "{} cannot list nodes",
            caller.name()
        ))),
    }
}

pub(super) async fn add(
    State(auth): Auth,
    caller: Allowed<rule::NodeCreate>,
    Json(req): Json<AddNode>,
) -> Result<(StatusCode, Json<NodeInfo>), AuthError> {
    Ok((
        StatusCode::CREATED,
        Json(auth.add_node(&req, caller.name()).await?),
    ))
}

pub(super) async fn remove(
    State(auth): Auth,
    caller: Allowed<rule::NodeDelete>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.remove_node(&name, caller.name()).await?;
    Ok(done())
}

pub(super) async fn join(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<JoinRequest>,
) -> Result<Json<Joined>, AuthError> {
    let remote = req.remote_addr.clone().unwrap_or_default();
    Ok(Json(auth.join(&req, &remote).await?))
}

pub(super) async fn presence(
    State(auth): Auth,
    proxy: Proxy,
    Path(id): Path<String>,
    Json(p): Json<Presence>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.presence(&id, &proxy.name, &p).await?;
    Ok(done())
}

#[derive(Deserialize)]
pub(super) struct PublicKeyBody {
    public_key: String,
}

pub(super) async fn proxy_host_cert(
    State(auth): Auth,
    _proxy: Proxy,
    Path(name): Path<String>,
    Json(b): Json<PublicKeyBody>,
) -> Result<Json<serde_json::Value>, AuthError> {
    let cert = auth.proxy_host_cert(&name, &b.public_key).await?;
    let node = auth
        .find_node(&name)
        .await?
        .ok_or_else(|| AuthError::NotFound(format!("node {name} is not registered")))?;
    Ok(Json(serde_json::json!({"cert": cert, "node": node})))
}

#[derive(Deserialize)]
pub(super) struct HostKeyBody {
    host_key: String,
}

/// Trust on first use for agentless nodes: the first host key the proxy sees is pinned, and
/// the pinned key is returned every time after.
pub(super) async fn pin_host_key(
    State(auth): Auth,
    _proxy: Proxy,
    Path(id): Path<String>,
    Json(b): Json<HostKeyBody>,
) -> Result<Json<serde_json::Value>, AuthError> {
    Ok(Json(
        serde_json::json!({"host_key": auth.pin_host_key(&id, &b.host_key).await?}),
    ))
}

/// An agent's certificates renewed, asked by the proxy its tunnel is to.
pub(super) async fn renew(
    State(auth): Auth,
    proxy: Proxy,
    Path(id): Path<String>,
    Json(req): Json<sallyport_core::api::RenewRequest>,
) -> Result<Json<sallyport_core::api::Renewed>, AuthError> {
    Ok(Json(auth.renew_node(&id, &proxy.name, &req).await?))
}
