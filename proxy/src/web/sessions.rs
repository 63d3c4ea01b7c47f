//! Browsers' web sessions: what a signed-in browser is to the proxy. The browser holds only a
//! random id in the `__Host-sallyport_session` cookie; the proxy keeps the id's SHA-256, the
//! session's key and certificates (auth certified them at login with the usual checks), a
//! CSRF token, when the person last did something, and the terminals the session has open.
//!
//! Every call to auth on the session's behalf is made as the session's own certificate
//! ([`WebSession::auth`]), so auth decides with the user's current roles and locks and the
//! caller is what the TLS handshake proved. A session ends at logout, after `web_idle_timeout`
//! without input (terminal input and requests that change something count; reading, polling
//! included, does not), at its certificate's expiry, and when its user is locked (through
//! [`ProxyState`]'s lock poll, within its 2 s); its terminals end with it.
//!
//! What this must never do: keep the id itself, compare an id or token in variable time, or
//! log either.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sallyport_core::unix_now_ms;

use crate::AuthClient;
use crate::state::{HangUp, ProxyState};

/// The cookie's name: `__Host-` makes browsers refuse it unless it is `Secure`, has
/// `Path=/` and no `Domain`, so no other host can plant or read it.
pub const COOKIE: &str = "__Host-sallyport_session";

/// `web_idle_timeout`'s default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Web sessions one user may hold at once; signing in past it ends the oldest.
pub const MAX_PER_USER: usize = 32;
/// Web sessions the proxy holds at once; signing in past it ends the oldest.
pub const MAX_SESSIONS: usize = 10_000;
/// How often sessions are checked for idleness and expiry.
const SWEEP: Duration = Duration::from_secs(1);

/// Why a terminal ends when its web session does: its close code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub code: u16,
    pub message: String,
}

/// 4401: signed out or expired; 4409: locked.
pub const CLOSE_SIGNED_OUT: u16 = 4401;
pub const CLOSE_LOCKED: u16 = 4409;

/// A terminal of a web session: told once how it must end.
pub trait Terminal: Send + Sync {
    fn end(&self, why: Ending);
}

/// One signed-in browser.
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
    csrf: String,
    id_hash: [u8; 32],
    created_ms: u64,
    last_input_ms: AtomicU64,
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

    /// The person did something (terminal input, a request that changes something).
    pub fn touch(&self) {
        self.last_input_ms.store(unix_now_ms(), Ordering::Relaxed);
    }

    /// Whether the session is over: signed out, locked, idle (as the sweep found it) or past
    /// its certificate. Work that outlives a request (a download) asks between its pieces.
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire) || unix_now_ms() / 1000 >= self.expires
    }

    /// Why the session is over at `now_ms`, if it is.
    fn over(&self, now_ms: u64, idle: Duration) -> Option<Ending> {
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
        let quiet = now_ms.saturating_sub(self.last_input_ms.load(Ordering::Relaxed));
        if quiet >= idle.as_millis() as u64 {
            return Some(Ending {
                code: CLOSE_SIGNED_OUT,
                message: format!(
                    "your web session ended after {} without input (web_idle_timeout); sign in again",
                    sallyport_core::duration::format(idle)
                ),
            });
        }
        None
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

/// What a login earned, to make a session of.
pub struct Earned {
    pub user: String,
    pub roles: Vec<String>,
    pub logins: Vec<String>,
    pub expires: u64,
    pub valid_until: String,
    pub auth: AuthClient,
}

/// Every web session of this proxy, by the SHA-256 of its id.
pub struct WebSessions {
    state: Arc<ProxyState>,
    idle: Duration,
    by_hash: Mutex<HashMap<[u8; 32], Arc<WebSession>>>,
}

/// Ends a web session when its user is locked (the proxy's lock poll).
struct LockEnds {
    sessions: Weak<WebSessions>,
    hash: [u8; 32],
}

impl HangUp for LockEnds {
    fn hang_up(&self, why: String) {
        if let Some(s) = self.sessions.upgrade() {
            s.remove(
                &self.hash,
                Ending {
                    code: CLOSE_LOCKED,
                    message: why,
                },
            );
        }
    }
}

impl WebSessions {
    /// Sessions of `state`'s proxy, ended after `idle` without input; a task sweeps out the
    /// idle and expired ones for as long as the store lives.
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

    /// A new session for what a login earned; returns it and the id for the cookie (never kept).
    pub fn create(self: &Arc<Self>, earned: Earned) -> (Arc<WebSession>, String) {
        let id = sallyport_core::random_hex(32);
        let hash = sallyport_core::sha256(id.as_bytes());
        let now = unix_now_ms();
        let live_id = crate::state::next_id();
        let session = Arc::new(WebSession {
            user: earned.user,
            roles: earned.roles,
            logins: earned.logins,
            expires: earned.expires,
            valid_until: earned.valid_until,
            auth: earned.auth,
            csrf: sallyport_core::random_hex(32),
            id_hash: hash,
            created_ms: now,
            last_input_ms: AtomicU64::new(now),
            ended: AtomicBool::new(false),
            live_id,
            terminals: Mutex::new(HashMap::new()),
        });
        let mut evicted = Vec::new();
        if let Ok(mut map) = self.by_hash.lock() {
            let mut mine: Vec<([u8; 32], u64)> = map
                .iter()
                .filter(|(_, s)| s.user == session.user)
                .map(|(h, s)| (*h, s.created_ms))
                .collect();
            if mine.len() >= MAX_PER_USER {
                mine.sort_by_key(|(_, c)| *c);
                evicted.extend(
                    mine.iter()
                        .take(mine.len() + 1 - MAX_PER_USER)
                        .map(|(h, _)| *h),
                );
            }
            if map.len() >= MAX_SESSIONS
                && let Some((h, _)) = map.iter().min_by_key(|(_, s)| s.created_ms)
            {
                evicted.push(*h);
            }
            map.insert(hash, session.clone());
        }
        for h in evicted {
            self.remove(
                &h,
                Ending {
                    code: CLOSE_SIGNED_OUT,
                    message: "too many web sessions: this one, the oldest, was signed out".into(),
                },
            );
        }
        self.state.track(
            live_id,
            &session.user,
            Arc::new(LockEnds {
                sessions: Arc::downgrade(self),
                hash,
            }),
        );
        (session, id)
    }

    /// The live session whose id is `presented` (the cookie's value), if there is one. An idle,
    /// expired or locked one is ended here rather than returned.
    pub fn find(&self, presented: &str) -> Option<Arc<WebSession>> {
        let hash = sallyport_core::sha256(presented.as_bytes());
        let found = self.by_hash.lock().ok()?.get(&hash).cloned()?;
        // The map found it by hash; the hash is compared again in constant time.
        if !sallyport_core::secrets_equal(&found.id_hash, &hash) {
            return None;
        }
        if let Some(why) = self.state.lock_of(&found.user) {
            self.remove(
                &hash,
                Ending {
                    code: CLOSE_LOCKED,
                    message: format!("user {} is locked: {why}", found.user),
                },
            );
            return None;
        }
        if let Some(why) = found.over(unix_now_ms(), self.idle) {
            self.remove(&hash, why);
            return None;
        }
        Some(found)
    }

    /// Signs `session` out: forgotten here, its terminals ended.
    pub fn sign_out(&self, session: &WebSession) {
        self.remove(
            &session.id_hash,
            Ending {
                code: CLOSE_SIGNED_OUT,
                message: "you signed out".into(),
            },
        );
    }

    fn remove(&self, hash: &[u8; 32], why: Ending) {
        let gone = self.by_hash.lock().ok().and_then(|mut m| m.remove(hash));
        if let Some(s) = gone {
            self.state.untrack(s.live_id);
            s.end(why);
        }
    }

    /// Ends the sessions that are over.
    fn sweep_once(&self) {
        let now = unix_now_ms();
        let over: Vec<([u8; 32], Ending)> = match self.by_hash.lock() {
            Ok(m) => m
                .iter()
                .filter_map(|(h, s)| s.over(now, self.idle).map(|w| (*h, w)))
                .collect(),
            Err(_) => vec![],
        };
        for (h, why) in over {
            self.remove(&h, why);
        }
    }

    /// How many sessions are held (tests, metrics).
    pub fn len(&self) -> usize {
        self.by_hash.lock().map(|m| m.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

async fn sweep(sessions: Weak<WebSessions>) {
    loop {
        tokio::time::sleep(SWEEP).await;
        match sessions.upgrade() {
            Some(s) => s.sweep_once(),
            None => return,
        }
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
