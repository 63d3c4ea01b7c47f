//! Sign-up, local login and the SSO flow: what the proxy forwards for people who hold no
//! certificate yet, so every route here takes a [`Proxy`] caller.

use axum::Json;
use axum::extract::State;
use axum::response::Response;
use sallyport_core::api::{Certs, LoginRequest, SignupFinish, SignupStart};

use super::{Auth, Forwarded, Proxy, for_client};
use crate::AuthError;
use crate::oidc::{OidcCallback, OidcFinish, OidcRedirect, OidcStart, OidcStarted};

pub(super) async fn signup_start(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<Forwarded<SignupStart>>,
) -> Response {
    for_client(auth.signup_start(&req.body).await, req.remote_addr)
}

pub(super) async fn signup_finish(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<Forwarded<SignupFinish>>,
) -> Response {
    let done = auth
        .signup_finish(&req.body, req.remote_addr.as_deref().unwrap_or(""))
        .await
        .map(|()| serde_json::json!({}));
    for_client(done, req.remote_addr)
}

pub(super) async fn login(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<LoginRequest>,
) -> Result<Json<Certs>, AuthError> {
    let remote = req.remote_addr.clone().unwrap_or_default();
    Ok(Json(auth.login(&req, &remote).await?))
}

pub(super) async fn oidc_start(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<OidcStart>,
) -> Result<Json<OidcStarted>, AuthError> {
    Ok(Json(auth.oidc_start(&req).await?))
}

pub(super) async fn oidc_callback(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<OidcCallback>,
) -> Result<Json<OidcRedirect>, AuthError> {
    Ok(Json(auth.oidc_callback(&req).await?))
}

pub(super) async fn oidc_finish(
    State(auth): Auth,
    _proxy: Proxy,
    Json(req): Json<OidcFinish>,
) -> Result<Json<Certs>, AuthError> {
    Ok(Json(auth.oidc_finish(&req).await?))
}
