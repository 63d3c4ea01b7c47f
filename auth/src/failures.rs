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
//! So that a flood cannot hide one real attempt among its own, the closing event also lists
//! the distinct identities presented in its window (`presented_all`, at most
//! [`MAX_IDENTITIES`] in the order first seen; `presented` is the first of them, as a single
//! failure's event has it, and `presented_unlisted` counts the distinct ones beyond the list).
//! A proxy whose report queue overflowed says how many reports it dropped (reason
//! [`DROPPED_REASON`], with their `count`), so those are counted too.
//!
//! The address is keyed as the doors count their sources ([`sallyport_core::door::source_of`]):
//! without its port (every connection has a new one), an IPv6 address by its /64 (one
//! subscriber holds a whole /64, so a new /128 per connection is the same source) and an
//! IPv4-mapped one as IPv4. User names that are not users (anyone can type one) are not part
//! of the key, and the table of keys is bounded: past [`MAX_KEYS`] new keys share one overflow
//! key per door, so a flood from many sources is at most that many records a minute.
//!
//! This module never decides whether something failed, and never sees a password or code.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sallyport_core::api::AuthFailure;
use sallyport_core::audit::{Event, EventType};

use crate::AuthServer;

/// How long one aggregation window lasts.
pub const WINDOW: Duration = Duration::from_secs(60);
/// Keys tracked at once; beyond this, new keys are counted under an overflow key. Each key
/// can write an event as its window opens and one as it closes, so this bounds the records a
/// flood from many sources writes a minute.
pub const MAX_KEYS: usize = 1_000;
/// Failures in one report from a proxy.
pub const MAX_BATCH: usize = 1000;
/// Longest text kept from a reported field, and most fields of what was presented.
const MAX_TEXT: usize = 256;
const MAX_PRESENTED: usize = 16;
/// Distinct identities listed in one aggregated event.
pub const MAX_IDENTITIES: usize = 16;
/// The reason of a proxy's report of failures it could not queue.
pub use sallyport_core::api::AUTH_FAILURES_DROPPED as DROPPED_REASON;
/// How often closed windows are looked for.
const FLUSH_EVERY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    event: EventType,
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
    /// The distinct identities presented by the counted failures, in the order first seen.
    presented: Vec<serde_json::Value>,
    /// Distinct identities seen after `presented` was full (an upper bound: once the list is
    /// full, an identity seen twice is not recognised).
    unlisted: u64,
}

impl Window {
    fn open(now: Instant) -> Self {
        Window {
            opened: now,
            counted: 0,
            latest: None,
            presented: vec![],
            unlisted: 0,
        }
    }

    /// Counts `times` failures like `failure`.
    fn count(&mut self, failure: &Failure, times: u64) {
        self.counted = self.counted.saturating_add(times);
        self.latest = Some(failure.event());
        if let Some(p) = failure.presented()
            && !self.presented.contains(p)
        {
            if self.presented.len() < MAX_IDENTITIES {
                self.presented.push(p.clone());
            } else {
                self.unlisted = self.unlisted.saturating_add(1);
            }
        }
    }

    /// The event standing for the counted failures, if any.
    fn take_event(&mut self) -> Option<Event> {
        let counted = self.counted;
        let mut e = self.latest.take().filter(|_| counted > 0)?;
        if let Some(first) = self.presented.first() {
            e = e
                .with("presented", first.clone())
                .with("presented_all", std::mem::take(&mut self.presented));
            if self.unlisted > 0 {
                e = e.with("presented_unlisted", self.unlisted);
            }
        }
        Some(e.with("count", counted))
    }
}

/// The aggregation state (one per auth process).
#[derive(Default)]
pub struct Failures {
    windows: Mutex<HashMap<Key, Window>>,
}

/// One failure as the doors describe it.
pub struct Failure {
    /// `auth.fail`, or `user.login` for the login endpoints (which audit their failures as
    /// unsuccessful logins, as they always have), or `node.join` for refused joins.
    pub event: EventType,
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
            event: EventType::AuthFail,
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
        if self.event == EventType::UserLogin {
            e = e.with("success", false);
        }
        for (k, v) in &self.event_fields {
            e = e.with(k, v.clone());
        }
        e
    }

    /// What the client presented, when the door knows.
    fn presented(&self) -> Option<&serde_json::Value> {
        self.event_fields
            .iter()
            .find(|(k, _)| k == "presented")
            .map(|(_, v)| v)
            .filter(|v| v.as_object().is_none_or(|m| !m.is_empty()))
    }

    fn key(&self) -> Key {
        Key {
            event: self.event,
            door: self.door.clone(),
            address: source_key(&self.remote_addr),
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

/// The source an address is counted under, as the doors count it (`2001:db8:0:1::/64`,
/// `10.0.0.1`); text that is not an address is its own source.
pub(crate) fn source_key(remote: &str) -> String {
    use std::net::IpAddr;
    let ip = match remote.parse::<std::net::SocketAddr>() {
        Ok(a) => a.ip(),
        Err(_) => match remote.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) => return remote.to_string(),
        },
    };
    match sallyport_core::door::source_of(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("{v6}/64"),
    }
}

impl Failures {
    /// Counts `times` failures like this one (a proxy's report of dropped reports stands for
    /// many); returns the event to audit now, if this opens a window.
    fn admit(&self, failure: &Failure, times: u64, now: Instant) -> Option<Event> {
        let times = times.max(1);
        let mut key = failure.key();
        let Ok(mut windows) = self.windows.lock() else {
            return Some(failure.event().with("count", times));
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
                w.count(failure, times);
                None
            }
            _ => {
                // A window that closed but was not flushed yet is flushed by the next tick:
                // keep its count by leaving it, and open this one under a fresh start only
                // when nothing is pending.
                if let Some(w) = windows.get_mut(&key)
                    && w.counted > 0
                {
                    w.count(failure, times);
                    return None;
                }
                windows.insert(key, Window::open(now));
                Some(failure.event().with("count", times))
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
            match w.take_event() {
                Some(e) => {
                    out.push(e);
                    *w = Window::open(now);
                    true
                }
                None => false,
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
            .filter_map(|(_, mut w)| w.take_event())
            .collect()
    }
}

impl AuthServer {
    /// Audits a failed authentication, aggregated (see the module doc). Never fails: a refusal
    /// must not depend on the audit write.
    pub async fn auth_failed(&self, failure: Failure) {
        self.auth_failed_times(failure, 1).await;
    }

    /// Audits `times` failures like `failure` at once (a proxy's count of reports it dropped).
    pub async fn auth_failed_times(&self, failure: Failure, times: u64) {
        if failure.event == EventType::AuthFail {
            tracing::info!(door = %failure.door, peer = %failure.remote_addr, reason = %failure.reason, times, "authentication failed");
        }
        if let Some(e) = self.failures.admit(&failure, times, Instant::now()) {
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
            event: EventType::AuthFail,
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
        let first = f.admit(&failure("10.0.0.1:1000", "wrong CA", None, false), 1, t0);
        assert_eq!(first.as_ref().map(count), Some(1));
        for port in 1001..1050 {
            let addr = format!("10.0.0.1:{port}");
            assert!(
                f.admit(&failure(&addr, "wrong CA", None, false), 1, t0)
                    .is_none()
            );
        }
        assert!(f.close(t0 + Duration::from_secs(59)).is_empty());
        let closed = f.close(t0 + WINDOW);
        assert_eq!(closed.iter().map(count).collect::<Vec<_>>(), vec![49]);
        // A steady flood: the next window also opens quietly and closes with its count.
        let t1 = t0 + WINDOW;
        assert!(
            f.admit(&failure("10.0.0.1:2000", "wrong CA", None, false), 1, t1)
                .is_none()
        );
        assert_eq!(f.close(t1 + WINDOW).iter().map(count).sum::<u64>(), 1);
        // A window that counted nothing is forgotten; the next failure is audited at once.
        assert!(f.close(t1 + WINDOW * 2).is_empty());
        let t2 = t1 + WINDOW * 3;
        assert!(
            f.admit(&failure("10.0.0.1:3000", "wrong CA", None, false), 1, t2)
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
            assert_eq!(f.admit(fl, 1, t).is_some(), *emitted, "case {i}");
        }
    }

    fn reported(addr: &str, key_id: &str, count: Option<u64>) -> Failure {
        Failure::reported(&AuthFailure {
            door: "ssh".into(),
            remote_addr: addr.into(),
            reason: "certificate refused: unknown CA".into(),
            user: None,
            presented: [("cert_key_id".to_string(), key_id.to_string())].into(),
            count,
        })
    }

    fn key_ids(v: &serde_json::Value) -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|p| p["cert_key_id"].as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A flood of one identity cannot hide another attempt in the same window: every distinct
    /// identity is listed (up to the bound), not only the latest.
    #[test]
    fn the_closing_event_lists_every_distinct_identity_presented() {
        let f = Failures::default();
        let t0 = Instant::now();
        let first = f.admit(&reported("10.0.0.1:1", "flood", None), 1, t0);
        assert_eq!(
            first.map(|e| e.fields["presented"]["cert_key_id"].clone()),
            Some("flood".into())
        );
        for i in 0..100 {
            f.admit(
                &reported(&format!("10.0.0.1:{}", 2 + i), "flood", None),
                1,
                t0,
            );
            if i == 50 {
                f.admit(&reported("10.0.0.1:999", "the-real-one", None), 1, t0);
            }
        }
        let closed = f.close(t0 + WINDOW);
        assert_eq!(closed.len(), 1);
        let e = &closed[0].fields;
        assert_eq!(e["count"], 101);
        assert_eq!(key_ids(&e["presented_all"]), vec!["flood", "the-real-one"]);
        // `presented` stays one identity, the first of the list, for readers of the old shape.
        assert_eq!(e["presented"]["cert_key_id"], "flood");
        assert!(!e.contains_key("presented_unlisted"));

        // The list is bounded; the distinct identities beyond it are counted.
        let t1 = t0 + WINDOW * 3;
        f.admit(&reported("10.0.0.1:1", "opener", None), 1, t1);
        for i in 0..MAX_IDENTITIES + 4 {
            f.admit(&reported("10.0.0.1:2", &format!("k{i}"), None), 1, t1);
            // A listed identity again is recognised, not counted as another.
            f.admit(&reported("10.0.0.1:2", "k0", None), 1, t1);
        }
        let closed = f.drain();
        let e = &closed[0].fields;
        assert_eq!(e["count"], 2 * (MAX_IDENTITIES as u64 + 4));
        let listed = key_ids(&e["presented_all"]);
        assert_eq!(listed.len(), MAX_IDENTITIES);
        assert_eq!(listed[0], "k0");
        assert_eq!(e["presented_unlisted"], 4);
    }

    /// A proxy's report of the reports it dropped counts as that many failures, audited with
    /// the reason that says so.
    #[test]
    fn dropped_reports_are_counted_as_the_failures_they_stand_for() {
        let f = Failures::default();
        let t0 = Instant::now();
        // As the proxy sends it (proxy/src/auth_client.rs).
        let dropped = Failure::reported(&AuthFailure {
            door: "ssh".into(),
            remote_addr: "*".into(),
            reason: DROPPED_REASON.into(),
            count: Some(500),
            ..Default::default()
        });
        let first = f.admit(&dropped, 500, t0);
        let first = first.map(|e| e.fields).unwrap_or_default();
        assert_eq!(first["count"], 500);
        assert_eq!(first["reason"], "reports dropped: queue full");
        assert_eq!(first["door"], "ssh");
        assert!(f.admit(&dropped, 300, t0).is_none());
        assert!(f.admit(&dropped, 0, t0).is_none());
        let closed = f.close(t0 + WINDOW);
        assert_eq!(closed.iter().map(count).collect::<Vec<_>>(), vec![301]);
    }

    #[test]
    fn addresses_are_keyed_by_the_source_the_doors_count() {
        let f = Failures::default();
        let t = Instant::now();
        let cases = [
            ("[2001:db8:0:1::1]:1000", true),
            // Every address of the same /64 is the same source...
            ("[2001:db8:0:1::2]:1001", false),
            ("[2001:db8:0:1:ffff:ffff:ffff:ffff]:1002", false),
            ("2001:db8:0:1:1234::9", false),
            // ...another /64 is another.
            ("[2001:db8:0:2::1]:1003", true),
            ("10.0.0.1:1", true),
            ("[::ffff:10.0.0.1]:2", false),
            ("not an address", true),
            ("not an address", false),
        ];
        for (addr, emitted) in cases {
            assert_eq!(
                f.admit(&failure(addr, "x", None, false), 1, t).is_some(),
                emitted,
                "{addr}"
            );
        }
        // A new /128 for each of a thousand connections: one record now, one with the count.
        for i in 0..1000u32 {
            let addr = format!("[2001:db8:0:3:{:x}:{:x}::1]:{}", i >> 8, i & 255, 2000 + i);
            let emitted = f.admit(&failure(&addr, "x", None, false), 1, t);
            assert_eq!(emitted.is_some(), i == 0, "{addr}");
        }
        let closed = f.close(t + WINDOW);
        let from_3 = closed.iter().find(|e| {
            e.fields
                .get("remote_addr")
                .and_then(|v| v.as_str())
                .is_some_and(|a| a.starts_with("[2001:db8:0:3:"))
        });
        assert_eq!(from_3.map(count), Some(999));
    }

    /// A flood from more sources than keys (many /64s, or many IPv4 addresses) writes at most
    /// about [`MAX_KEYS`] records a minute, not one per source.
    #[test]
    fn a_flood_from_many_sources_writes_a_bounded_number_of_records() {
        let f = Failures::default();
        let t = Instant::now();
        let emitted = (0..5000u32)
            .filter(|i| {
                let addr = format!("[2001:db8:{:x}:{:x}::1]:22", i >> 16, i & 0xffff);
                f.admit(&failure(&addr, "x", None, false), 1, t).is_some()
            })
            .count();
        assert!(emitted <= 1001, "{emitted} records at once");
        let closed = f.close(t + WINDOW);
        assert!(closed.len() <= 1, "{} records at the close", closed.len());
        assert_eq!(closed.iter().map(count).sum::<u64>(), 5000 - emitted as u64);
    }

    #[test]
    fn the_key_table_is_bounded() {
        let f = Failures::default();
        let t = Instant::now();
        for i in 0..MAX_KEYS + 500 {
            let addr = format!("10.{}.{}.{}:1", i >> 16 & 255, i >> 8 & 255, i & 255);
            f.admit(&failure(&addr, "x", None, false), 1, t);
        }
        let n = f.windows.lock().map(|w| w.len()).unwrap_or(0);
        assert_eq!(n, MAX_KEYS + 1);
        let drained = f.drain();
        assert_eq!(drained.iter().map(count).sum::<u64>(), 499);
    }
}
