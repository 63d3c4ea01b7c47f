//! Sign-up and join tokens (`token` rules).

use axum::Json;
use axum::extract::State;
use sallyport_core::api::{AddJoinToken, JoinToken, TokenInfo};

use super::{Auth, Caller};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    caller: Caller,
) -> Result<Json<Vec<TokenInfo>>, AuthError> {
    auth.authorize(&caller, "token", "list").await?;
    Ok(Json(auth.list_tokens().await?))
}

pub(super) async fn add_join_token(
    State(auth): Auth,
    caller: Caller,
    Json(req): Json<AddJoinToken>,
) -> Result<Json<JoinToken>, AuthError> {
    auth.authorize(&caller, "token", "create").await?;
    Ok(Json(auth.add_join_token(&req, caller.name()).await?))
}
