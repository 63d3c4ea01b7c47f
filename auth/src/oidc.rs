//! Single sign-on with OpenID Connect: the authorization-code flow with PKCE, state and nonce.
//!
//! 1. `sally login --auth=NAME` listens on 127.0.0.1 and asks (through the proxy) to start:
//!    auth discovers the provider, records a one-time state with its nonce, PKCE verifier, the
//!    client's loopback address, its public key and a hash of a client secret, and answers with
//!    the provider's authorization URL.
//! 2. The browser signs in at the provider and comes back to the proxy's callback with a code;
//!    auth claims the state (once), exchanges the code (client secret + PKCE verifier), checks
//!    the ID token (signature by a key from the provider's JWKS with an allowed algorithm,
//!    issuer, audience and authorized party, expiry, issued-at with 60 s of skew, nonce), adds
//!    the claims of the provider's UserInfo endpoint (about the same `sub`), names the user by
//!    a claim the provider vouches for, maps claims to roles, refreshes the `sso` user keyed on
//!    (connector, issuer, `sub`) and issues certificates; the browser is sent on to `sally`'s
//!    loopback listener with a one-time response code.
//! 3. `sally` redeems the response code with its client secret and receives the certificates.
//!
//! Nothing is issued when any check fails; every outcome is a `user.login` event with
//! `method: oidc`. Anyone can start a login and call back with its state, an error or a made-up
//! code, so the failures before an ID token verifies (nobody's identity is claimed yet) go
//! through `failures` (one record per address and reason a minute, with a count), and logins
//! waiting at the provider are bounded ([`pending_place`], counted in the database): a start is one row and, at most,
//! one code exchange with the provider.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use base64::Engine;
use jsonwebtoken::{Algorithm, DecodingKey, Validation, jwk::JwkSet};
use sallyport_core::api::{Certs, ConnectorKind, LoginRequest};
use sallyport_core::audit::{Event, EventType};
use sallyport_core::oidc::{OidcConnector, map_roles, merge_userinfo};
use sallyport_core::routes;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sqlx::Row;

use crate::users::{SsoIdentity, token_hash};
use crate::{AuthError, AuthServer};

/// How long a started login may take at the provider.
const REQUEST_TTL: i64 = 600;
/// Logins started from one client address and not yet called back.
pub const MAX_PENDING_PER_ADDRESS: usize = 20;
/// Logins started and not yet called back, from all addresses.
pub const MAX_PENDING: usize = 5000;
/// Longest text kept from what the provider (or whoever calls back) says about an error.
const MAX_ERROR_TEXT: usize = 256;
/// Clock skew allowed on `iat`, `exp` and `nbf`.
const SKEW_SECS: u64 = 60;
/// Signature algorithms accepted on ID tokens: asymmetric only (no `none`, no HMAC).
const ALLOWED_ALGS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OidcStart {
    pub connector: String,
    /// `sally`'s listener: must be http://127.0.0.1:PORT/… or http://localhost:PORT/….
    pub client_redirect_url: String,
    pub ssh_public_key: String,
    #[serde(default)]
    pub ttl_secs: Option<u64>,
    /// A secret `sally` made; only its hash is kept, and the response is redeemed with it.
    pub client_key: String,
    /// The client's address, as the proxy saw the connection (never sent by the client).
    #[serde(default)]
    pub remote_addr: Option<String>,
    /// A browser's sign-in, started by the proxy itself (which drops the field from what
    /// clients send): the browser comes back to the proxy's own finishing page
    /// ([`routes::web::OIDC_WEB_FINISH`]), same site, rather than to a loopback listener;
    /// `client_redirect_url` is ignored.
    #[serde(default)]
    pub web: bool,
}

/// What `oidc_requests.client_redirect` holds for a browser's sign-in.
const WEB_REDIRECT: &str = "web";

/// Where the browser goes after the callback: the client's redirect with `pairs` in its
/// query, or for a browser's sign-in the proxy's own finishing page (a path on the same site).
fn next_location(client_redirect: &str, pairs: &[(&str, &str)]) -> Result<String, AuthError> {
    if client_redirect == WEB_REDIRECT {
        let query = url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(pairs)
            .finish();
        return Ok(format!("{}?{query}", routes::web::OIDC_WEB_FINISH));
    }
    with_query(client_redirect, pairs)
}

/// Takes a place for a start from source `addr` (its address without the port, an IPv6 /64 as
/// one), or says why there is none. The places are the rows of `oidc_requests` not yet called
/// back nor expired, counted in the database, so every auth instance on it enforces one cap: a
/// start beyond [`MAX_PENDING_PER_ADDRESS`] for its source, or beyond [`MAX_PENDING`] in all, is
/// refused before anything is stored, so a loop of starts cannot grow `oidc_requests` (whose rows
/// also expire after [`REQUEST_TTL`]). Two instances counting at the same moment may each admit
/// one more: the cap holds within the number of concurrent starts.
async fn pending_place(pool: &sqlx::AnyPool, addr: &str, now: i64) -> Result<(), AuthError> {
    let from_addr: i64 = sqlx::query(
        "SELECT COUNT(*) FROM oidc_requests WHERE used = 0 AND expires > $1 AND source = $2",
    )
    .bind(now)
    .bind(addr)
    .fetch_one(pool)
    .await?
    .try_get(0)?;
    if from_addr >= MAX_PENDING_PER_ADDRESS as i64 {
        return Err(AuthError::Locked(format!(
            "too many SSO logins started from {addr} are waiting for the identity provider ({from_addr}, at most {MAX_PENDING_PER_ADDRESS}); finish one, or try again when they expire (10 minutes)"
        )));
    }
    let all: i64 =
        sqlx::query("SELECT COUNT(*) FROM oidc_requests WHERE used = 0 AND expires > $1")
            .bind(now)
            .fetch_one(pool)
            .await?
            .try_get(0)?;
    if all >= MAX_PENDING as i64 {
        return Err(AuthError::Busy(
            "too many SSO logins are in progress; try again in a few minutes".into(),
        ));
    }
    Ok(())
}

/// A login that failed before any identity was verified: `reason` keys its aggregation (a
/// fixed text, never the caller's words), `error` is what the person is shown.
struct Unverified {
    reason: String,
    error: String,
}

impl Unverified {
    /// A failure whose message is also its reason (our own words, a bounded set).
    fn said(error: impl Into<String>) -> Self {
        let error = error.into();
        Unverified {
            reason: error.clone(),
            error,
        }
    }

    fn because(reason: &str, error: impl Into<String>) -> Self {
        Unverified {
            reason: reason.into(),
            error: error.into(),
        }
    }
}

/// What a provider's token endpoint answered, with the ID token verified.
struct Verified {
    connector: OidcConnector,
    discovery: Discovery,
    claims: BTreeMap<String, Value>,
    /// For UserInfo, read once the ID token is known good.
    access_token: Option<String>,
    ssh_key: String,
    ttl: Option<i64>,
}

/// At most [`MAX_ERROR_TEXT`] bytes, cut at a character boundary.
fn clip(s: &str) -> &str {
    let mut end = s.len().min(MAX_ERROR_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OidcStarted {
    pub auth_url: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OidcCallback {
    #[serde(default)]
    pub code: Option<String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub error_description: Option<String>,
    #[serde(default)]
    pub remote_addr: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OidcRedirect {
    pub location: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OidcFinish {
    pub response: String,
    pub client_key: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    pub issuer: String,
    pub authorization_endpoint: String,
    pub token_endpoint: String,
    pub jwks_uri: String,
    /// Optional in discovery (OpenID Connect Discovery 3), but where most providers answer
    /// `email` and `groups` for the code flow.
    #[serde(default)]
    pub userinfo_endpoint: Option<String>,
}

/// Provider keys by JWKS URL, refetched when a token names a key not in the cache.
static JWKS: LazyLock<Mutex<HashMap<String, (Instant, JwkSet)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn http() -> Result<reqwest::Client, AuthError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| AuthError::Internal(e.to_string()))
}

fn provider_down(issuer: &str, e: impl std::fmt::Display) -> AuthError {
    AuthError::Upstream(format!(
        "the identity provider at {issuer} cannot be reached: {e}"
    ))
}

/// Discovery documents by issuer, kept a few minutes: a login reads it twice (start and
/// callback), and many logins read it in a burst.
static DISCOVERY: LazyLock<Mutex<HashMap<String, (Instant, Discovery)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));
const DISCOVERY_TTL: Duration = Duration::from_secs(300);

async fn discover(issuer: &str) -> Result<Discovery, AuthError> {
    let cached = DISCOVERY
        .lock()
        .ok()
        .and_then(|c| c.get(issuer).cloned())
        .filter(|(at, _)| at.elapsed() < DISCOVERY_TTL);
    if let Some((_, d)) = cached {
        return Ok(d);
    }
    let d = fetch_discovery(issuer).await?;
    if let Ok(mut c) = DISCOVERY.lock() {
        c.insert(issuer.to_string(), (Instant::now(), d.clone()));
    }
    Ok(d)
}

async fn fetch_discovery(issuer: &str) -> Result<Discovery, AuthError> {
    let url = format!(
        "{}/.well-known/openid-configuration",
        issuer.trim_end_matches('/')
    );
    let resp = http()?
        .get(&url)
        .send()
        .await
        .map_err(|e| provider_down(issuer, e))?;
    if !resp.status().is_success() {
        return Err(provider_down(
            issuer,
            format!("discovery answered {}", resp.status()),
        ));
    }
    let d: Discovery = resp
        .json()
        .await
        .map_err(|e| provider_down(issuer, format!("discovery document: {e}")))?;
    if d.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
        return Err(AuthError::Upstream(format!(
            "the provider calls itself {:?}, not {issuer:?} (issuer_url)",
            d.issuer
        )));
    }
    Ok(d)
}

async fn fetch_jwks(uri: &str) -> Result<JwkSet, AuthError> {
    let set: JwkSet = http()?
        .get(uri)
        .send()
        .await
        .map_err(|e| provider_down(uri, e))?
        .json()
        .await
        .map_err(|e| provider_down(uri, format!("JWKS: {e}")))?;
    if let Ok(mut cache) = JWKS.lock() {
        cache.insert(uri.to_string(), (Instant::now(), set.clone()));
    }
    Ok(set)
}

fn find_key(set: &JwkSet, kid: Option<&str>) -> Option<jsonwebtoken::jwk::Jwk> {
    match kid {
        Some(k) => set.find(k).cloned(),
        None if set.keys.len() == 1 => set.keys.first().cloned(),
        None => None,
    }
}

/// Checks an ID token: allowed algorithm, a key from the provider's JWKS (refetched once for an
/// unknown `kid`), issuer, audience, authorized party, expiry, issued-at and the nonce. Returns
/// its claims.
pub async fn verify_id_token(
    token: &str,
    d: &Discovery,
    client_id: &str,
    nonce: &str,
) -> Result<BTreeMap<String, Value>, String> {
    let header = jsonwebtoken::decode_header(token)
        .map_err(|e| format!("the ID token is malformed: {e}"))?;
    if !ALLOWED_ALGS.contains(&header.alg) {
        return Err(format!(
            "the ID token is signed with {:?}, which is not allowed",
            header.alg
        ));
    }
    let cached = JWKS
        .lock()
        .ok()
        .and_then(|c| c.get(&d.jwks_uri).cloned())
        .filter(|(at, _)| at.elapsed() < Duration::from_secs(3600));
    let mut jwk = cached
        .as_ref()
        .and_then(|(_, set)| find_key(set, header.kid.as_deref()));
    if jwk.is_none() {
        let set = fetch_jwks(&d.jwks_uri).await.map_err(|e| e.to_string())?;
        jwk = find_key(&set, header.kid.as_deref());
    }
    let jwk = jwk.ok_or_else(|| {
        format!(
            "the ID token is signed by key {:?}, which the provider does not publish",
            header.kid.as_deref().unwrap_or("(none)")
        )
    })?;
    let key = DecodingKey::from_jwk(&jwk).map_err(|e| format!("the provider's key: {e}"))?;
    let mut v = Validation::new(header.alg);
    v.set_audience(&[client_id]);
    v.set_issuer(&[d.issuer.as_str()]);
    v.leeway = SKEW_SECS;
    v.validate_nbf = true;
    v.set_required_spec_claims(&["exp", "iat", "iss", "aud", "sub"]);
    let data = jsonwebtoken::decode::<BTreeMap<String, Value>>(token, &key, &v).map_err(|e| {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::InvalidAudience => "the ID token was issued for another client (audience)".into(),
            K::ExpiredSignature => "the ID token has expired".into(),
            K::InvalidIssuer => "the ID token comes from another issuer".into(),
            K::InvalidSignature => "the ID token's signature is not valid".into(),
            K::ImmatureSignature => "the ID token is not valid yet".into(),
            K::MissingRequiredClaim(c) => format!("the ID token has no {c:?} claim"),
            _ => format!("the ID token was refused: {e}"),
        }
    })?;
    let claims = data.claims;
    sallyport_core::oidc::check_authorized_party(&claims, client_id)?;
    let now = sallyport_core::unix_now();
    let iat = claims
        .get("iat")
        .and_then(Value::as_i64)
        .unwrap_or(i64::MAX);
    if iat > now + SKEW_SECS as i64 {
        return Err("the ID token was issued in the future (check the clocks)".into());
    }
    let got = claims.get("nonce").and_then(Value::as_str).unwrap_or("");
    if !sallyport_core::secrets_equal(got.as_bytes(), nonce.as_bytes()) {
        return Err("the ID token's nonce does not match this login".into());
    }
    Ok(claims)
}

/// The provider's UserInfo response (OpenID Connect Core 5.3) for the access token the code
/// exchange returned: a JSON object of claims. A signed or encrypted response (`application/jwt`,
/// which a client must register for) is refused with a clear message.
async fn fetch_userinfo(
    endpoint: &str,
    access_token: &str,
    issuer: &str,
) -> Result<BTreeMap<String, Value>, String> {
    let resp = http()
        .map_err(|e| e.to_string())?
        .get(endpoint)
        .bearer_auth(access_token)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| provider_down(issuer, format!("UserInfo: {e}")).to_string())?;
    let status = resp.status();
    let jwt = resp
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|t| t.starts_with("application/jwt"));
    if !status.is_success() {
        return Err(format!(
            "the provider's UserInfo endpoint refused the access token ({status})"
        ));
    }
    if jwt {
        return Err(
            "the provider answers UserInfo signed (application/jwt); configure the client at the provider for plain JSON UserInfo responses".into(),
        );
    }
    resp.json::<BTreeMap<String, Value>>()
        .await
        .map_err(|e| format!("the provider's UserInfo response is not a JSON object: {e}"))
}

fn pkce_challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sallyport_core::sha256(verifier.as_bytes()))
}

/// `sally`'s own listener: http, on 127.0.0.1 or localhost, with a port and nothing else.
fn loopback_redirect(url: &str) -> bool {
    url::Url::parse(url).is_ok_and(|u| {
        u.scheme() == "http"
            && matches!(u.host_str(), Some("127.0.0.1" | "localhost"))
            && u.port().is_some()
            && u.username().is_empty()
            && u.password().is_none()
    })
}

/// `base` with `pairs` added to its query, form-encoded.
fn with_query(base: &str, pairs: &[(&str, &str)]) -> Result<String, AuthError> {
    let mut u = url::Url::parse(base)
        .map_err(|e| AuthError::Upstream(format!("{base:?} is not a URL: {e}")))?;
    u.query_pairs_mut().extend_pairs(pairs);
    Ok(u.into())
}

/// RFC 6749 2.3.1: client credentials are form-encoded before HTTP Basic authentication.
fn form_encode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

impl AuthServer {
    pub(crate) async fn connector(&self, name: &str) -> Result<OidcConnector, AuthError> {
        let row = sqlx::query("SELECT spec FROM connectors WHERE name = $1 AND kind = $2")
            .bind(name)
            .bind(ConnectorKind::Oidc.as_str())
            .fetch_optional(&self.backend.pool)
            .await?
            .ok_or_else(|| {
                AuthError::NotFound(format!("there is no SSO connector named {name}"))
            })?;
        let text: String = row.try_get("spec")?;
        serde_json::from_str(&text)
            .map_err(|e| AuthError::Internal(format!("connector {name}: {e}")))
    }

    pub async fn put_connector(
        &self,
        c: &OidcConnector,
        overwrite: bool,
        by: &str,
    ) -> Result<bool, AuthError> {
        c.validate().map_err(AuthError::BadRequest)?;
        let text = serde_json::to_string(c).map_err(|e| AuthError::Internal(e.to_string()))?;
        let exists = sqlx::query("SELECT name FROM connectors WHERE name = $1")
            .bind(c.name())
            .fetch_optional(&self.backend.pool)
            .await?
            .is_some();
        if exists && !overwrite {
            return Err(AuthError::Conflict(format!(
                "connector {} already exists; use `sallyctl create -f` to replace it",
                c.name()
            )));
        }
        sqlx::query(
            "INSERT INTO connectors (name, kind, spec, created) VALUES ($1, $4, $2, $3)
             ON CONFLICT (name) DO UPDATE SET spec = excluded.spec",
        )
        .bind(c.name())
        .bind(&text)
        .bind(sallyport_core::unix_now())
        .bind(c.kind.as_str())
        .execute(&self.backend.pool)
        .await?;
        self.emit(
            Event::new(
                if exists {
                    EventType::ConnectorUpdate
                } else {
                    EventType::ConnectorCreate
                },
                Some(by),
            )
            .with("connector", c.name().to_string())
            .with("issuer_url", c.spec.issuer_url.clone()),
        )
        .await?;
        Ok(!exists)
    }

    pub async fn connector_names(&self) -> Result<Vec<String>, AuthError> {
        let rows = sqlx::query("SELECT name FROM connectors ORDER BY name")
            .fetch_all(&self.backend.pool)
            .await?;
        rows.iter()
            .map(|r| r.try_get::<String, _>("name").map_err(Into::into))
            .collect()
    }

    /// Every connector, secrets redacted.
    pub async fn list_connectors(&self) -> Result<Vec<OidcConnector>, AuthError> {
        let rows = sqlx::query("SELECT spec FROM connectors ORDER BY name")
            .fetch_all(&self.backend.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let text: String = r.try_get("spec")?;
                let c: OidcConnector =
                    serde_json::from_str(&text).map_err(|e| AuthError::Internal(e.to_string()))?;
                Ok(c.redacted())
            })
            .collect()
    }

    pub async fn remove_connector(&self, name: &str, by: &str) -> Result<(), AuthError> {
        let r = sqlx::query("DELETE FROM connectors WHERE name = $1")
            .bind(name)
            .execute(&self.backend.pool)
            .await?;
        if r.rows_affected() == 0 {
            return Err(AuthError::NotFound(format!(
                "connector {name} does not exist"
            )));
        }
        self.emit(Event::new(EventType::ConnectorDelete, Some(by)).with("connector", name))
            .await?;
        Ok(())
    }

    pub async fn oidc_start(&self, req: &OidcStart) -> Result<OidcStarted, AuthError> {
        let c = self.connector(&req.connector).await?;
        let client_redirect = if req.web {
            WEB_REDIRECT
        } else {
            req.client_redirect_url.as_str()
        };
        if !req.web && !loopback_redirect(&req.client_redirect_url) {
            return Err(AuthError::BadRequest(
                "the client's redirect must be http://127.0.0.1:PORT/… (sally's own listener)"
                    .into(),
            ));
        }
        if req.client_key.len() < 32 {
            return Err(AuthError::BadRequest("the client key is too short".into()));
        }
        russh::keys::ssh_key::PublicKey::from_openssh(req.ssh_public_key.trim())
            .map_err(|e| AuthError::BadRequest(format!("not an OpenSSH public key: {e}")))?;
        let d = discover(&c.spec.issuer_url).await?;
        let state = sallyport_core::random_hex(32);
        let nonce = sallyport_core::random_hex(32);
        let verifier = sallyport_core::random_hex(32);
        let now = sallyport_core::unix_now();
        sqlx::query("DELETE FROM oidc_requests WHERE expires < $1")
            .bind(now)
            .execute(&self.backend.pool)
            .await?;
        let state_hash = token_hash(&state);
        // Counted by source as the doors count (an IPv6 /64 as one): a client that changes its
        // address within its /64 is still one client.
        let addr = crate::failures::source_key(req.remote_addr.as_deref().unwrap_or_default());
        pending_place(&self.backend.pool, &addr, now).await?;
        sqlx::query(
            "INSERT INTO oidc_requests (state_hash, connector, nonce, pkce_verifier, client_redirect, client_key_hash, ssh_public_key, ttl_secs, expires, source)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        )
        .bind(&state_hash)
        .bind(c.name())
        .bind(&nonce)
        .bind(&verifier)
        .bind(client_redirect)
        .bind(token_hash(&req.client_key))
        .bind(req.ssh_public_key.trim())
        .bind(req.ttl_secs.map(|t| i64::try_from(t).unwrap_or(i64::MAX)))
        .bind(now + REQUEST_TTL)
        .bind(&addr)
        .execute(&self.backend.pool)
        .await?;
        let auth_url = with_query(
            &d.authorization_endpoint,
            &[
                ("response_type", "code"),
                ("client_id", c.spec.client_id.as_str()),
                ("redirect_uri", c.spec.redirect_url.as_str()),
                ("scope", &c.spec.scopes.join(" ")),
                ("state", &state),
                ("nonce", &nonce),
                ("code_challenge", &pkce_challenge(&verifier)),
                ("code_challenge_method", "S256"),
            ],
        )?;
        Ok(OidcStarted { auth_url })
    }

    /// The provider sent the browser back. Returns where to send it next: `sally`'s listener,
    /// with a response code or an error for it to show.
    pub async fn oidc_callback(&self, cb: &OidcCallback) -> Result<OidcRedirect, AuthError> {
        let state = cb
            .state
            .as_deref()
            .ok_or_else(|| AuthError::BadRequest("the callback has no state".into()))?;
        let now = sallyport_core::unix_now();
        // One use: of two callbacks with the same state, only one gets past this.
        let claimed = sqlx::query(
            "UPDATE oidc_requests SET used = 1 WHERE state_hash = $1 AND used = 0 AND expires > $2",
        )
        .bind(token_hash(state))
        .bind(now)
        .execute(&self.backend.pool)
        .await?;
        if claimed.rows_affected() != 1 {
            // No identity is claimed here, so anyone can send these: aggregated, not one each.
            self.auth_failed(crate::failures::Failure {
                event: EventType::UserLogin,
                door: "api".into(),
                remote_addr: cb.remote_addr.clone().unwrap_or_default(),
                reason: "unknown, expired or reused login state".into(),
                user: None,
                user_exists: false,
                event_fields: vec![
                    ("method".into(), "oidc".into()),
                    (
                        "error".into(),
                        "unknown, expired or reused login state".into(),
                    ),
                ],
            })
            .await;
            return Err(AuthError::BadRequest(
                "this login link is unknown, expired or was already used; run `sally login` again"
                    .into(),
            ));
        }
        let row = sqlx::query("SELECT connector, nonce, pkce_verifier, client_redirect, ssh_public_key, ttl_secs FROM oidc_requests WHERE state_hash = $1")
            .bind(token_hash(state))
            .fetch_one(&self.backend.pool)
            .await?;
        let connector: String = row.try_get("connector")?;
        let client_redirect: String = row.try_get("client_redirect")?;
        let verified = match self.oidc_verify(cb, &row, &connector).await {
            Ok(v) => v,
            Err(Unverified { reason, error }) => {
                sqlx::query("DELETE FROM oidc_requests WHERE state_hash = $1")
                    .bind(token_hash(state))
                    .execute(&self.backend.pool)
                    .await?;
                // No identity is verified yet, and anyone can get this far (start, then call
                // back with an error or a made-up code): aggregated like a forged state.
                self.auth_failed(crate::failures::Failure {
                    event: EventType::UserLogin,
                    door: "api".into(),
                    remote_addr: cb.remote_addr.clone().unwrap_or_default(),
                    reason,
                    user: None,
                    user_exists: false,
                    event_fields: vec![
                        ("method".into(), "oidc".into()),
                        ("connector".into(), connector.into()),
                        ("error".into(), error.clone().into()),
                    ],
                })
                .await;
                return Ok(OidcRedirect {
                    location: next_location(&client_redirect, &[("error", &error)])?,
                });
            }
        };
        match self.oidc_complete(cb, verified, &connector).await {
            Ok((certs, matched, user)) => {
                let response = sallyport_core::random_hex(32);
                let text = serde_json::to_string(&certs)
                    .map_err(|e| AuthError::Internal(e.to_string()))?;
                sqlx::query("UPDATE oidc_requests SET response_hash = $1, result = $2 WHERE state_hash = $3")
                    .bind(token_hash(&response))
                    .bind(text)
                    .bind(token_hash(state))
                    .execute(&self.backend.pool)
                    .await?;
                self.emit(
                    Event::new(EventType::UserLogin, Some(&user))
                        .with("success", true)
                        .with("method", "oidc")
                        .with("connector", connector.clone())
                        .with(
                            "claims",
                            matched
                                .iter()
                                .map(|(c, v)| serde_json::json!({"claim": c, "value": v}))
                                .collect::<Vec<_>>(),
                        )
                        .with("roles", certs.roles.clone())
                        .with("remote_addr", cb.remote_addr.clone().unwrap_or_default()),
                )
                .await?;
                Ok(OidcRedirect {
                    location: next_location(&client_redirect, &[("response", &response)])?,
                })
            }
            Err((user, why)) => {
                sqlx::query("DELETE FROM oidc_requests WHERE state_hash = $1")
                    .bind(token_hash(state))
                    .execute(&self.backend.pool)
                    .await?;
                self.emit_logged(
                    Event::new(EventType::UserLogin, user.as_deref())
                        .with("success", false)
                        .with("method", "oidc")
                        .with("connector", connector)
                        .with("error", why.clone())
                        .with("remote_addr", cb.remote_addr.clone().unwrap_or_default()),
                )
                .await;
                Ok(OidcRedirect {
                    location: next_location(&client_redirect, &[("error", &why)])?,
                })
            }
        }
    }

    /// The provider's answer (an error, or a code to exchange) up to a verified ID token.
    async fn oidc_verify(
        &self,
        cb: &OidcCallback,
        row: &sqlx::any::AnyRow,
        connector: &str,
    ) -> Result<Verified, Unverified> {
        let fail = |e: String| Unverified::said(e);
        if let Some(err) = &cb.error {
            return Err(Unverified::because(
                "the identity provider answered with an error",
                format!(
                    "the identity provider refused: {}{}",
                    clip(err),
                    cb.error_description
                        .as_deref()
                        .map(|d| format!(" ({})", clip(d)))
                        .unwrap_or_default()
                ),
            ));
        }
        let code = cb
            .code
            .as_deref()
            .ok_or_else(|| fail("the provider sent no authorization code".into()))?;
        let get = |k: &str| -> Result<String, Unverified> {
            row.try_get::<String, _>(k).map_err(|e| fail(e.to_string()))
        };
        let (nonce, verifier, ssh_key) =
            (get("nonce")?, get("pkce_verifier")?, get("ssh_public_key")?);
        let ttl: Option<i64> = row.try_get("ttl_secs").map_err(|e| fail(e.to_string()))?;
        let c = self
            .connector(connector)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let secret = match (&c.spec.client_secret, &c.spec.client_secret_file) {
            (Some(s), _) => s.clone(),
            (None, Some(f)) => std::fs::read_to_string(f)
                .map(|s| s.trim().to_string())
                .map_err(|e| {
                    fail(format!(
                        "connector {connector}: client_secret_file {f}: {e}"
                    ))
                })?,
            (None, None) => {
                return Err(fail(format!("connector {connector} has no client secret")));
            }
        };
        let d = discover(&c.spec.issuer_url)
            .await
            .map_err(|e| fail(e.to_string()))?;
        let unreachable = "the identity provider cannot be reached";
        let resp = http()
            .map_err(|e| fail(e.to_string()))?
            .post(&d.token_endpoint)
            .basic_auth(form_encode(&c.spec.client_id), Some(form_encode(&secret)))
            .form(&[
                ("grant_type", "authorization_code"),
                ("code", code),
                ("redirect_uri", &c.spec.redirect_url),
                ("code_verifier", &verifier),
            ])
            .send()
            .await
            .map_err(|e| {
                Unverified::because(
                    unreachable,
                    provider_down(&c.spec.issuer_url, e).to_string(),
                )
            })?;
        let status = resp.status();
        let body: Value = resp.json().await.map_err(|e| {
            Unverified::because(
                "the provider's token response is not JSON",
                format!("the provider's token response: {e}"),
            )
        })?;
        if !status.is_success() {
            return Err(Unverified::because(
                "the provider refused the code exchange",
                format!(
                    "the provider refused the code exchange: {}",
                    clip(
                        body["error_description"]
                            .as_str()
                            .or(body["error"].as_str())
                            .unwrap_or("no reason given")
                    )
                ),
            ));
        }
        let id_token = body["id_token"]
            .as_str()
            .ok_or_else(|| fail("the provider returned no ID token".into()))?;
        let claims = verify_id_token(id_token, &d, &c.spec.client_id, &nonce)
            .await
            .map_err(fail)?;
        Ok(Verified {
            connector: c,
            discovery: d,
            claims,
            access_token: body["access_token"].as_str().map(str::to_string),
            ssh_key,
            ttl,
        })
    }

    /// UserInfo, mapping, user refresh and issuance for a verified ID token. Errors carry the
    /// user (when known) and a message for the person.
    async fn oidc_complete(
        &self,
        cb: &OidcCallback,
        v: Verified,
        connector: &str,
    ) -> Result<(Certs, Vec<(String, String)>, String), (Option<String>, String)> {
        let fail = |e: String| (None, e);
        let Verified {
            connector: c,
            discovery: d,
            mut claims,
            access_token,
            ssh_key,
            ttl,
        } = v;
        // Providers that follow the spec's default answer `email`, `groups` and the like only
        // at UserInfo for the code flow, leaving the ID token with `sub` and the protocol claims.
        if let (Some(endpoint), Some(access_token)) = (&d.userinfo_endpoint, &access_token) {
            let info = fetch_userinfo(endpoint, access_token, &c.spec.issuer_url)
                .await
                .map_err(fail)?;
            merge_userinfo(&mut claims, info).map_err(fail)?;
        }
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| fail("the ID token's subject (sub) is not a string".into()))?
            .to_string();
        let name = sallyport_core::oidc::username(&c.spec, &claims).map_err(fail)?;
        let (roles, matched) = map_roles(&c.spec.claims_to_roles, &claims);
        if roles.is_empty() {
            return Err((
                Some(name.clone()),
                format!(
                    "your identity provider's claims map to no Sallyport role (connector {connector}); ask an admin to add a claims_to_roles rule for you"
                ),
            ));
        }
        let traits = sallyport_core::oidc::traits(&claims);
        let identity = SsoIdentity {
            connector,
            issuer: &d.issuer,
            subject: &subject,
        };
        let sso = self
            .upsert_sso_user(&name, &identity, &roles, &traits)
            .await
            .map_err(|e| (Some(name.clone()), e.to_string()))?;
        if sso.adopted {
            // A user from before identities were stored: say which identity now owns it.
            self.emit(
                Event::new(EventType::UserSsoLink, Some(&name))
                    .with("connector", connector)
                    .with("issuer", d.issuer.clone())
                    .with("subject", subject.clone()),
            )
            .await
            .map_err(|e| (Some(name.clone()), e.to_string()))?;
        }
        let user = sso.record;
        self.check_lock(&name)
            .await
            .map_err(|e| (Some(name.clone()), e.to_string()))?;
        let req = LoginRequest {
            user: name.clone(),
            password: String::new(),
            otp_code: None,
            ssh_public_key: ssh_key,
            ttl_secs: ttl.and_then(|t| u64::try_from(t).ok()),
            remote_addr: cb.remote_addr.clone(),
            web: false,
        };
        let certs = self
            .issue_user_certs(&user, &req)
            .await
            .map_err(|e| (Some(name.clone()), e.to_string()))?;
        Ok((certs, matched, name))
    }

    /// `sally` redeems its response code (once) with its client key.
    pub async fn oidc_finish(&self, f: &OidcFinish) -> Result<Certs, AuthError> {
        let row = sqlx::query(
            "SELECT state_hash, client_key_hash, result FROM oidc_requests WHERE response_hash = $1",
        )
        .bind(token_hash(&f.response))
        .fetch_optional(&self.backend.pool)
        .await?
        .ok_or_else(|| AuthError::Unauthenticated("unknown or already redeemed login response".into()))?;
        let key_hash: String = row.try_get("client_key_hash")?;
        if !sallyport_core::secrets_equal(key_hash.as_bytes(), token_hash(&f.client_key).as_bytes())
        {
            return Err(AuthError::Unauthenticated(
                "this login response belongs to another client".into(),
            ));
        }
        let state_hash: String = row.try_get("state_hash")?;
        let gone = sqlx::query("DELETE FROM oidc_requests WHERE state_hash = $1")
            .bind(&state_hash)
            .execute(&self.backend.pool)
            .await?;
        if gone.rows_affected() != 1 {
            return Err(AuthError::Unauthenticated("already redeemed".into()));
        }
        let text: Option<String> = row.try_get("result")?;
        let text =
            text.ok_or_else(|| AuthError::Unauthenticated("the login did not finish".into()))?;
        serde_json::from_str(&text).map_err(|e| AuthError::Internal(e.to_string()))
    }
}
