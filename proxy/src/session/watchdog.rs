//! What ends a session that is still running: `client_idle_timeout` (no data either way on any
//! of the person's channels, forwards included) and `disconnect_expired_cert` (the person's
//! certificate expired), checked every [`TICK`] — by the output task between messages, and
//! around each of its waits that may not end on their own ([`watched`]: the person's window,
//! the recording's room). Locks end live connections through
//! [`ProxyState::watch_locks`](crate::state::ProxyState::watch_locks).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use sallyport_core::api::SessionGrant;
use sallyport_core::unix_now_ms as now_ms;

use super::Refusal;
use crate::state::HangUp;

/// How often a running session is checked.
pub const TICK: Duration = Duration::from_millis(500);

/// Why a session must end now, if it must: idle longer than the roles allow, or (when the roles
/// say so) the person's certificate expired.
pub fn check(grant: &SessionGrant, activity: &AtomicU64, cert_expires: u64) -> Option<Refusal> {
    let now = now_ms();
    if let Some(idle) = grant.idle_timeout_secs {
        let quiet = now.saturating_sub(activity.load(Ordering::Relaxed)) / 1000;
        if quiet >= idle {
            return Some(Refusal::Expired(format!(
                "session closed after {} idle (client_idle_timeout)",
                sallyport_core::duration::format(Duration::from_secs(idle))
            )));
        }
    }
    if grant.disconnect_expired_cert && now / 1000 >= cert_expires {
        return Some(Refusal::Expired(
            "your certificate expired (disconnect_expired_cert); run `sally login` again".into(),
        ));
    }
    None
}

/// What a wait inside a running session watches ([`watched`]), and the output task at each
/// tick ([`Watch::ended`]).
pub(super) struct Watch<'a> {
    pub grant: &'a SessionGrant,
    pub activity: &'a AtomicU64,
    pub cert_expires: u64,
    /// The session's end was told to the person (`Live::close`).
    pub closed: &'a AtomicBool,
    /// Set when the person stopped sending: for a wait on them, which then ends.
    pub person_gone: Option<&'a AtomicBool>,
}

impl Watch<'_> {
    /// Whether the session ends now: `Some(Some(why))` when the watchdog ends it (logged),
    /// `Some(None)` when its end was told already or the person the wait is for stopped
    /// sending.
    pub fn ended(&self) -> Option<Option<Refusal>> {
        if self.closed.load(Ordering::Acquire)
            || self.person_gone.is_some_and(|g| g.load(Ordering::Acquire))
        {
            return Some(None);
        }
        let end = check(self.grant, self.activity, self.cert_expires)?;
        tracing::info!(session = %self.grant.session_id, why = %end, "ending a session");
        Some(Some(end))
    }
}

/// Runs `work` (a wait for the person's window, or for the recording's room) while the session
/// is still watched: `client_idle_timeout` and `disconnect_expired_cert` end it even when `work`
/// never finishes (the output task then ends the session at once, the recording completed
/// beside that), as does the session's end already told. `Err` with why ([`Watch::ended`]).
/// The work is polled first: the watch's timer only starts when the work waits.
pub(super) async fn watched<T>(
    w: Watch<'_>,
    work: impl std::future::Future<Output = T>,
) -> Result<T, Option<Refusal>> {
    let watch = async {
        let mut tick = tokio::time::interval(TICK);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Some(end) = w.ended() {
                return end;
            }
        }
    };
    tokio::select! {
        biased;
        done = work => Ok(done),
        end = watch => Err(end),
    }
}

/// Marks activity now.
pub fn touch(activity: &AtomicU64) {
    activity.store(now_ms(), Ordering::Relaxed);
}

/// Ends `conn` (a connection that only forwards, which has no session channel to watch it)
/// once `check` says so, until `stopped`.
pub async fn watch_forwards(
    grant: SessionGrant,
    activity: Arc<AtomicU64>,
    cert_expires: u64,
    conn: Arc<dyn HangUp>,
    mut stopped: tokio::sync::oneshot::Receiver<()>,
) {
    if grant.idle_timeout_secs.is_none() && !grant.disconnect_expired_cert {
        return;
    }
    loop {
        tokio::select! {
            _ = &mut stopped => return,
            _ = tokio::time::sleep(TICK) => {}
        }
        if let Some(why) = check(&grant, &activity, cert_expires) {
            tracing::info!(session = %grant.session_id, %why, "ending a forwarding connection");
            conn.hang_up(why.to_string());
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(idle_timeout_secs: Option<u64>, disconnect_expired_cert: bool) -> SessionGrant {
        serde_json::from_value(serde_json::json!({
            "session_id": "s1",
            "node": {"id": "n1", "hostname": "web1", "labels": {}, "kind": "agent"},
            "ssh_cert": "",
            "record": "strict",
            "port_forwarding": false,
            "forward_agent": false,
            "idle_timeout_secs": idle_timeout_secs,
            "disconnect_expired_cert": disconnect_expired_cert,
            "explanation": "",
        }))
        .unwrap_or_else(|e| panic!("a grant: {e}"))
    }

    /// A wait that never ends: a writer stalled behind the recording, a person who never reads.
    async fn forever() -> usize {
        std::future::pending().await
    }

    /// A wait that ends with `n` after a few of the watchdog's ticks.
    async fn later(n: usize) -> usize {
        tokio::time::sleep(3 * TICK).await;
        n
    }

    #[tokio::test]
    async fn a_wait_that_never_ends_still_ends_the_session_on_time() {
        let now = sallyport_core::unix_now_ms();
        let closed = AtomicBool::new(false);
        let gone = AtomicBool::new(false);
        let activity = AtomicU64::new(now);
        let watch = |g: &'static SessionGrant, expires: u64, person: bool| Watch {
            grant: g,
            activity: &activity,
            cert_expires: expires,
            closed: &closed,
            person_gone: person.then_some(&gone),
        };
        let far = now / 1000 + 3600;

        // The certificate expired and the roles say to disconnect: the wait ends with that.
        let expiring: &'static SessionGrant = Box::leak(Box::new(grant(None, true)));
        let r = watched(watch(expiring, now / 1000 - 1, false), forever()).await;
        match r {
            Err(Some(Refusal::Expired(m))) => assert!(m.contains("disconnect_expired_cert"), "{m}"),
            other => panic!("expected the expired certificate to end the wait: {other:?}"),
        }

        // Idle past client_idle_timeout (the clock is the wall clock: activity set in the past).
        let idle: &'static SessionGrant = Box::leak(Box::new(grant(Some(60), false)));
        activity.store(now - 61_000, Ordering::Relaxed);
        match watched(watch(idle, far, false), forever()).await {
            Err(Some(Refusal::Expired(m))) => assert!(m.contains("client_idle_timeout"), "{m}"),
            other => panic!("expected the idle timeout to end the wait: {other:?}"),
        }
        activity.store(now, Ordering::Relaxed);

        // Nothing says to end it: work that finishes gives its answer.
        let calm: &'static SessionGrant = Box::leak(Box::new(grant(Some(60), true)));
        let r = watched(watch(calm, far, true), later(7)).await;
        assert!(matches!(r, Ok(7)), "{r:?}");

        // The person stopped sending: a wait for them ends, a wait for the recording does not.
        gone.store(true, Ordering::Release);
        assert!(matches!(
            watched(watch(calm, far, true), forever()).await,
            Err(None)
        ));
        let r = watched(watch(calm, far, false), later(8)).await;
        assert!(matches!(r, Ok(8)), "{r:?}");

        // The session's end was told (`Live::close`): every wait ends.
        closed.store(true, Ordering::Release);
        assert!(matches!(
            watched(watch(calm, far, false), forever()).await,
            Err(None)
        ));
    }
}
