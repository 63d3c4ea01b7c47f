//! The role editor's backend: roles as YAML text in JSON, checked where they are wrong, and
//! saved only over the revision the editor opened.
//!
//! Reading and writing are auth's to allow (`role` rules), asked as the web session's own
//! certificate. Checking a text is the pure `core::resource::parse_role` (the same reading
//! `sallyctl create` does), so the editor marks an error at the line and column of the value
//! it is about. A save sends the revision (`Role::revision`) that `GET` gave; auth swaps only
//! if the stored role still has it, else 409.

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::{PutRole, PutRoleResult};
use sallyport_core::role::Role;
use sallyport_core::routes::auth;
use sallyport_core::yaml::Problem;
use serde::Deserialize;

use super::browser::{ApiError, from_auth, json_body};

type Web = State<Arc<super::Web>>;

/// `GET /v1/webapi/roles`: `[{name, description}]`, by name.
pub(crate) async fn list(State(web): Web, headers: HeaderMap) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let mut roles: Vec<Role> = s
        .auth
        .json::<(), _>(reqwest::Method::GET, auth::ROLES, None)
        .await
        .map_err(from_auth)?;
    roles.sort_by(|a, b| a.name().cmp(b.name()));
    let out: Vec<serde_json::Value> = roles
        .iter()
        .map(|r| serde_json::json!({"name": r.name(), "description": r.metadata.description}))
        .collect();
    Ok(Json(out).into_response())
}

fn as_yaml(role: &Role) -> Result<String, ApiError> {
    serde_saphyr::to_string(role).map_err(|e| {
        tracing::error!(error = %e, role = role.name(), "cannot write a role as YAML");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the proxy could not write the role as YAML",
        )
    })
}

/// `GET /v1/webapi/roles/{name}`: `{name, yaml, revision}`.
pub(crate) async fn get(
    State(web): Web,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let role: Role = s
        .auth
        .json::<(), _>(reqwest::Method::GET, &auth::role(&name), None)
        .await
        .map_err(from_auth)?;
    Ok(Json(serde_json::json!({
        "name": role.name(),
        "yaml": as_yaml(&role)?,
        "revision": role.revision(),
    }))
    .into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Text {
    yaml: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Save {
    yaml: String,
    /// The revision `GET` gave; none creates a new role (409 if the name is taken).
    #[serde(default)]
    revision: Option<String>,
}

/// A 400 listing the problems, each where it is.
fn invalid(problems: Vec<Problem>) -> Response {
    let error = problems
        .first()
        .map(|p| format!("line {} column {}: {}", p.line, p.column, p.message))
        .unwrap_or_default();
    (
        StatusCode::BAD_REQUEST,
        Json(serde_json::json!({"error": error, "errors": problems})),
    )
        .into_response()
}

/// `POST /v1/webapi/roles/validate` `{yaml}`: `{"errors": [{line, column, message}]}`, empty
/// when the role reads and validates.
pub(crate) async fn validate(
    State(web): Web,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    web.browser.changing(&headers).await?;
    let text: Text = json_body(&headers, body).await?;
    let errors: Vec<Problem> = sallyport_core::resource::parse_role(&text.yaml)
        .err()
        .into_iter()
        .collect();
    Ok(Json(serde_json::json!({"errors": errors})).into_response())
}

/// `PUT /v1/webapi/roles/{name}` `{yaml, revision?}`: `{name, created, revision}`; 400 with
/// `errors` as `validate` gives them, 409 when the role changed since `revision` (or exists,
/// without one).
pub(crate) async fn put(
    State(web): Web,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let save: Save = json_body(&headers, body).await?;
    let role = match sallyport_core::resource::parse_role(&save.yaml) {
        Ok(r) => r,
        Err(p) => return Ok(invalid(vec![p])),
    };
    if role.name() != name {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "the YAML names role {:?}, not {name:?}: rename by creating the new role and deleting the old one",
                role.name()
            ),
        ));
    }
    let revision = role.revision();
    let done: PutRoleResult = s
        .auth
        .json(
            reqwest::Method::POST,
            auth::ROLES,
            Some(&PutRole {
                role,
                overwrite: false,
                revision: save.revision,
            }),
        )
        .await
        .map_err(from_auth)?;
    Ok(Json(serde_json::json!({
        "name": done.name,
        "created": done.created,
        "revision": revision,
    }))
    .into_response())
}

/// `DELETE /v1/webapi/roles/{name}`: `{}`; auth refuses a role someone holds (409).
pub(crate) async fn delete(
    State(web): Web,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let s = web.browser.changing(&headers).await?;
    let _: serde_json::Value = s
        .auth
        .json::<(), _>(reqwest::Method::DELETE, &auth::role(&name), None)
        .await
        .map_err(from_auth)?;
    Ok(Json(serde_json::json!({})).into_response())
}
