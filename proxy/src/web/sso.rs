//! A browser's SSO sign-in (OpenID Connect), the web session at its end.
//!
//! 1. `GET /v1/webapi/oidc/web/start?connector=NAME` (the sign-in page's button, a plain link):
//!    the proxy makes the session's key and a random binding, has auth keep them under the
//!    binding's hash (`POST /v1/web-sso`: behind a load balancer the browser may come back to
//!    another proxy, which finishes it), sets the binding as a `SameSite=Lax` cookie and sends the browser to the provider
//!    (auth's `oidc_start` with `web`: it comes back to the proxy, not to a loopback listener).
//! 2. The provider sends the browser to the callback (`super::oidc_callback`), auth verifies the
//!    login and sends it on to:
//! 3. `GET /v1/webapi/oidc/web/finish?response=R`: redeemed only with the binding cookie of the
//!    browser that started (so an attacker cannot finish their own login in someone else's
//!    browser), the web session opened, its `SameSite=Strict` cookie set on a same-site page
//!    that moves on to the servers page. Without a sign-in started in this browser the page
//!    says only that (no text from the link is shown); a made-up response uses nothing up.
//!
//! The binding cookie must be `Lax`: the browser arrives at 3 on a redirect chain that began at
//! the provider, another site, and a `Strict` cookie would not be sent. For the same reason the
//! session's `Strict` cookie, set by 3, would not go with a redirect from 3; a page of our own
//! that moves on (a same-site navigation) carries it.

use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::{Certs, WebSsoPending};
use sallyport_core::https::RemoteAddr;
use sallyport_core::routes::auth;

use super::{Auth, sessions};

/// The binding cookie (host-only, HTTPS only, not readable by scripts).
pub const BINDING_COOKIE: &str = "__Host-sallyport_sso";
/// How long a started sign-in waits for the browser to come back (auth's own limit too).
const PENDING_TTL: Duration = Duration::from_secs(600);

fn hash(binding: &str) -> String {
    hex::encode(sallyport_core::sha256(binding.as_bytes()))
}

/// Has auth keep the sign-in this browser started, for whichever proxy it comes back to.
async fn put(
    auth: &crate::AuthClient,
    binding: &str,
    client_key: String,
    key: &russh::keys::PrivateKey,
) -> Result<(), String> {
    let key_pem = key_pem(key).ok_or("not an Ed25519 key")?;
    let p = WebSsoPending {
        binding_hash: hash(binding),
        client_key,
        key_pem,
    };
    auth.json::<_, serde_json::Value>(reqwest::Method::POST, auth::WEB_SSO, Some(&p))
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// The session key's PKCS#8 PEM.
fn key_pem(key: &russh::keys::PrivateKey) -> Option<String> {
    let seed = key.key_data().ed25519()?.private.to_bytes();
    Some(sallyport_core::x509::to_pem(
        "PRIVATE KEY",
        &sallyport_core::x509::ed25519_pkcs8(&seed),
    ))
}

/// The secret and key of the sign-in this browser started, left in place: a link to the
/// finishing page with a made-up response, which any site can send the browser (the
/// binding cookie is Lax), must not use up a sign-in in progress. `Ok(None)`: no such sign-in.
async fn peek(
    auth: &crate::AuthClient,
    binding: &str,
) -> Result<Option<(String, russh::keys::PrivateKey)>, crate::auth_client::ClientError> {
    let found: Result<WebSsoPending, _> = auth
        .json::<(), _>(reqwest::Method::GET, &auth::web_sso(&hash(binding)), None)
        .await;
    match found {
        Ok(p) => Ok(key_from_pem(&p.key_pem).map(|k| (p.client_key, k))),
        Err(crate::auth_client::ClientError::Refused { status: 404, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn key_from_pem(pem: &str) -> Option<russh::keys::PrivateKey> {
    let seed = sallyport_core::x509::ed25519_seed_from_pkcs8_pem(pem)?;
    Some(russh::keys::PrivateKey::from(
        russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&seed),
    ))
}

/// Forgets the sign-in: it opened its session.
async fn done(auth: &crate::AuthClient, binding: &str) {
    let r = auth
        .json::<(), serde_json::Value>(
            reqwest::Method::DELETE,
            &auth::web_sso(&hash(binding)),
            None,
        )
        .await;
    if let Err(e) = r {
        tracing::warn!(error = %e, "a finished SSO sign-in not forgotten by auth");
    }
}

fn binding_cookie(headers: &HeaderMap) -> Option<String> {
    sessions::cookie_named(headers, BINDING_COOKIE)
}

/// The page for auth's refusal (its words) or for auth out of reach.
fn auth_refused(e: crate::auth_client::ClientError, default: StatusCode) -> Response {
    match e {
        crate::auth_client::ClientError::Refused {
            status, message, ..
        } => failed(StatusCode::from_u16(status).unwrap_or(default), &message),
        e => {
            tracing::error!(error = %e, "auth unreachable");
            failed(
                StatusCode::BAD_GATEWAY,
                "the auth service is unreachable; try again shortly",
            )
        }
    }
}

fn set_binding(value: &str) -> String {
    format!(
        "{BINDING_COOKIE}={value}; HttpOnly; Secure; SameSite=Lax; Path=/; Max-Age={}",
        PENDING_TTL.as_secs()
    )
}

fn clear_binding() -> String {
    format!("{BINDING_COOKIE}=; HttpOnly; Secure; SameSite=Lax; Path=/; Max-Age=0")
}

/// These pages run nothing and load nothing.
const PAGE_CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// A page for a sign-in that cannot go on: what happened and a way back.
fn failed(status: StatusCode, message: &str) -> Response {
    let escaped = html_escape(message);
    let mut resp = (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, PAGE_CSP),
        ],
        format!(
            "<!doctype html><html lang=en><meta charset=utf-8><title>Sign-in failed · Sallyport</title><main><h1>Sign-in failed</h1><p role=alert>{escaped}</p><p><a href=\"/web/login\">Back to sign-in</a></p></main></html>"
        ),
    )
        .into_response();
    if let Ok(v) = header::HeaderValue::from_str(&clear_binding()) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
        .replace('\'', "&#39;")
}

#[derive(serde::Deserialize)]
pub(crate) struct StartQuery {
    connector: String,
}

/// Step 1: to the provider, the binding cookie set. Only from the proxy's own pages: a browser
/// that says the link came from another site (`Sec-Fetch-Site: cross-site`) is refused, so no
/// site can start sign-ins in someone's browser or replace the binding of one in progress.
pub(crate) async fn start(
    State(web): Auth,
    Extension(remote): Extension<RemoteAddr>,
    headers: HeaderMap,
    Query(q): Query<StartQuery>,
) -> Response {
    if headers
        .get("sec-fetch-site")
        .is_some_and(|v| v.as_bytes() == b"cross-site")
    {
        return failed(
            StatusCode::FORBIDDEN,
            "a sign-in starts from this proxy's own sign-in page, not from a link on another site",
        );
    }
    let key = match sallyport_core::sshcert::generate_ed25519() {
        Ok(k) => k,
        Err(e) => {
            tracing::error!(error = %e, "cannot make a web session's key");
            return failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the proxy could not make a key for the session",
            );
        }
    };
    let public = match key.public_key().to_openssh() {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "cannot write a web session's key");
            return failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the proxy could not make a key for the session",
            );
        }
    };
    let binding = sallyport_core::random_hex(32);
    let client_key = sallyport_core::random_hex(32);
    let body = serde_json::json!({
        "connector": q.connector,
        "client_redirect_url": "",
        "ssh_public_key": public,
        "client_key": client_key,
        "remote_addr": remote.0.to_string(),
        "web": true,
    });
    let started: Result<serde_json::Value, _> = web
        .auth
        .json(reqwest::Method::POST, auth::OIDC_START, Some(&body))
        .await;
    let auth_url = match started {
        Ok(v) => match v["auth_url"].as_str() {
            Some(u) => u.to_string(),
            None => return failed(StatusCode::BAD_GATEWAY, "auth gave no provider address"),
        },
        Err(e) => return auth_refused(e, StatusCode::BAD_REQUEST),
    };
    if let Err(e) = put(&web.auth, &binding, client_key, &key).await {
        tracing::error!(error = %e, "cannot keep a browser's SSO sign-in");
        return failed(
            StatusCode::BAD_GATEWAY,
            "the auth service is unreachable; try again shortly",
        );
    }
    let mut resp = (StatusCode::FOUND, [(header::LOCATION, auth_url)]).into_response();
    if let Ok(v) = header::HeaderValue::from_str(&set_binding(&binding)) {
        resp.headers_mut().append(header::SET_COOKIE, v);
    }
    resp
}

#[derive(serde::Deserialize)]
pub(crate) struct FinishQuery {
    #[serde(default)]
    response: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

/// Step 3: the web session, for the browser that started.
pub(crate) async fn finish(
    State(web): Auth,
    headers: HeaderMap,
    Query(q): Query<FinishQuery>,
) -> Response {
    let binding = binding_cookie(&headers).unwrap_or_default();
    let started = if binding.is_empty() {
        Ok(None)
    } else {
        peek(&web.auth, &binding).await
    };
    let Some((client_key, key)) = (match started {
        Ok(s) => s,
        Err(e) => return auth_refused(e, StatusCode::BAD_GATEWAY),
    }) else {
        return failed(
            StatusCode::FORBIDDEN,
            "this sign-in was not started in this browser, or it expired (10 minutes); sign in again",
        );
    };
    if let Some(why) = q.error {
        return failed(
            StatusCode::UNAUTHORIZED,
            &format!("Sallyport could not sign you in. The reason given: {why}"),
        );
    }
    let Some(response) = q.response else {
        return failed(
            StatusCode::BAD_REQUEST,
            "the sign-in came back without a response",
        );
    };
    let body = serde_json::json!({ "response": response, "client_key": client_key });
    let certs: Certs = match web
        .auth
        .json(reqwest::Method::POST, auth::OIDC_FINISH, Some(&body))
        .await
    {
        Ok(c) => c,
        Err(e) => return auth_refused(e, StatusCode::UNAUTHORIZED),
    };
    done(&web.auth, &binding).await;
    let (_, id) = match super::browser::open_session(&web.browser.sessions, certs, &key).await {
        Ok(s) => s,
        Err(e) => return failed(e.status, &e.message),
    };
    // A page of our own that moves on: the navigation it starts is same-site, so the Strict
    // cookie goes with it (a redirect here would still count as the provider's chain).
    let mut resp = (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, PAGE_CSP),
        ],
        "<!doctype html><html lang=en><meta charset=utf-8><meta http-equiv=refresh content=\"0;url=/web/nodes\"><title>Signed in · Sallyport</title><main><h1>Signed in</h1><p><a href=\"/web/nodes\">Continue to your servers</a></p></main></html>",
    )
        .into_response();
    for cookie in [sessions::set_cookie(&id), clear_binding()] {
        if let Ok(v) = header::HeaderValue::from_str(&cookie) {
            resp.headers_mut().append(header::SET_COOKIE, v);
        }
    }
    resp
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_session_key_survives_its_trip_through_auth() {
        let key = sallyport_core::sshcert::generate_ed25519().unwrap();
        let back = key_from_pem(&key_pem(&key).unwrap()).unwrap();
        assert_eq!(back.public_key(), key.public_key());
        assert!(key_from_pem("not a key").is_none());
    }

    #[test]
    fn the_binding_cookie_is_lax_and_found_by_its_exact_name() {
        assert!(set_binding("x").contains("SameSite=Lax"));
        assert!(set_binding("x").contains("HttpOnly; Secure"));
        let mut h = HeaderMap::new();
        h.insert(
            header::COOKIE,
            "x__Host-sallyport_sso=no; __Host-sallyport_sso=yes"
                .parse()
                .unwrap(),
        );
        assert_eq!(binding_cookie(&h).as_deref(), Some("yes"));
    }
}
