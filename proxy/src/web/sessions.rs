//! Browsers' web sessions: what a signed-in browser is to the proxy. The browser holds only a
//! random id in the `__Host-sallyport_session` cookie; auth keeps, for every proxy, the id's
//! SHA-256, the session's key and certificates (auth certified them at login with the usual
//! checks), a CSRF token and when the person last did something (`auth::web_sessions`). Behind a
//! load balancer a browser's next request may reach another proxy: that proxy looks the session
//! up in auth by the hash and keeps it in a small cache ([`WebSessions`]), with the terminals the
//! session has open here (a WebSocket is one connection to one proxy; terminals stay where they
//! run).
//!
//! Every call to auth on the session's behalf is made as the session's own certificate
//! ([`WebSession::auth`]), so auth decides with the user's current roles and locks and the
//! caller is what the TLS handshake proved. A session ends:
//! - at sign-out, on any proxy: auth marks it ended; every proxy asks auth every
//!   [`CHECK_EVERY`] (2 s) which of its cached sessions still exist, so the terminals on the
//!   others end within seconds, with the same close code and words;
//! - after `web_idle_timeout` without input (terminal input and requests that change something
//!   count; reading, polling included, does not). The proxy that opened the session sets the
//!   timeout for every proxy. Input is written to auth at most once per session per
//!   [`input_throttle`] (a 32nd of the timeout, at most 30 s) from each proxy, so a proxy ends
//!   an idle session only once it has been quiet for the timeout plus that lag (and one sweep),
//!   after asking auth once more;
//! - at its certificate's expiry;
//! - when its user is locked: auth ends the user's sessions when the lock is added, and each
//!   proxy's lock poll (2 s) ends the terminals it holds;
//! - past [`MAX_PER_USER`] sessions of one user or [`MAX_SESSIONS`] in the cluster, the oldest.
//!
//! What this must never do: keep or send the id itself (auth gets its hash), compare an id or
//! token in variable time, or log either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sallyport_core::api::{
    WebSessionCheck, WebSessionCreated, WebSessionEnding, WebSessionRecord, WebSessionState,
    WebSessionTouch,
};
use sallyport_core::routes::auth as routes;
use sallyport_core::unix_now_ms;

use crate::AuthClient;
use crate::auth_client::ClientError;
use crate::state::{HangUp, ProxyState};

/// The cookie's name: `__Host-` makes browsers refuse it unless it is `Secure`, has
/// `Path=/` and no `Domain`, so no other host can plant or read it.
pub const COOKIE: &str = "__Host-sallyport_session";

/// `web_idle_timeout`'s default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Web sessions one user may hold at once; signing in past it ends the oldest (auth counts).
pub const MAX_PER_USER: usize = sallyport_core::api::MAX_WEB_SESSIONS_PER_USER;
/// Web sessions the cluster holds at once; signing in past it ends the oldest (auth counts).
pub const MAX_SESSIONS: usize = sallyport_core::api::MAX_WEB_SESSIONS;
/// How often cached sessions are checked for idleness and expiry, and input is written.
const SWEEP: Duration = Duration::from_secs(1);
/// How often auth is asked which cached sessions still exist.
pub const CHECK_EVERY: Duration = Duration::from_secs(2);
/// A cached session without terminals that no request used for this long is dropped from the
/// cache (auth still has it; the next request looks it up again).
const CACHE_KEEP: Duration = Duration::from_secs(300);

/// How often one proxy writes a session's input to auth, at most: idle timeouts are minutes,
/// so a 32nd of one (at most 30 s) costs little precision and most of the writes.
pub fn input_throttle(idle: Duration) -> Duration {
    (idle / 32).min(Duration::from_secs(30))
}

/// Why a terminal ends when its web session does: its close code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub code: u16,
    pub message: String,
}

impl From<WebSessionEnding> for Ending {
    fn from(e: WebSessionEnding) -> Self {
        Ending {
            code: e.code,
            message: e.message,
        }
    }
}

/// 4401: signed out or expired; 4409: locked.
pub const CLOSE_SIGNED_OUT: u16 = sallyport_core::api::WEB_CLOSE_SIGNED_OUT;
pub const CLOSE_LOCKED: u16 = sallyport_core::api::WEB_CLOSE_LOCKED;

/// A terminal of a web session: told once how it must end.
pub trait Terminal: Send + Sync {
    fn end(&self, why: Ending);
}

/// One signed-in browser, as this proxy holds it.
pub struct WebSession {
    pub user: String,
    pub roles: Vec<String>,
    /// The logins in the session's certificate.
    pub logins: Vec<String>,
    /// The certificate's expiry (Unix seconds), the session's hard end.
    pub expires: u64,
    /// RFC 3339 of the same.
    pub valid_until: String,
    /// auth, called as this session's certificate.
    pub auth: AuthClient,
    /// auth, called as this proxy (the session's own record).
    service: AuthClient,
    /// `web_idle_timeout` of the proxy that opened it.
    pub idle: Duration,
    csrf: String,
    id_hash: [u8; 32],
    /// The latest input known here: this proxy's own, or another's as auth reported it.
    last_input_ms: AtomicU64,
    /// The latest input auth has, as far as this proxy knows.
    written_ms: AtomicU64,
    /// When a request last found it here (the cache keeps what is used).
    used_ms: AtomicU64,
    ended: AtomicBool,
    /// Its entry among the proxy's live connections, which a lock ends.
    live_id: u64,
    terminals: Mutex<HashMap<u64, Arc<dyn Terminal>>>,
}

impl WebSession {
    /// The CSRF token every request that changes something must carry in `X-CSRF-Token`.
    pub fn csrf_token(&self) -> &str {
        &self.csrf
    }

    /// Whether `presented` is this session's CSRF token (constant time).
    pub fn csrf_matches(&self, presented: &str) -> bool {
        sallyport_core::secrets_equal(presented.as_bytes(), self.csrf.as_bytes())
    }

    fn hash_hex(&self) -> String {
        hex::encode(self.id_hash)
    }

    /// The person did something (terminal input, a request that changes something). Written
    /// to auth now when the last write is older than [`input_throttle`], else by the sweep.
    pub fn touch(&self) {
        let now = unix_now_ms();
        self.last_input_ms.fetch_max(now, Ordering::Relaxed);
        self.flush_input(now);
    }

    /// Writes the latest input to auth when it is newer than what auth has and the last write
    /// is at least [`input_throttle`] old.
    fn flush_input(&self, now: u64) {
        let input = self.last_input_ms.load(Ordering::Relaxed);
        let written = self.written_ms.load(Ordering::Relaxed);
        if input <= written
            || now.saturating_sub(written) < input_throttle(self.idle).as_millis() as u64
        {
            return;
        }
        if self
            .written_ms
            .compare_exchange(written, input, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        let service = self.service.clone();
        let path = routes::web_session_touch(&self.hash_hex());
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                let touched: Result<serde_json::Value, _> = service
                    .json(
                        reqwest::Method::POST,
                        &path,
                        Some(&WebSessionTouch {
                            last_input_ms: input,
                        }),
                    )
                    .await;
                // A session gone from auth is found out by the next check.
                if let Err(e @ (ClientError::Unreachable { .. } | ClientError::Local(_))) = touched
                {
                    tracing::warn!(error = %e, "a web session's input not written to auth");
                }
            });
        }
    }

    /// Whether the session is over: signed out, locked, idle (as the sweep found it) or past
    /// its certificate. Work that outlives a request (a download) asks between its pieces.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire) || unix_now_ms() / 1000 >= self.expires
    }

    /// Why the session is over at `now_ms` as far as this proxy knows, if it is. Idleness
    /// counts another proxy's input not yet written (at most [`input_throttle`] and a sweep
    /// old) as if it were there.
    fn over(&self, now_ms: u64) -> Option<Ending> {
        if self.ended.load(Ordering::Acquire) {
            return Some(Ending {
                code: CLOSE_SIGNED_OUT,
                message: "you are signed out; sign in again".into(),
            });
        }
        if now_ms / 1000 >= self.expires {
            return Some(Ending {
                code: CLOSE_SIGNED_OUT,
                message: format!(
                    "your web session's certificate expired at {}; sign in again",
                    self.valid_until
                ),
            });
        }
        if self.quiet_ms(now_ms) >= self.idle.as_millis() as u64 {
            return Some(self.idle_ending());
        }
        None
    }

    fn quiet_ms(&self, now_ms: u64) -> u64 {
        let lag = (input_throttle(self.idle) + SWEEP).as_millis() as u64;
        let mine = self.last_input_ms.load(Ordering::Relaxed);
        let theirs = self.written_ms.load(Ordering::Relaxed) + lag;
        now_ms.saturating_sub(mine.max(theirs))
    }

    fn idle_ending(&self) -> Ending {
        Ending {
            code: CLOSE_SIGNED_OUT,
            message: format!(
                "your web session ended after {} without input (web_idle_timeout); sign in again",
                sallyport_core::duration::format(self.idle)
            ),
        }
    }

    /// Adds a terminal, ended with the session. `None` when the session is already over.
    pub fn add_terminal(&self, id: u64, t: Arc<dyn Terminal>) -> bool {
        let Ok(mut terms) = self.terminals.lock() else {
            return false;
        };
        if self.ended.load(Ordering::Acquire) {
            return false;
        }
        terms.insert(id, t);
        true
    }

    pub fn remove_terminal(&self, id: u64) {
        if let Ok(mut t) = self.terminals.lock() {
            t.remove(&id);
        }
    }

    fn has_terminals(&self) -> bool {
        self.terminals.lock().map(|t| !t.is_empty()).unwrap_or(true)
    }

    /// Ends the session's terminals with `why`; the session is over from now on.
    fn end(&self, why: Ending) {
        let terms: Vec<Arc<dyn Terminal>> = match self.terminals.lock() {
            Ok(mut t) => {
                self.ended.store(true, Ordering::Release);
                t.drain().map(|(_, t)| t).collect()
            }
            Err(_) => {
                self.ended.store(true, Ordering::Release);
                vec![]
            }
        };
        for t in terms {
            t.end(why.clone());
        }
    }
}

impl std::fmt::Debug for WebSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebSession")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

/// What a login earned, to make a session of: the certificate auth issued over the proxy's key.
pub struct Earned {
    pub user: String,
    pub roles: Vec<String>,
    pub logins: Vec<String>,
    pub expires: u64,
    pub valid_until: String,
    pub cert_chain_pem: String,
    pub key_pem: String,
}

/// The web sessions this proxy holds: a cache of auth's, by the SHA-256 of their ids.
pub struct WebSessions {
    state: Arc<ProxyState>,
    idle: Duration,
    by_hash: Mutex<HashMap<[u8; 32], Arc<WebSession>>>,
}

/// Ends a web session when its user is locked (the proxy's lock poll); auth ended it already
/// when the lock was added.
struct LockEnds {
    sessions: Weak<WebSessions>,
    hash: [u8; 32],
}

impl HangUp for LockEnds {
    fn hang_up(&self, why: String) {
        if let Some(s) = self.sessions.upgrade() {
            s.forget(
                &self.hash,
                Ending {
                    code: CLOSE_LOCKED,
                    message: why,
                },
            );
        }
    }
}

/// A refusal of auth's for the session that says it is gone (not an outage).
fn gone(e: &ClientError) -> bool {
    matches!(e, ClientError::Refused { status: 404, .. })
}

impl WebSessions {
    /// Sessions of `state`'s proxy; the ones it opens end after `idle` without input. A task
    /// sweeps out the idle and expired ones, writes input and asks auth which still exist, for
    /// as long as the store lives.
    pub fn new(state: Arc<ProxyState>, idle: Duration) -> Arc<Self> {
        let s = Arc::new(WebSessions {
            state,
            idle,
            by_hash: Mutex::new(HashMap::new()),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(sweep(Arc::downgrade(&s)));
        }
        s
    }

    pub fn idle_timeout(&self) -> Duration {
        self.idle
    }

    /// The cached session for `record`, made and tracked for locks when it is new here.
    fn hold(
        self: &Arc<Self>,
        record: WebSessionRecord,
        hash: [u8; 32],
    ) -> Result<Arc<WebSession>, ClientError> {
        let auth = self
            .state
            .auth
            .as_identity(&record.cert_chain_pem, &record.key_pem)?;
        let now = unix_now_ms();
        let session = Arc::new(WebSession {
            user: record.user,
            roles: record.roles,
            logins: record.logins,
            expires: record.expires,
            valid_until: record.valid_until,
            auth,
            service: self.state.auth.clone(),
            idle: Duration::from_millis(record.idle_ms),
            csrf: record.csrf_token,
            id_hash: hash,
            last_input_ms: AtomicU64::new(record.last_input_ms),
            written_ms: AtomicU64::new(record.last_input_ms),
            used_ms: AtomicU64::new(now),
            ended: AtomicBool::new(false),
            live_id: crate::state::next_id(),
            terminals: Mutex::new(HashMap::new()),
        });
        let held = match self.by_hash.lock() {
            Ok(mut map) => map.entry(hash).or_insert_with(|| session.clone()).clone(),
            Err(_) => session.clone(),
        };
        if Arc::ptr_eq(&held, &session) {
            self.state.track(
                session.live_id,
                &session.user,
                Arc::new(LockEnds {
                    sessions: Arc::downgrade(self),
                    hash,
                }),
            );
        }
        Ok(held)
    }

    /// A new session for what a login earned, kept by auth for every proxy; returns it and the
    /// id for the cookie (never kept). The sessions auth ended to make room end here at once.
    pub async fn create(
        self: &Arc<Self>,
        earned: Earned,
    ) -> Result<(Arc<WebSession>, String), ClientError> {
        let id = sallyport_core::random_hex(32);
        let hash = sallyport_core::sha256(id.as_bytes());
        let now = unix_now_ms();
        let record = WebSessionRecord {
            id_hash: hex::encode(hash),
            user: earned.user,
            roles: earned.roles,
            logins: earned.logins,
            cert_chain_pem: earned.cert_chain_pem,
            key_pem: earned.key_pem,
            csrf_token: sallyport_core::random_hex(32),
            created_ms: now,
            last_input_ms: now,
            expires: earned.expires,
            valid_until: earned.valid_until,
            idle_ms: self.idle.as_millis() as u64,
        };
        let created: WebSessionCreated = self
            .state
            .auth
            .json(reqwest::Method::POST, routes::WEB_SESSIONS, Some(&record))
            .await?;
        for h in created.evicted {
            if let Some(h) = decode_hash(&h) {
                self.forget(
                    &h,
                    Ending {
                        code: CLOSE_SIGNED_OUT,
                        message: "too many web sessions: this one, the oldest, was signed out"
                            .into(),
                    },
                );
            }
        }
        let session = self.hold(record, hash)?;
        Ok((session, id))
    }

    /// The live session whose id is `presented` (the cookie's value), if there is one: from
    /// the cache, or looked up in auth (another proxy may have opened it). An idle, expired or
    /// locked one is ended here rather than returned. An error: auth could not be asked.
    pub async fn find(
        self: &Arc<Self>,
        presented: &str,
    ) -> Result<Option<Arc<WebSession>>, ClientError> {
        let hash = sallyport_core::sha256(presented.as_bytes());
        let cached = self.by_hash.lock().ok().and_then(|m| m.get(&hash).cloned());
        let found = match cached {
            // The map found it by hash; the hash is compared again in constant time.
            Some(s) if sallyport_core::secrets_equal(&s.id_hash, &hash) => s,
            Some(_) => return Ok(None),
            None => {
                let looked_up: Result<WebSessionRecord, _> = self
                    .state
                    .auth
                    .json::<(), _>(
                        reqwest::Method::GET,
                        &routes::web_session(&hex::encode(hash)),
                        None,
                    )
                    .await;
                match looked_up {
                    Ok(r) => self.hold(r, hash)?,
                    Err(e) if gone(&e) => return Ok(None),
                    Err(e) => return Err(e),
                }
            }
        };
        found.used_ms.store(unix_now_ms(), Ordering::Relaxed);
        if let Some(why) = self.state.lock_of(&found.user) {
            self.forget(
                &hash,
                Ending {
                    code: CLOSE_LOCKED,
                    message: format!("user {} is locked: {why}", found.user),
                },
            );
            return Ok(None);
        }
        if let Some(why) = self.judge(&found).await {
            self.end_everywhere(&found, why).await;
            return Ok(None);
        }
        Ok(Some(found))
    }

    /// Why `s` is over, if it is. A session idle as far as this proxy knows is asked of auth
    /// once more: input on another proxy may not have reached this one yet.
    async fn judge(&self, s: &WebSession) -> Option<Ending> {
        let now = unix_now_ms();
        let why = s.over(now)?;
        if s.quiet_ms(now) < s.idle.as_millis() as u64 {
            return Some(why);
        }
        let fresh: Result<WebSessionRecord, _> = self
            .state
            .auth
            .json::<(), _>(
                reqwest::Method::GET,
                &routes::web_session(&s.hash_hex()),
                None,
            )
            .await;
        match fresh {
            Ok(r) => {
                s.last_input_ms
                    .fetch_max(r.last_input_ms, Ordering::Relaxed);
                s.written_ms.fetch_max(r.last_input_ms, Ordering::Relaxed);
                s.over(unix_now_ms())
            }
            Err(e) if gone(&e) => Some(Ending {
                code: CLOSE_SIGNED_OUT,
                message: "you are signed out; sign in again".into(),
            }),
            // auth cannot say: idle as far as anyone here knows.
            Err(_) => Some(why),
        }
    }

    /// Signs `session` out, for every proxy: auth ends it, then it is forgotten here and its
    /// terminals ended. An error: auth could not be told, and the session lives on.
    pub async fn sign_out(&self, session: &WebSession) -> Result<(), ClientError> {
        let why = Ending {
            code: CLOSE_SIGNED_OUT,
            message: "you signed out".into(),
        };
        match self.tell_auth(session, &why).await {
            Ok(()) => {}
            Err(e) if gone(&e) => {}
            Err(e) => return Err(e),
        }
        self.forget(&session.id_hash, why);
        Ok(())
    }

    /// Ends `session` here and tells auth why, so every proxy ends it with the same words.
    async fn end_everywhere(&self, session: &WebSession, why: Ending) {
        self.forget(&session.id_hash, why.clone());
        if let Err(e) = self.tell_auth(session, &why).await
            && !gone(&e)
        {
            tracing::warn!(error = %e, "auth not told of a web session's end");
        }
    }

    async fn tell_auth(&self, session: &WebSession, why: &Ending) -> Result<(), ClientError> {
        self.state
            .auth
            .json::<_, serde_json::Value>(
                reqwest::Method::POST,
                &routes::web_session_end(&session.hash_hex()),
                Some(&WebSessionEnding {
                    code: why.code,
                    message: why.message.clone(),
                }),
            )
            .await
            .map(|_| ())
    }

    /// Forgets session `hash` here and ends its terminals with `why`.
    fn forget(&self, hash: &[u8; 32], why: Ending) {
        let gone = self.by_hash.lock().ok().and_then(|mut m| m.remove(hash));
        if let Some(s) = gone {
            self.state.untrack(s.live_id);
            s.end(why);
        }
    }

    /// Drops `hash` from the cache without ending it (auth keeps it).
    fn uncache(&self, hash: &[u8; 32]) {
        let gone = self.by_hash.lock().ok().and_then(|mut m| m.remove(hash));
        if let Some(s) = gone {
            self.state.untrack(s.live_id);
        }
    }

    fn cached(&self) -> Vec<Arc<WebSession>> {
        self.by_hash
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Writes input not yet written, ends the sessions that are over, drops what nobody uses.
    async fn sweep_once(&self) {
        let now = unix_now_ms();
        for s in self.cached() {
            s.flush_input(now);
            if s.over(now).is_some() {
                if let Some(why) = self.judge(&s).await {
                    self.end_everywhere(&s, why).await;
                }
                continue;
            }
            let unused = now.saturating_sub(s.used_ms.load(Ordering::Relaxed));
            if unused >= CACHE_KEEP.as_millis() as u64 && !s.has_terminals() {
                self.uncache(&s.id_hash);
            }
        }
    }

    /// Asks auth which cached sessions still exist: the gone and ended ones end here (with
    /// auth's words when it still has them), the others learn the latest input.
    async fn check_once(&self) {
        let held = self.cached();
        for chunk in held.chunks(1000) {
            let ask = WebSessionCheck {
                id_hashes: chunk.iter().map(|s| s.hash_hex()).collect(),
            };
            let states: Vec<WebSessionState> = match self
                .state
                .auth
                .json(
                    reqwest::Method::POST,
                    routes::WEB_SESSIONS_CHECK,
                    Some(&ask),
                )
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot check web sessions with auth");
                    return;
                }
            };
            let by_hash: HashMap<&str, &WebSessionState> =
                states.iter().map(|s| (s.id_hash.as_str(), s)).collect();
            for s in chunk {
                match by_hash.get(s.hash_hex().as_str()) {
                    Some(WebSessionState {
                        ended: Some(why), ..
                    }) => self.forget(&s.id_hash, why.clone().into()),
                    Some(state) => {
                        s.last_input_ms
                            .fetch_max(state.last_input_ms, Ordering::Relaxed);
                        s.written_ms
                            .fetch_max(state.last_input_ms, Ordering::Relaxed);
                    }
                    None => self.forget(
                        &s.id_hash,
                        Ending {
                            code: CLOSE_SIGNED_OUT,
                            message: "you are signed out; sign in again".into(),
                        },
                    ),
                }
            }
        }
    }

    /// How many sessions are held here (tests, metrics).
    pub fn len(&self) -> usize {
        self.by_hash.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn decode_hash(h: &str) -> Option<[u8; 32]> {
    hex::decode(h).ok()?.try_into().ok()
}

async fn sweep(sessions: Weak<WebSessions>) {
    let mut since_check = Duration::ZERO;
    loop {
        tokio::time::sleep(SWEEP).await;
        let Some(s) = sessions.upgrade() else {
            return;
        };
        since_check += SWEEP;
        if since_check >= CHECK_EVERY {
            since_check = Duration::ZERO;
            s.check_once().await;
        }
        s.sweep_once().await;
    }
}

/// The session id in a `Cookie` header, if one names [`COOKIE`].
pub fn cookie_value(headers: &axum::http::HeaderMap) -> Option<String> {
    cookie_named(headers, COOKIE)
}

/// The value of the cookie named exactly `name` in the request's `Cookie` headers.
pub fn cookie_named(headers: &axum::http::HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(axum::http::header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim().to_string())
}

/// The `Set-Cookie` value for a new session's id.
pub fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; HttpOnly; Secure; SameSite=Strict; Path=/")
}

/// The `Set-Cookie` value that removes the cookie.
pub fn clear_cookie() -> String {
    format!("{COOKIE}=; HttpOnly; Secure; SameSite=Strict; Path=/; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::{HeaderMap, HeaderValue, header};

    #[test]
    fn the_cookie_is_found_among_others_and_only_by_its_exact_name() {
        for (cookies, want) in [
            (vec!["__Host-sallyport_session=abc"], Some("abc")),
            (vec!["a=1; __Host-sallyport_session=abc; b=2"], Some("abc")),
            (vec!["a=1", "__Host-sallyport_session=xyz"], Some("xyz")),
            (vec!["sallyport_session=abc"], None),
            (vec!["__Host-sallyport_session_x=abc"], None),
            (vec![], None),
        ] {
            let mut h = HeaderMap::new();
            for c in cookies.iter() {
                h.append(
                    header::COOKIE,
                    HeaderValue::from_str(c).unwrap_or_else(|e| panic!("{e}")),
                );
            }
            assert_eq!(cookie_value(&h).as_deref(), want, "{cookies:?}");
        }
    }

    #[test]
    fn the_cookie_is_host_only_http_only_secure_and_strict() {
        let c = set_cookie("x");
        for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(c.contains(flag), "{c}");
        }
        assert!(!c.contains("Domain"), "{c}");
    }
}
