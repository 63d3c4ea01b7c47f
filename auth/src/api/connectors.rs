//! Single sign-on connectors (`connector` rules).

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use sallyport_core::api::{PutConnector, PutRoleResult};
use sallyport_core::oidc::OidcConnector;

use super::{Allowed, Auth, done, rule};
use crate::AuthError;

pub(super) async fn list(
    State(auth): Auth,
    _: Allowed<rule::ConnectorList>,
) -> Result<Json<Vec<OidcConnector>>, AuthError> {
    Ok(Json(auth.list_connectors().await?))
}

pub(super) async fn put(
    State(auth): Auth,
    caller: Allowed<rule::ConnectorCreate>,
    Json(req): Json<PutConnector>,
) -> Result<(StatusCode, Json<PutRoleResult>), AuthError> {
    if req.overwrite {
        auth.authorize(&caller, "connector", "update").await?;
    }
    let created = auth
        .put_connector(&req.connector, req.overwrite, caller.name())
        .await?;
    Ok((
        if created {
            StatusCode::CREATED
        } else {
            StatusCode::OK
        },
        Json(PutRoleResult {
            name: req.connector.metadata.name.clone(),
            created,
        }),
    ))
}

pub(super) async fn remove(
    State(auth): Auth,
    caller: Allowed<rule::ConnectorDelete>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AuthError> {
    auth.remove_connector(&name, caller.name()).await?;
    Ok(done())
}
