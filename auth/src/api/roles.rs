//! Roles (`role` rules) and the access check that explains what the doors would decide.

use axum::Json;
use axum::extract::{Path, State};
use sallyport_core::api::{AccessCheck, PutRole, PutRoleResult};
use sallyport_core::role::{Decision, Role};

use super::{Allowed, Auth, done, rule};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    _: Allowed<rule::RoleList>,
) -> Result<Json<Vec<Role>>, AuthError> {
    Ok(Json(auth.list_roles().await?))
}

pub(super) async fn get(
    State(auth): Auth,
    _: Allowed<rule::RoleRead>,
    Path(name): Path<String>,
) -> Result<Json<Role>, AuthError> {
    let role = auth
        .get_role(&name)
        .await?
        .ok_or_else(|| AuthError::NotFound(format!("role {name} does not exist")))?;
    Ok(Json(role))
}

pub(super) async fn put(
    State(auth): Auth,
    caller: Allowed<rule::RoleCreate>,
    Json(req): Json<PutRole>,
) -> Result<Json<PutRoleResult>, AuthError> {
    if req.overwrite || req.revision.is_some() {
        auth.authorize(&caller, "role", "update").await?;
    }
    if let Some(revision) = &req.revision {
        auth.replace_role(&req.role, revision, caller.name())
            .await?;
        return Ok(Json(PutRoleResult {
            name: req.role.metadata.name.clone(),
            created: false,
        }));
    }
    let created = auth
        .put_role(&req.role, req.overwrite, caller.name())
        .await?;
    Ok(Json(PutRoleResult {
        name: req.role.metadata.name.clone(),
        created,
    }))
}

pub(super) async fn delete(
    State(auth): Auth,
    caller: Allowed<rule::RoleDelete>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.delete_role(&name, caller.name()).await?;
    Ok(done())
}

/// Reads a user's roles against a resource: `read` on both `role` and `user`.
pub(super) async fn access_check(
    State(auth): Auth,
    caller: Allowed<rule::RoleRead>,
    Json(req): Json<AccessCheck>,
) -> Result<Json<Decision>, AuthError> {
    auth.authorize(&caller, "user", "read").await?;
    Ok(Json(auth.access_check(&req).await?))
}
