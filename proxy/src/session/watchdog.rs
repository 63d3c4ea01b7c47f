//! What ends a session that is still running: `client_idle_timeout` (no data either way on any
//! of the person's channels, forwards included) and `disconnect_expired_cert` (the person's
//! certificate expired), checked every [`TICK`]. Locks end live connections through
//! [`ProxyState::watch_locks`](crate::state::ProxyState::watch_locks).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
