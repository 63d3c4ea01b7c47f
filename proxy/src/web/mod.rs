//! The proxy's web API on 3080. Unauthenticated users reach the login and sign-up endpoints
//! here; the proxy adds the TCP peer address (never a client-sent header) and forwards to auth.
//! Browsers sign in to a web session (`sessions`, `browser`) and open terminals over a
//! WebSocket (`terminal`), a door of the session engine like the SSH door.
//!
//! Every answer carries `Cache-Control: no-store`, `X-Content-Type-Options: nosniff`,
//! `X-Frame-Options: DENY` and `Referrer-Policy: no-referrer`; an unknown path is a JSON 404.
//! The web UI's pages and files (`ui`: `/`, `/web/*`) are on the same router, with headers of
//! their own.

pub mod admin;
pub mod audit;
pub mod browser;
pub mod recordings;
pub mod roles;
pub mod sessions;
pub mod sso;
pub mod terminal;
pub mod ui;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, delete, get, post};
use axum::{Extension, Json, Router};
use reqwest::Method;
use sallyport_core::api::ErrorBody;
use sallyport_core::https::RemoteAddr;
use sallyport_core::routes::{auth, web};

use crate::AuthClient;

/// Largest request body the web API reads.
pub const MAX_BODY: usize = 64 * 1024;

/// What the proxy tells clients about its other doors.
#[derive(Clone, Copy, Debug)]
pub struct Doors {
    pub ssh_port: u16,
    pub tunnel_port: u16,
    /// The Kubernetes door (3026), when it listens.
    pub kube_port: Option<u16>,
}

pub fn router(auth: AuthClient, doors: Doors, browser: browser::Browser) -> Router {
    Router::new()
        .route(web::PING, get(ping))
        .route(web::JOIN, for_client(auth::JOIN))
        .route(web::SIGNUP_START, post(signup_start))
        .route(web::SIGNUP_FINISH, for_client(auth::SIGNUP_FINISH))
        .route(web::LOGIN, for_client(auth::LOGIN))
        .route(web::OIDC_LOGIN_START, for_client(auth::OIDC_START))
        .route(web::OIDC_CALLBACK, get(oidc_callback))
        .route(web::OIDC_LOGIN_FINISH, post(oidc_finish))
        .route(web::OIDC_WEB_START, get(sso::start))
        .route(web::OIDC_WEB_FINISH, get(sso::finish))
        .route(web::WEB_LOGIN, post(browser::login))
        .route(
            web::WEB_SESSION,
            get(browser::session).delete(browser::logout),
        )
        .route(web::NODES, get(browser::nodes))
        .route(web::TERMINAL, get(terminal::upgrade))
        .route(web::RECORDINGS, get(recordings::list))
        .route(web::RECORDING, get(recordings::get))
        .route(web::RECORDING_CAST, get(recordings::cast))
        .route(web::AUDIT, get(audit::page))
        .route(web::AUDIT_DOWNLOAD, get(audit::download))
        .route(web::ROLES, get(roles::list))
        .route(web::ROLES_VALIDATE, post(roles::validate))
        .route(
            web::ROLE,
            get(roles::get).put(roles::put).delete(roles::delete),
        )
        .route(web::USERS, get(admin::users).post(admin::add_user))
        .route(web::USER_RESET, post(admin::reset_user))
        .route(web::LOCKS, post(admin::add_lock))
        .route(web::LOCK, delete(admin::remove_lock))
        .route(web::TOKENS, get(admin::tokens).post(admin::add_token))
        .fallback(browser::not_found)
        .method_not_allowed_fallback(browser::method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY))
        .layer(axum::middleware::map_response(api_headers))
        .with_state(Arc::new(Web {
            auth,
            doors,
            browser: Arc::new(browser),
            ping: PingCache::default(),
        }))
        // The UI's pages and files, after the API's layers: they carry their own headers
        // (cacheable with ETags, the CSP), not the API's no-store.
        .merge(ui::router())
}

/// The headers every answer of the API carries.
async fn api_headers(mut resp: Response) -> Response {
    let h = resp.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        h.insert(name, header::HeaderValue::from_static(value));
    }
    resp
}

pub(crate) struct Web {
    auth: AuthClient,
    doors: Doors,
    browser: Arc<browser::Browser>,
    ping: PingCache,
}

type Auth = State<Arc<Web>>;

async fn forward(
    auth: &AuthClient,
    method: Method,
    path: &str,
    body: Option<serde_json::Value>,
) -> Response {
    relay(auth.call(method, path, body).await)
}

/// Auth's answer as the client gets it.
fn relay(answer: Result<(u16, Vec<u8>), crate::auth_client::ClientError>) -> Response {
    match answer {
        Ok((status, body)) => {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            let mut resp =
                (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
            // Auth's "too many logins in progress" passes through as it was said, with a hint
            // of when to come back.
            if status == StatusCode::SERVICE_UNAVAILABLE {
                resp.headers_mut()
                    .insert(header::RETRY_AFTER, header::HeaderValue::from_static("2"));
            }
            resp
        }
        Err(e) => auth_unreachable(&e),
    }
}

/// The answer when auth cannot be reached (the cause goes to the log only).
fn auth_unreachable(e: &dyn std::fmt::Display) -> Response {
    tracing::error!(error = %e, "auth unreachable");
    unreachable_answer()
}

/// What a client reads when auth cannot be reached.
fn unreachable_answer() -> Response {
    (
        StatusCode::BAD_GATEWAY,
        Json(ErrorBody {
            error: "the auth service is unreachable; try again shortly".into(),
            code: None,
        }),
    )
        .into_response()
}

/// Replaces whatever `remote_addr` the client sent with the address the connection came from,
/// and removes the `web` flag only the proxy sets (a login that opens a web session).
fn with_remote(mut body: serde_json::Value, remote: RemoteAddr) -> serde_json::Value {
    if let Some(m) = body.as_object_mut() {
        m.insert("remote_addr".into(), remote.0.to_string().into());
        m.remove("web");
    }
    body
}

/// Auth's last ping answer.
#[derive(Default)]
struct PingCache(Arc<tokio::sync::Mutex<Option<PingAsk>>>);

struct PingAsk {
    began: Instant,
    ended: Instant,
    /// `Err`: auth could not be asked.
    answer: Result<serde_json::Value, ()>,
}

impl PingAsk {
    /// Whether a caller that came at `came` may take this answer: auth answered after it came
    /// (the ask began after), or could not be reached after it came (the ask failed after).
    fn fresh_for(&self, came: Instant) -> bool {
        self.began >= came || (self.answer.is_err() && self.ended >= came)
    }
}

/// `GET /v1/webapi/ping`, open to anyone. Each ask costs auth two database reads, so the proxy
/// asks one at a time: a caller gets the answer of an ask that began after it came (as fresh as
/// asking itself), and every caller that came before an ask began shares it ([`PingAsk`]).
/// However many ping at once, auth answers one ask at a time from this proxy.
async fn ping(State(web): Auth) -> Response {
    let came = Instant::now();
    let mut last = web.ping.0.clone().lock_owned().await;
    let answer = match last.as_ref() {
        Some(ask) if ask.fresh_for(came) => ask.answer.clone(),
        _ => {
            // The ask runs on a task of its own, which holds the lock until the answer is
            // stored: a caller that goes away (a reset stream) does not cancel it for the
            // others waiting.
            let client = web.auth.clone();
            let asking = tokio::spawn(async move {
                let began = Instant::now();
                let answer = client
                    .json::<serde_json::Value, serde_json::Value>(Method::GET, auth::PING, None)
                    .await
                    .map_err(|e| {
                        // Logged once per ask, not once per caller.
                        tracing::error!(error = %e, "auth unreachable");
                    });
                *last = Some(PingAsk {
                    began,
                    ended: Instant::now(),
                    answer: answer.clone(),
                });
                answer
            });
            asking.await.unwrap_or(Err(()))
        }
    };
    match answer {
        Ok(mut v) => {
            v["ssh_port"] = web.doors.ssh_port.into();
            v["tunnel_port"] = web.doors.tunnel_port.into();
            if let Some(p) = web.doors.kube_port {
                v["kube_port"] = p.into();
            }
            Json(v).into_response()
        }
        Err(()) => unreachable_answer(),
    }
}

/// A route whose request the proxy forwards to auth's `path` for a client. Auth audits and
/// bounds these by the client's address (sign-up tokens, logins, joins, SSO starts), so every one
/// carries it, in place of whatever `remote_addr` the client sent.
fn for_client(path: &'static str) -> MethodRouter<Arc<Web>> {
    post(
        move |State(web): Auth,
              Extension(remote): Extension<RemoteAddr>,
              Json(body): Json<serde_json::Value>| async move {
            forward(
                &web.auth,
                Method::POST,
                path,
                Some(with_remote(body, remote)),
            )
            .await
        },
    )
}

/// `POST /v1/webapi/signup/start`, forwarded to auth like the others; when auth answers with
/// a TOTP enrollment URI the proxy adds it as a QR code (`otpauth_qr_svg`, an SVG document) for
/// the browser's sign-up page, drawn by the same crate as `sally signup`'s terminal QR code.
async fn signup_start(
    State(web): Auth,
    Extension(remote): Extension<RemoteAddr>,
    Json(body): Json<serde_json::Value>,
) -> Response {
    let answer = web
        .auth
        .call(
            Method::POST,
            auth::SIGNUP_START,
            Some(with_remote(body, remote)),
        )
        .await;
    let Ok((200, bytes)) = &answer else {
        // A refusal or an unreachable auth: answered as every forwarded route answers it.
        return relay(answer);
    };
    let Ok(mut started) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return (
            StatusCode::BAD_GATEWAY,
            Json(ErrorBody {
                error: "auth's answer to the sign-up was not JSON".into(),
                code: None,
            }),
        )
            .into_response();
    };
    if let Some(svg) = started["otpauth_uri"].as_str().and_then(qr_svg) {
        started["otpauth_qr_svg"] = svg.into();
    }
    Json(started).into_response()
}

/// `text` as a QR code in SVG: one path of unit squares, a 4-module quiet zone.
pub fn qr_svg(text: &str) -> Option<String> {
    let code = qrcode::QrCode::new(text.as_bytes()).ok()?;
    let width = code.width();
    let size = width + 8;
    let mut path = String::new();
    for (i, color) in code.to_colors().iter().enumerate() {
        if *color == qrcode::Color::Dark {
            let (x, y) = (i % width + 4, i / width + 4);
            path.push_str(&format!("M{x} {y}h1v1h-1z"));
        }
    }
    Some(format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {size} {size}\" shape-rendering=\"crispEdges\"><rect width=\"{size}\" height=\"{size}\" fill=\"#fff\"/><path d=\"{path}\" fill=\"#000\"/></svg>"
    ))
}

async fn oidc_finish(State(web): Auth, Json(body): Json<serde_json::Value>) -> Response {
    forward(&web.auth, Method::POST, auth::OIDC_FINISH, Some(body)).await
}

/// A small page for the browser when a login cannot go on.
fn page(status: StatusCode, message: &str) -> Response {
    let escaped = message
        .replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;");
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        format!(
            "<!doctype html><meta charset=utf-8><title>Sallyport sign-in</title><h1>Sallyport sign-in failed</h1><p>{escaped}</p>"
        ),
    )
        .into_response()
}

/// The identity provider sends the browser here with `code` and `state`; auth finishes the
/// login and says where the browser goes next (`sally login`'s listener on loopback).
async fn oidc_callback(
    State(web): Auth,
    Extension(remote): Extension<RemoteAddr>,
    Query(q): Query<std::collections::BTreeMap<String, String>>,
) -> Response {
    let mut body = serde_json::Map::new();
    for k in ["code", "state", "error", "error_description"] {
        if let Some(v) = q.get(k) {
            body.insert(k.into(), v.clone().into());
        }
    }
    body.insert("remote_addr".into(), remote.0.to_string().into());
    match web
        .auth
        .json::<_, serde_json::Value>(
            Method::POST,
            auth::OIDC_CALLBACK,
            Some(&serde_json::Value::Object(body)),
        )
        .await
    {
        Ok(v) => match v["location"].as_str() {
            Some(loc) => (
                StatusCode::FOUND,
                [
                    (header::LOCATION, loc.to_string()),
                    (header::CACHE_CONTROL, "no-store".to_string()),
                ],
            )
                .into_response(),
            None => page(StatusCode::BAD_GATEWAY, "auth gave no next step"),
        },
        Err(crate::auth_client::ClientError::Refused {
            status, message, ..
        }) => page(
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            &message,
        ),
        Err(e) => {
            tracing::error!(error = %e, "auth unreachable");
            page(
                StatusCode::BAD_GATEWAY,
                "the auth service is unreachable; try again shortly",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn the_qr_code_is_an_svg_of_unit_squares_in_a_quiet_zone() {
        let uri = "otpauth://totp/sallyport:alice?secret=JBSWY3DPEHPK3PXP&issuer=sallyport";
        let svg = super::qr_svg(uri).unwrap();
        let code = qrcode::QrCode::new(uri.as_bytes()).unwrap();
        let size = code.width() + 8;
        assert!(svg.starts_with(&format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {size} {size}\""
        )));
        let dark = code
            .to_colors()
            .iter()
            .filter(|c| **c == qrcode::Color::Dark)
            .count();
        assert_eq!(svg.matches("h1v1h-1z").count(), dark);
        assert!(
            svg.contains("M4 4h1v1h-1z"),
            "the finder's corner at the quiet zone's edge"
        );
    }
}
