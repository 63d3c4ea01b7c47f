//! Locks (`lock` rules). Proxies read them too, to refuse and disconnect locked users at their
//! doors.

use axum::Json;
use axum::extract::{Path, State};
use sallyport_core::api::{AddLock, LockInfo};

use super::{Allowed, Auth, Caller, done, rule};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    caller: Caller,
) -> Result<Json<Vec<LockInfo>>, AuthError> {
    // Proxies poll the locks to refuse and disconnect locked users at the SSH door.
    if !caller.is_proxy() {
        auth.authorize(&caller, "lock", "list").await?;
    }
    Ok(Json(auth.list_locks().await?))
}

pub(super) async fn add(
    State(auth): Auth,
    caller: Allowed<rule::LockCreate>,
    Json(req): Json<AddLock>,
) -> Result<Json<LockInfo>, AuthError> {
    Ok(Json(auth.add_lock(&req, caller.name()).await?))
}

pub(super) async fn remove(
    State(auth): Auth,
    caller: Allowed<rule::LockDelete>,
    Path(id): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.remove_lock(&id, caller.name()).await?;
    Ok(done())
}
