//! Forwarding on an inner connection: `direct-tcpip` (`-L`, `-D`) and `tcpip-forward` (`-R`)
//! share one extra node connection, made through the engine (authorize with session kind
//! `forward`, dial) at the first forward, whose grant is checked again with auth before every
//! new forwarded connection and every new `-R` bind. A connection that only forwards is
//! watched by a watchdog of its own.
//!
//! `-R` binds and their cancels run one after the other, in the order asked, on a task per
//! connection; the russh callbacks only queue them and defer their answers
//! (`Session::defer_global_reply`), which the task gives through the handle within
//! [`GLOBAL_REQUEST_LIMIT`] (a bind the node makes after that is undone), so the person's
//! connection goes on meanwhile.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use russh::server::{Handle, Msg, Session};
use russh::{Channel, ChannelOpenFailure};
use sallyport_core::api::{SessionEnd, SessionGrant, SessionKind, SessionStatus};
use sallyport_core::audit::EventType;
use serde_json::json;
use tokio::sync::OnceCell;

use super::inner::Inner;
use crate::session::audit::Audit;
use crate::session::authorize::{self, GrantRecheck, PORT_FORWARDING_REFUSED};
use crate::session::dial::{self, Asked, NodeConn, Shared, Toward};
use crate::session::{Refusal, watchdog};
use crate::state::{HangUp, ProxyState};

/// How long a `tcpip-forward` (or its cancel) may take before the person is refused: its
/// answer holds back the answers to every later global request of the connection (they go in
/// order), OpenSSH's keepalives among them.
const GLOBAL_REQUEST_LIMIT: Duration = Duration::from_secs(15);

/// A `tcpip-forward` or `cancel-tcpip-forward`, answered through the person's handle when done.
type RemoteOp = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// How many `tcpip-forward`/`cancel-tcpip-forward` requests may wait their turn; more are
/// refused at once (no client has more than a few in flight).
const REMOTE_OPS_QUEUED: usize = 64;

/// The node connection that carries an inner connection's forwards.
pub struct Forwarder {
    grant: SessionGrant,
    recheck: Arc<GrantRecheck>,
    conn: NodeConn,
    audit: Audit,
    open_failure: Shared<Option<String>>,
    bytes: Arc<(AtomicU64, AtomicU64)>,
    /// Dropped with the forwarder: ends its watchdog.
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// How far an inner connection's forwarding has ended.
#[derive(Default)]
struct Closed {
    /// The inner connection ended.
    connection: std::sync::atomic::AtomicBool,
    /// The forwarder's end was reported (by [`end_once`]).
    reported: std::sync::atomic::AtomicBool,
}

/// An inner connection's forwarding, opened at its first forward.
pub struct Forwarding {
    forwarder: Arc<OnceCell<Forwarder>>,
    activity: Arc<AtomicU64>,
    remote_forwards: Shared<HashSet<(String, u32)>>,
    /// A forwarder whose opening finishes after the connection ended is ended then, once.
    closed: Arc<Closed>,
    /// The queue of `-R` binds and cancels, started at the first.
    remote_ops: std::sync::OnceLock<tokio::sync::mpsc::Sender<RemoteOp>>,
}

impl Forwarding {
    pub fn new(activity: Arc<AtomicU64>, remote_forwards: Shared<HashSet<(String, u32)>>) -> Self {
        Forwarding {
            forwarder: Arc::new(OnceCell::new()),
            activity,
            remote_forwards,
            closed: Default::default(),
            remote_ops: std::sync::OnceLock::new(),
        }
    }

    /// The connection's `-R` binds and cancels, run one after the other in the order asked by
    /// a task of their own (it ends with the connection's handler, which holds the queue), so
    /// no russh callback waits on them, and a cancel finds the bind asked before it done, as
    /// when the callbacks themselves waited.
    fn remote_ops(&self) -> &tokio::sync::mpsc::Sender<RemoteOp> {
        self.remote_ops.get_or_init(|| {
            let (ops, mut queued) = tokio::sync::mpsc::channel::<RemoteOp>(REMOTE_OPS_QUEUED);
            tokio::spawn(async move {
                while let Some(op) = queued.recv().await {
                    op.await;
                }
            });
            ops
        })
    }

    /// The inner connection ended: the forwarding connection goes and its session ends.
    pub fn close(&self) {
        self.closed
            .connection
            .store(true, std::sync::atomic::Ordering::SeqCst);
        end_once(&self.forwarder, &self.closed);
    }
}

/// Ends the forwarding connection and reports its session's end, once, if it is open.
fn end_once(cell: &OnceCell<Forwarder>, closed: &Closed) {
    let Some(f) = cell.get() else {
        return;
    };
    if closed
        .reported
        .swap(true, std::sync::atomic::Ordering::SeqCst)
    {
        return;
    }
    let (conn, bytes, audit) = (f.conn.clone(), f.bytes.clone(), f.audit.clone());
    tokio::spawn(async move {
        let _ = conn
            .disconnect(russh::Disconnect::ByApplication, "", "")
            .await;
        let end = SessionEnd {
            status: SessionStatus::Complete,
            bytes_in: bytes.0.load(std::sync::atomic::Ordering::Relaxed),
            bytes_out: bytes.1.load(std::sync::atomic::Ordering::Relaxed),
            kind: Some(SessionKind::Forward),
            ..Default::default()
        };
        audit.end(end).await;
    });
}

/// Opens (authorizes and dials) the forwarding connection for `inner`'s person.
async fn open(
    state: Arc<ProxyState>,
    target: crate::session::Target,
    user: Handle,
    activity: Arc<AtomicU64>,
    remote_forwards: Shared<HashSet<(String, u32)>>,
) -> Result<Forwarder, Refusal> {
    let grant = authorize::grant(&state, &target).await?;
    let audit_slot = Arc::new(std::sync::OnceLock::new());
    let recheck_slot = Arc::new(std::sync::OnceLock::new());
    let bytes: Arc<(AtomicU64, AtomicU64)> = Default::default();
    let toward = Toward {
        user: user.clone(),
        asked: Arc::new(Asked::default()),
        remote_forwards,
        audit: audit_slot.clone(),
        recheck: recheck_slot.clone(),
        forward_bytes: bytes.clone(),
        activity: activity.clone(),
    };
    let dialed = match dial::dial(state.clone(), &grant, &target.login, Some(toward)).await {
        Ok(d) => d,
        Err(why) => {
            crate::session::audit::end_now(&state, &grant.session_id, authorize::failed_end())
                .await;
            return Err(why);
        }
    };
    let audit = Audit::spawn(state.clone(), &grant.session_id);
    let _ = audit_slot.set(audit.clone());
    let recheck = Arc::new(GrantRecheck::new(state.clone(), &grant));
    let _ = recheck_slot.set(recheck.clone());
    audit.update(SessionKind::Forward, None).await;
    let (stop, stopped) = tokio::sync::oneshot::channel();
    // A connection that only forwards has no session channel to watch it.
    let conn: Arc<dyn HangUp> = Arc::new(user);
    tokio::spawn(watchdog::watch_forwards(
        grant.clone(),
        activity,
        target.cert_expires,
        conn,
        stopped,
    ));
    Ok(Forwarder {
        grant,
        recheck,
        conn: dialed.conn,
        audit,
        open_failure: dialed.open_failure,
        bytes,
        _stop: stop,
    })
}

/// What a forward needs of the forwarder, cloned out of it.
#[derive(Clone)]
struct Ready {
    port_forwarding: bool,
    recheck: Arc<GrantRecheck>,
    conn: NodeConn,
    audit: Audit,
    open_failure: Shared<Option<String>>,
    bytes: Arc<(AtomicU64, AtomicU64)>,
}

/// The forwarder of `inner`, opened now if it is not yet (concurrent first forwards share one
/// opening; a failed one is tried again at the next forward).
fn forwarder_of(
    inner: &Inner,
    user: Handle,
) -> impl std::future::Future<Output = Result<Ready, Refusal>> + Send + 'static {
    let cell = inner.forwarding.forwarder.clone();
    let state = inner.state.proxy.clone();
    let target = inner.target(None);
    let activity = inner.forwarding.activity.clone();
    let remote_forwards = inner.forwarding.remote_forwards.clone();
    let closed = inner.forwarding.closed.clone();
    async move {
        let target = target?;
        let f = cell
            .get_or_try_init(|| open(state, target, user, activity, remote_forwards))
            .await?;
        if closed.connection.load(std::sync::atomic::Ordering::SeqCst) {
            // The person's connection ended while this opened.
            end_once(&cell, &closed);
            return Err(Refusal::Failed("the connection ended".into()));
        }
        Ok(Ready {
            port_forwarding: f.grant.port_forwarding,
            recheck: f.recheck.clone(),
            conn: f.conn.clone(),
            audit: f.audit.clone(),
            open_failure: f.open_failure.clone(),
            bytes: f.bytes.clone(),
        })
    }
}

fn refuse(reason: impl Into<String>) -> ChannelOpenFailure {
    ChannelOpenFailure::Other {
        code: 1,
        reason: reason.into(),
    }
}

/// A `direct-tcpip` channel (`-L`, `-D`): checked and connected on a task of its own, then
/// spliced to a `direct-tcpip` channel on the forwarding connection.
pub(super) fn direct_tcpip(
    inner: &Inner,
    user: Handle,
    channel: Channel<Msg>,
    (host, port): (&str, u32),
    (originator, originator_port): (&str, u32),
    reply: russh::server::ChannelOpenHandle,
) {
    // Both connections run `WindowPolicy::Consumed`: each side's window is given back as what
    // was read from it is written on to the other (`flow::Credited`).
    let person_credit = sallyport_core::flow::server_credit(user.clone(), channel.id());
    let forwarder = forwarder_of(inner, user);
    let activity = inner.activity.clone();
    let (host, originator) = (host.to_string(), originator.to_string());
    let (who, node) = (inner.user.clone(), inner.node.hostname.clone());
    tokio::spawn(async move {
        let fwd = match forwarder.await {
            Ok(f) => f,
            Err(reason) => {
                reply.reject(refuse(reason.to_string())).await;
                return;
            }
        };
        if !fwd.port_forwarding {
            tracing::info!(user = %who, %node, %host, port, "port forward refused by roles");
            reply.reject(refuse(PORT_FORWARDING_REFUSED)).await;
            return;
        }
        let (addr, from) = (
            format!("{host}:{port}"),
            format!("{originator}:{originator_port}"),
        );
        if let Err(why) = fwd.recheck.allowed().await {
            tracing::info!(session = %fwd.recheck.session_id, %why, "forwarded connection refused");
            fwd.audit
                .event(
                    EventType::Port,
                    json!({"kind": "local", "addr": addr, "originator": from, "result": why}),
                )
                .await;
            reply.reject(refuse(why)).await;
            return;
        }
        match fwd
            .conn
            .channel_open_direct_tcpip(host, port, originator, originator_port)
            .await
        {
            Ok(nch) => {
                reply.accept().await;
                let node_credit = sallyport_core::flow::client_credit(fwd.conn.clone(), nch.id());
                let (up, down) = sallyport_core::flow::splice_with(
                    sallyport_core::flow::Credited::new(channel.into_stream(), person_credit),
                    sallyport_core::flow::Credited::new(nch.into_stream(), node_credit),
                    Some(&activity),
                )
                .await;
                fwd.bytes
                    .0
                    .fetch_add(up, std::sync::atomic::Ordering::Relaxed);
                fwd.bytes
                    .1
                    .fetch_add(down, std::sync::atomic::Ordering::Relaxed);
                fwd.audit
                    .event(
                        EventType::Port,
                        json!({"kind": "local", "addr": addr, "originator": from,
                            "bytes_in": up, "bytes_out": down}),
                    )
                    .await;
            }
            Err(e) => {
                let why = sallyport_core::flow::open_failure_reason(&fwd.open_failure, e).await;
                reply.reject(refuse(why)).await;
            }
        }
    });
}

/// A `tcpip-forward` (`-R`): bound on the node through the forwarding connection once the
/// grant, checked again, allows it. The callback only queues it ([`Forwarding::remote_ops`]);
/// its answer goes to the person through the handle, with the node's port for a port 0, at
/// most [`GLOBAL_REQUEST_LIMIT`] later. Returns the callback's answer, which russh uses only
/// when nothing was deferred: a refusal when the queue is full.
pub(super) fn tcpip_forward(
    inner: &Inner,
    session: &mut Session,
    address: &str,
    asked: u32,
) -> bool {
    let who = inner.user.clone();
    let remote_forwards = inner.remote_forwards.clone();
    let forwarder = forwarder_of(inner, session.handle());
    let address = address.to_string();
    let op = {
        let (who, address) = (who.clone(), address.clone());
        async move {
            // The work runs as a task of its own so that a bind the node makes after the person's
            // answer timed out is not left behind: the task finds nobody waiting and undoes it.
            let (answer, answered) = tokio::sync::oneshot::channel::<Option<u32>>();
            let address_owned = address.clone();
            tokio::spawn(async move {
                let fwd = match forwarder.await {
                    Ok(f) => f,
                    Err(reason) => {
                        tracing::info!(user = %who, %reason, "remote forward refused");
                        let _ = answer.send(None);
                        return;
                    }
                };
                // A new bind asks as a new connection does: the roles may have changed since the
                // forwarding connection's grant.
                if let Err(why) = fwd.recheck.allowed().await {
                    tracing::info!(user = %who, address = %address_owned, port = asked, %why, "remote forward refused");
                    fwd.audit
                        .event(
                            EventType::Port,
                            json!({"kind": "remote", "addr": format!("{address_owned}:{asked}"),
                        "result": why}),
                        )
                        .await;
                    let _ = answer.send(None);
                    return;
                }
                let bound = match fwd.conn.tcpip_forward(address_owned.clone(), asked).await {
                    Ok(allocated) => Some(if asked == 0 { allocated } else { asked }),
                    Err(e) => {
                        tracing::info!(user = %who, address = %address_owned, port = asked, error = %e, "node refused a remote forward");
                        None
                    }
                };
                if let Err(Some(port)) = answer.send(bound) {
                    tracing::info!(user = %who, address = %address_owned, port, "remote forward bound after its answer timed out; cancelled");
                    let _ = tokio::time::timeout(
                        GLOBAL_REQUEST_LIMIT,
                        fwd.conn.cancel_tcpip_forward(address_owned, port),
                    )
                    .await;
                }
            });
            let bound = tokio::time::timeout(GLOBAL_REQUEST_LIMIT, answered)
                .await
                .ok()
                .and_then(Result::ok)
                .flatten();
            // Known before the person hears of it: a cancel asked after the answer finds it.
            if let Some(p) = bound
                && let Ok(mut f) = remote_forwards.lock()
            {
                f.insert((address, p));
            }
            (bound.is_some(), bound)
        }
    };
    if !queue_remote_op(inner, session, op) {
        tracing::info!(user = %who, %address, port = asked, "remote forward refused: too many pending");
    }
    false
}

/// Queues `op` behind the remote forwards and cancels asked before it, and answers the
/// person's global request with what it returns (success, and the port for a port 0) when it
/// is done: later, in its turn (russh's deferred global replies). False when the queue is full
/// (the request is then refused at once, by the callback's answer).
fn queue_remote_op(
    inner: &Inner,
    session: &mut Session,
    op: impl std::future::Future<Output = (bool, Option<u32>)> + Send + 'static,
) -> bool {
    let ops = inner.forwarding.remote_ops();
    let Ok(permit) = ops.try_reserve() else {
        return false;
    };
    let user = session.handle();
    let reply = session.defer_global_reply();
    permit.send(Box::pin(async move {
        let (ok, port) = op.await;
        if let Some(id) = reply {
            // Fails only when the person's connection is gone.
            let _ = user.global_reply(id, ok, port);
        }
    }));
    true
}

/// Resolves once every `-R` bind and cancel asked before this call has been answered (its
/// reply on the person's priority queue): a session channel's confirmation waits for it, so a
/// refused `-R` is heard before the session's output and exit status, as from sshd, which
/// answers requests in the order they came (`ExitOnForwardFailure` counts on it). The channel
/// is still authorized and dialed meanwhile; a connection that never forwarded waits for nothing.
/// The order holds because a deferred global reply and a channel's open confirmation both go
/// through russh's priority queue, in the order given. Each op is bounded by
/// [`GLOBAL_REQUEST_LIMIT`], so the wait is too (at most the queue's [`REMOTE_OPS_QUEUED`] of
/// them); a refusal made before the wait (the session cap, an unknown target) goes at once.
pub(super) fn answered_so_far(
    forwarding: &Forwarding,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut waiting = None;
    if let Some(ops) = forwarding.remote_ops.get() {
        let (done, answered) = tokio::sync::oneshot::channel::<()>();
        let marker: RemoteOp = Box::pin(async move {
            let _ = done.send(());
        });
        match ops.try_send(marker) {
            Ok(()) => waiting = Some((None, answered)),
            // A full queue (64 pending): the marker waits for room, so it may also wait for
            // ops asked a little after this channel: never for fewer than those before it.
            Err(tokio::sync::mpsc::error::TrySendError::Full(marker)) => {
                waiting = Some((Some((ops.clone(), marker)), answered))
            }
            Err(tokio::sync::mpsc::error::TrySendError::Closed(_)) => {}
        }
    }
    async move {
        let Some((late, answered)) = waiting else {
            return;
        };
        if let Some((ops, marker)) = late
            && ops.send(marker).await.is_err()
        {
            return;
        }
        let _ = answered.await;
    }
}

/// Cancels a remote forward the person asked for earlier: queued after the forwards asked
/// before it (see [`Forwarding::remote_ops`]); one the proxy does not know is refused at once.
pub(super) fn cancel_tcpip_forward(
    inner: &Inner,
    session: &mut Session,
    address: &str,
    port: u32,
) -> bool {
    let address = address.to_string();
    let remote_forwards = inner.remote_forwards.clone();
    let forwarder = inner.forwarding.forwarder.clone();
    let op = async move {
        let known = remote_forwards
            .lock()
            .map(|mut f| f.remove(&(address.clone(), port)))
            .unwrap_or(false);
        // The node has as long as a bind to answer.
        let done = match (forwarder.get(), known) {
            (Some(f), true) => tokio::time::timeout(
                GLOBAL_REQUEST_LIMIT,
                f.conn.cancel_tcpip_forward(address, port),
            )
            .await
            .is_ok_and(|r| r.is_ok()),
            _ => false,
        };
        (done, None)
    };
    queue_remote_op(inner, session, op);
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::oneshot;

    /// An op that waits for its gate to open and then counts itself answered.
    fn op(answered: &Arc<AtomicUsize>) -> (oneshot::Sender<()>, RemoteOp) {
        let (open, gate) = oneshot::channel::<()>();
        let answered = answered.clone();
        let op: RemoteOp = Box::pin(async move {
            let _ = gate.await;
            answered.fetch_add(1, Ordering::SeqCst);
        });
        (open, op)
    }

    /// Whether `wait` is still waiting a moment from now (it cannot end on its own: only an
    /// opened gate ends it).
    async fn still_waiting(wait: &mut (impl std::future::Future<Output = ()> + Unpin)) -> bool {
        tokio::time::timeout(Duration::from_millis(100), wait)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_session_channel_waits_for_the_forwards_asked_before_it_and_no_others() {
        let f = Forwarding::new(Default::default(), Default::default());
        // A connection that never forwarded: nothing to wait for.
        let mut none = Box::pin(answered_so_far(&f));
        assert!(!still_waiting(&mut none).await);

        // Two binds asked, then the channel opened, then another bind asked.
        let answered = Arc::new(AtomicUsize::new(0));
        let ops = f.remote_ops();
        let (first, a) = op(&answered);
        let (second, b) = op(&answered);
        let (_later, c) = op(&answered);
        assert!(ops.try_send(a).is_ok());
        assert!(ops.try_send(b).is_ok());
        let mut channel = Box::pin(answered_so_far(&f));
        assert!(ops.try_send(c).is_ok());
        assert!(still_waiting(&mut channel).await);
        let _ = first.send(());
        assert!(
            still_waiting(&mut channel).await,
            "one earlier bind still unanswered"
        );
        let _ = second.send(());
        assert!(
            !still_waiting(&mut channel).await,
            "the later bind is not waited for"
        );
        assert_eq!(answered.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn with_the_queue_full_the_channel_still_waits_for_the_earlier_forwards() {
        let f = Forwarding::new(Default::default(), Default::default());
        let answered = Arc::new(AtomicUsize::new(0));
        let ops = f.remote_ops();
        let mut gates = Vec::new();
        // The worker holds the first op; the queue then takes REMOTE_OPS_QUEUED more.
        let (g, first) = op(&answered);
        gates.push(g);
        assert!(ops.try_send(first).is_ok());
        tokio::task::yield_now().await;
        let mut queued = 0;
        loop {
            let (g, o) = op(&answered);
            if ops.try_send(o).is_err() {
                break;
            }
            gates.push(g);
            queued += 1;
        }
        assert!(queued >= REMOTE_OPS_QUEUED - 1, "{queued}");
        let mut channel = Box::pin(answered_so_far(&f));
        assert!(still_waiting(&mut channel).await);
        let last = gates.pop();
        for g in gates {
            let _ = g.send(());
        }
        assert!(
            still_waiting(&mut channel).await,
            "the last earlier bind is unanswered"
        );
        if let Some(g) = last {
            let _ = g.send(());
        }
        assert!(!still_waiting(&mut channel).await);
        assert_eq!(answered.load(Ordering::SeqCst), queued + 1);
    }
}
