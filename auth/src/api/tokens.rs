//! Sign-up and join tokens (`token` rules).

use axum::Json;
use axum::extract::State;
use sallyport_core::api::{AddJoinToken, JoinToken, TokenInfo};

use super::{Allowed, Auth, rule};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    _: Allowed<rule::TokenList>,
) -> Result<Json<Vec<TokenInfo>>, AuthError> {
    Ok(Json(auth.list_tokens().await?))
}

pub(super) async fn add_join_token(
    State(auth): Auth,
    caller: Allowed<rule::TokenCreate>,
    Json(req): Json<AddJoinToken>,
) -> Result<Json<JoinToken>, AuthError> {
    Ok(Json(auth.add_join_token(&req, caller.name()).await?))
}
