//! The session engine: what every door does with a session, in the order a session takes it.
//!
//! 1. `authorize` — auth grants the session (roles, labels, deny rules, locks, limits) and
//!    certifies the proxy's key for exactly this login, or refuses with a [`Refusal`].
//! 2. `dial` — the node through its agent's tunnel or at its agentless address, its host
//!    certificate (or pinned host key) checked, the per-session certificate presented.
//! 3. `relay` — one task per direction between the door and the node channel: the door's
//!    [`Command`]s in order toward the node, the node's output back as [`Event`]s to the door's
//!    [`Door`]; file copies checked and audited as they pass (`copy`). Every request gets
//!    exactly one [`Event::Reply`], in the order given, whether the node or the session answers
//!    it (`reply`).
//! 4. `record` — the terminal recording (asciicast v2), complete before the person sees the end
//!    (beside it when the watchdog ends the session: a stalled disk does not keep an idle or
//!    expired session open) and synced before the session's end is audited.
//! 5. `audit` — one ordered sink per session for everything it reports to auth: the kind it
//!    turned out to be, per-operation events, and its end.
//! 6. `watchdog` — idle time, certificate expiry; locks end live connections at every door
//!    through [`crate::state::ProxyState`].
//!
//! A door (the SSH door in `crate::ssh`; the browser terminal and `kubectl exec` next) only
//! translates its protocol into [`Command`]s and renders [`Event`]s and [`Refusal`]s its own
//! way: an SSH message, a WebSocket close code, a Kubernetes `Status`.

pub mod audit;
pub mod authorize;
pub mod copy;
pub mod dial;
pub mod record;
pub mod relay;
pub mod reply;
mod request;
pub mod watchdog;
pub mod window;

use bytes::Bytes;
use russh::{Pty, Sig};

pub use authorize::Target;
pub use relay::{Commands, start};

/// Why a session was not opened or was ended, for each door to render its own way. The text
/// (`Display`) is what a person reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The node's agent is not connected to this proxy, or its address does not answer.
    Offline(String),
    /// The roles do not allow it (or the user or node is gone); auth's explanation.
    Denied { explanation: String },
    /// The node's host certificate or key is not the one this cluster trusts.
    HostKey(String),
    /// The user is locked.
    Locked(String),
    /// The person's certificate expired, or the session went idle past its limit.
    Expired(String),
    /// A limit: `max_sessions`, `max_connections`, a recording that must be kept and cannot be.
    Limit(String),
    /// Anything else (auth unreachable, the node refused the certificate).
    Failed(String),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Offline(s)
            | Refusal::HostKey(s)
            | Refusal::Locked(s)
            | Refusal::Expired(s)
            | Refusal::Limit(s)
            | Refusal::Failed(s) => f.write_str(s),
            Refusal::Denied { explanation } => f.write_str(explanation),
        }
    }
}

impl Refusal {
    /// The kind of refusal, as `sallyport_sessions_rejected_total` counts it.
    pub fn class(&self) -> sallyport_core::metrics::RejectReason {
        use sallyport_core::metrics::RejectReason as R;
        match self {
            Refusal::Offline(_) => R::Offline,
            Refusal::Denied { .. } => R::Denied,
            Refusal::HostKey(_) => R::HostKey,
            Refusal::Locked(_) => R::Locked,
            Refusal::Expired(_) => R::Expired,
            Refusal::Limit(_) => R::Limit,
            Refusal::Failed(_) => R::Failed,
        }
    }
}

impl From<String> for Refusal {
    fn from(s: String) -> Self {
        Refusal::Failed(s)
    }
}

/// What a door asks of a session, in the order the person asked it.
#[derive(Debug)]
pub enum Command {
    Pty {
        term: String,
        cols: u32,
        rows: u32,
        pix_width: u32,
        pix_height: u32,
        modes: Vec<(Pty, u32)>,
    },
    Env {
        name: String,
        value: String,
    },
    Shell,
    Exec(Vec<u8>),
    Subsystem(String),
    /// Agent forwarding (`ssh -A`), when the grant allows it: the door answers it (russh takes
    /// the answer from its callback and sends it in its turn), the session gets no
    /// [`Event::Reply`] for it.
    Agent,
    X11 {
        single_connection: bool,
        protocol: String,
        cookie: String,
        screen: u32,
    },
    Data(Bytes),
    Eof,
    Resize {
        cols: u32,
        rows: u32,
    },
    Signal(Sig),
    /// The person closed the session.
    Close,
}

/// What a session tells its door, in order.
#[derive(Debug)]
pub enum Event {
    /// Output (`ext` 1 is stderr).
    Data {
        ext: Option<u32>,
        data: Bytes,
    },
    /// The answer to the oldest request command not yet answered: exactly one per request
    /// (`Pty`, `Env`, `Shell`, `Exec`, `Subsystem`, `X11`, `Resize`, `Signal`), in the order
    /// they were given, before [`Event::Closed`] (see [`reply`]). The door sends it on only if
    /// the person asked for a reply.
    Reply(bool),
    Eof,
    ExitStatus(u32),
    ExitSignal {
        signal: Sig,
        core_dumped: bool,
        message: String,
    },
    /// The session is over; `why` when the proxy ended it (the person is told).
    Closed {
        why: Option<Refusal>,
    },
}

/// A door's side of one session: where its events go. Returns false when the person is gone.
///
/// Flow control runs end to end through the session: [`Event::Data`] is sent no faster than the
/// person's side takes it (`send` returns once their window has room), and the person's input
/// is reported through [`Door::consumed`] once the node took it, so a door with windows of its
/// own (SSH's) gives them back at the node's pace.
pub trait Door: Send + Sync + 'static {
    fn send(&self, event: Event) -> impl std::future::Future<Output = bool> + Send;

    /// The most input the person may have sent and the session not yet handed to the node,
    /// when the door gives window back through [`Door::consumed`]; more is a peer ignoring
    /// flow control, and the session is closed. `None`: only the flood cap
    /// ([`HIGH_WATER`](sallyport_core::flow::HIGH_WATER)) bounds it.
    fn window(&self) -> Option<u32> {
        None
    }

    /// `bytes` of the person's input reached the node.
    fn consumed(&self, _bytes: usize) {}
}
