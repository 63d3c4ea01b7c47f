//! Users and their sign-up tokens (`user` rules).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sallyport_core::api::{AddUser, SignupToken, UpdateUser, UserInfo};

use super::{Auth, Caller, done};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    caller: Caller,
) -> Result<Json<Vec<UserInfo>>, AuthError> {
    auth.authorize(&caller, "user", "list").await?;
    Ok(Json(auth.list_users().await?))
}

pub(super) async fn add(
    State(auth): Auth,
    caller: Caller,
    Json(req): Json<AddUser>,
) -> Result<(StatusCode, Json<SignupToken>), AuthError> {
    auth.authorize(&caller, "user", "create").await?;
    Ok((
        StatusCode::CREATED,
        Json(auth.add_user(&req, caller.name()).await?),
    ))
}

pub(super) async fn get(
    State(auth): Auth,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<UserInfo>, AuthError> {
    auth.authorize(&caller, "user", "read").await?;
    Ok(Json(auth.user_info(&name).await?))
}

pub(super) async fn update(
    State(auth): Auth,
    caller: Caller,
    Path(name): Path<String>,
    Json(req): Json<UpdateUser>,
) -> Result<Json<UserInfo>, AuthError> {
    auth.authorize(&caller, "user", "update").await?;
    Ok(Json(auth.update_user(&name, &req, caller.name()).await?))
}

pub(super) async fn remove(
    State(auth): Auth,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.authorize(&caller, "user", "delete").await?;
    auth.remove_user(&name, caller.name()).await?;
    Ok(done())
}

pub(super) async fn reset(
    State(auth): Auth,
    caller: Caller,
    Path(name): Path<String>,
) -> Result<Json<SignupToken>, AuthError> {
    auth.authorize(&caller, "user", "update").await?;
    Ok(Json(auth.reset_user(&name, caller.name()).await?))
}
