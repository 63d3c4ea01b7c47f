//! Failed authentication, audited so that a flood cannot flood the log.
//!
//! Every failure at every door (`ssh` and `tunnel` reported by the proxy, `api` for auth's own
//! API and the login endpoints) goes through [`Failures`], keyed by (event, door, address,
//! reason, and the user when the name is a real user's). The first failure of a key in a
//! minute is audited at once with `count: 1`; the ones after it are only counted, and when the
//! minute closes one event stands for them all with their `count`, carrying the latest
//! attempt's details. A flood therefore costs at most one audit record per key per minute, and
//! the counts of a key's events add up to its failures.
//!
//! The address is keyed without its port: every connection has a new port. User names that
//! are not users (anyone can type one) are not part of the key, and the table of keys is
//! bounded: past [`MAX_KEYS`] new keys share one overflow key per door.
//!
//! This module never decides whether something failed, and never sees a password or code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sallyport_core::api::AuthFailure;
use sallyport_core::audit::Event;

use crate::AuthServer;

/// How long one aggregation window lasts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Keys tracked at once; beyond this, new keys are counted under an overflow key.
pub const MAX_KEYS: usize = 10_000;
/// Failures in one report from a proxy.
pub const MAX_BATCH: usize = 1000;
/// Longest text kept from a reported field, and most fields of what was presented.
const MAX_TEXT: usize = 256;
const MAX_PRESENTED: usize = 16;
/// How often closed windows are looked for.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    event: String,
    door: String,
    address: String,
    reason: String,
    user: Option<String>,
}

struct Window {
    opened: Instant,
    /// Failures after the one emitted when the window opened.
    counted: u64,
    /// The latest counted failure, emitted with the count when the window closes.
    latest: Option<Event>,
}

/// The aggregation state (one per auth process).
#[derive(Default)]
pub struct Failures {
    windows: Mutex<HashMap<Key, Window>>,
}

/// One failure as the doors describe it.
pub struct Failure {
    /// `auth.failed`, or `user.login` for the login endpoints (which audit their failures as
    /// unsuccessful logins, as they always have).
    pub event: &'static str,
    pub door: String,
    pub remote_addr: String,
    pub reason: String,
    /// The name the client asked for.
    pub user: Option<String>,
    /// Whether `user` names a real user (then it is part of the key).
    pub user_exists: bool,
    /// The rest of the event (identity presented, method, error shown).
    pub event_fields: Vec<(String, serde_json::Value)>,
}

impl Failure {
    /// A failure a proxy reported.
    pub fn reported(r: &AuthFailure) -> Self {
        let presented: serde_json::Map<String, serde_json::Value> = r
            .presented
            .iter()
            .take(MAX_PRESENTED)
            .map(|(k, v)| (clip(k), clip(v).into()))
            .collect();
        Failure {
            event: "auth.failed",
            door: clip(&r.door),
            remote_addr: clip(&r.remote_addr),
            reason: clip(&r.reason),
            user: r.user.as_deref().map(clip),
            user_exists: false,
            event_fields: vec![("presented".into(), presented.into())],
        }
    }

    fn event(&self) -> Event {
        let mut e = Event::new(self.event, self.user.as_deref())
            .with("door", self.door.clone())
            .with("remote_addr", self.remote_addr.clone())
            .with("reason", self.reason.clone());
        if self.event == "user.login" {
            e = e.with("success", false);
        }
        for (k, v) in &self.event_fields {
            e = e.with(k, v.clone());
        }
        e
    }

    fn key(&self) -> Key {
        Key {
            event: self.event.into(),
            door: self.door.clone(),
            address: address_of(&self.remote_addr),
            reason: self.reason.clone(),
            user: self.user.clone().filter(|_| self.user_exists),
        }
    }
}

/// At most [`MAX_TEXT`] bytes, cut at a character boundary.
fn clip(s: &str) -> String {
    let mut end = s.len().min(MAX_TEXT);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The address without its port (`127.0.0.1:5555` → `127.0.0.1`, `[::1]:5555` → `::1`).
fn address_of(remote: &str) -> String {
    match remote.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip().to_string(),
        Err(_) => remote.to_string(),
    }
}

impl Failures {
    /// Counts a failure; returns the event to audit now, if this one opens a window.
    fn admit(&self, failure: &Failure, now: Instant) -> Option<Event> {
        let mut key = failure.key();
        let Ok(mut windows) = self.windows.lock() else {
            return Some(failure.event().with("count", 1));
        };
        if !windows.contains_key(&key) && windows.len() >= MAX_KEYS {
            key = Key {
                event: key.event,
                door: key.door,
                address: "*".into(),
                reason: "*".into(),
                user: None,
            };
        }
        match windows.get_mut(&key) {
            Some(w) if now.duration_since(w.opened) < WINDOW => {
                w.counted += 1;
                w.latest = Some(failure.event());
                None
            }
            _ => {
                // A window that closed but was not flushed yet is flushed by the next tick:
                // keep its count by leaving it, and open this one under a fresh start only
                // when nothing is pending.
                if let Some(w) = windows.get_mut(&key)
                    && w.counted > 0
                {
                    w.counted += 1;
                    w.latest = Some(failure.event());
                    return None;
                }
                windows.insert(
                    key,
                    Window {
                        opened: now,
                        counted: 0,
                        latest: None,
                    },
                );
                Some(failure.event().with("count", 1))
            }
        }
    }

    /// Closes the windows older than [`WINDOW`]: one event per window that counted failures
    /// (a new window opens behind it, so a steady flood gives one event a minute), and windows
    /// that counted none are forgotten.
    fn close(&self, now: Instant) -> Vec<Event> {
        let Ok(mut windows) = self.windows.lock() else {
            return vec![];
        };
        let mut out = vec![];
        windows.retain(|_, w| {
            if now.duration_since(w.opened) < WINDOW {
                return true;
            }
            match w.latest.take() {
                Some(e) if w.counted > 0 => {
                    out.push(e.with("count", w.counted));
                    *w = Window {
                        opened: now,
                        counted: 0,
                        latest: None,
                    };
                    true
                }
                _ => false,
            }
        });
        out
    }

    /// Every counted failure, as events, whatever the age of its window (at shutdown).
    fn drain(&self) -> Vec<Event> {
        let Ok(mut windows) = self.windows.lock() else {
            return vec![];
        };
        windows
            .drain()
            .filter_map(|(_, w)| {
                let counted = w.counted;
                w.latest
                    .filter(|_| counted > 0)
                    .map(|e| e.with("count", counted))
            })
            .collect()
    }
}

impl AuthServer {
    /// Audits a failed authentication, aggregated (see the module doc). Never fails: a refusal
    /// must not depend on the audit write.
    pub async fn auth_failed(&self, failure: Failure) {
        if failure.event == "auth.failed" {
            tracing::info!(door = %failure.door, peer = %failure.remote_addr, reason = %failure.reason, "authentication failed");
        }
        if let Some(e) = self.failures.admit(&failure, Instant::now()) {
            self.emit_logged(e).await;
        }
    }

    /// Emits the windows that closed; called by the background task.
    pub async fn flush_failures(&self) {
        for e in self.failures.close(Instant::now()) {
            self.emit_logged(e).await;
        }
    }

    /// Emits everything counted so far (for a clean shutdown).
    pub async fn flush_all_failures(&self) {
        for e in self.failures.drain() {
            self.emit_logged(e).await;
        }
    }
}

/// Flushes closed windows every few seconds, and forgets stale login attempts once a minute,
/// for as long as the auth server lives.
pub(crate) fn spawn_flusher(auth: Weak<AuthServer>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        let mut n: u64 = 0;
        loop {
            tick.tick().await;
            let Some(auth) = auth.upgrade() else { return };
            auth.flush_failures().await;
            n += 1;
            if n.is_multiple_of((WINDOW.as_secs() / FLUSH_EVERY.as_secs()).max(1))
                && let Err(e) = auth.forget_stale_login_attempts().await
            {
                tracing::warn!(error = %e, "stale login attempts not removed");
            }
            // Not held across the sleep: the server can be dropped between ticks.
            drop::<Arc<AuthServer>>(auth);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(addr: &str, reason: &str, user: Option<&str>, exists: bool) -> Failure {
        Failure {
            event: "auth.failed",
            door: "ssh".into(),
            remote_addr: addr.into(),
            reason: reason.into(),
            user: user.map(str::to_string),
            user_exists: exists,
            event_fields: vec![],
        }
    }

    fn count(e: &Event) -> u64 {
        e.fields.get("count").and_then(|v| v.as_u64()).unwrap_or(0)
    }

    #[test]
    fn first_failure_at_once_the_rest_counted_when_the_window_closes() {
        let f = Failures::default();
        let t0 = Instant::now();
        let first = f.admit(&failure("10.0.0.1:1000", "wrong CA", None, false), t0);
        assert_eq!(first.as_ref().map(count), Some(1));
        for port in 1001..1050 {
            let addr = format!("10.0.0.1:{port}");
            assert!(
                f.admit(&failure(&addr, "wrong CA", None, false), t0)
                    .is_none()
            );
        }
        assert!(f.close(t0 + Duration::from_secs(59)).is_empty());
        let closed = f.close(t0 + WINDOW);
        assert_eq!(closed.iter().map(count).collect::<Vec<_>>(), vec![49]);
        // A steady flood: the next window also opens quietly and closes with its count.
        let t1 = t0 + WINDOW;
        assert!(
            f.admit(&failure("10.0.0.1:2000", "wrong CA", None, false), t1)
                .is_none()
        );
        assert_eq!(f.close(t1 + WINDOW).iter().map(count).sum::<u64>(), 1);
        // A window that counted nothing is forgotten; the next failure is audited at once.
        assert!(f.close(t1 + WINDOW * 2).is_empty());
        let t2 = t1 + WINDOW * 3;
        assert!(
            f.admit(&failure("10.0.0.1:3000", "wrong CA", None, false), t2)
                .is_some()
        );
    }

    #[test]
    fn keys_are_door_address_reason_and_real_users() {
        let f = Failures::default();
        let t = Instant::now();
        let cases = [
            (failure("10.0.0.1:1", "a", None, false), true),
            (failure("10.0.0.2:1", "a", None, false), true),
            (failure("10.0.0.1:2", "b", None, false), true),
            (failure("10.0.0.1:3", "a", None, false), false),
            // Names anyone can type are not keys...
            (failure("10.0.0.1:4", "a", Some("ghost1"), false), false),
            (failure("10.0.0.1:5", "a", Some("ghost2"), false), false),
            // ...real users are.
            (failure("10.0.0.1:6", "a", Some("alice"), true), true),
            (failure("10.0.0.1:7", "a", Some("bob"), true), true),
            (failure("10.0.0.1:8", "a", Some("bob"), true), false),
            (failure("[::1]:9", "a", None, false), true),
            (failure("[::1]:10", "a", None, false), false),
        ];
        for (i, (fl, emitted)) in cases.iter().enumerate() {
            assert_eq!(f.admit(fl, t).is_some(), *emitted, "case {i}");
        }
    }

    #[test]
    fn the_key_table_is_bounded() {
        let f = Failures::default();
        let t = Instant::now();
        for i in 0..MAX_KEYS + 500 {
            let addr = format!("10.{}.{}.{}:1", i >> 16 & 255, i >> 8 & 255, i & 255);
            f.admit(&failure(&addr, "x", None, false), t);
        }
        let n = f.windows.lock().map(|w| w.len()).unwrap_or(0);
        assert_eq!(n, MAX_KEYS + 1);
        let drained = f.drain();
        assert_eq!(drained.iter().map(count).sum::<u64>(), 499);
    }
}
