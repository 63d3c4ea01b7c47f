//! Users and their sign-up tokens (`user` rules).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sallyport_core::api::{AddUser, SignupToken, UpdateUser, UserInfo};

use super::{Allowed, Auth, done, rule};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    _: Allowed<rule::UserList>,
) -> Result<Json<Vec<UserInfo>>, AuthError> {
    Ok(Json(auth.list_users().await?))
}

pub(super) async fn add(
    State(auth): Auth,
    caller: Allowed<rule::UserCreate>,
    Json(req): Json<AddUser>,
) -> Result<(StatusCode, Json<SignupToken>), AuthError> {
    Ok((
        StatusCode::CREATED,
        Json(auth.add_user(&req, caller.name()).await?),
    ))
}

pub(super) async fn get(
    State(auth): Auth,
    _: Allowed<rule::UserRead>,
    Path(name): Path<String>,
) -> Result<Json<UserInfo>, AuthError> {
    Ok(Json(auth.user_info(&name).await?))
}

pub(super) async fn update(
    State(auth): Auth,
    caller: Allowed<rule::UserUpdate>,
    Path(name): Path<String>,
    Json(req): Json<UpdateUser>,
) -> Result<Json<UserInfo>, AuthError> {
    Ok(Json(auth.update_user(&name, &req, caller.name()).await?))
}

pub(super) async fn remove(
    State(auth): Auth,
    caller: Allowed<rule::UserDelete>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.remove_user(&name, caller.name()).await?;
    Ok(done())
}

pub(super) async fn reset(
    State(auth): Auth,
    caller: Allowed<rule::UserUpdate>,
    Path(name): Path<String>,
) -> Result<Json<SignupToken>, AuthError> {
    Ok(Json(auth.reset_user(&name, caller.name()).await?))
}
