//! The SSH door's side of one session channel ([`SshDoor`]): the engine's events rendered as
//! SSH messages on the person's channel, and the per-channel state the inner connection's
//! handler keeps beside each session (its command queue, the replies it owes).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

use russh::ChannelId;
use russh::server::{Handle, Msg};

use crate::session::{Commands, Door, Event, Refusal};

/// The engine's sessions on one inner connection, by channel.
pub(super) type Sessions = Arc<Mutex<HashMap<ChannelId, Live>>>;

pub(super) struct Live {
    pub(super) commands: Commands,
    pub(super) forward_agent: bool,
    /// Whether each request given to the engine and not yet answered asked for a reply.
    pub(super) owed: Owed,
}

/// Whether each request given to a session and not yet answered asked for a reply, oldest
/// first: the engine answers every request ([`Event::Reply`]), the client only some.
pub(super) type Owed = Arc<Mutex<VecDeque<bool>>>;

/// Session channels whose session has ended and that the client has not closed yet: the
/// engine's last answers there may still be on their way through the handle.
pub(super) type Ended = Arc<Mutex<HashSet<ChannelId>>>;

/// The SSH door's side of one session channel: renders the engine's events as SSH messages.
pub(super) struct SshDoor {
    pub(super) user: Handle,
    /// True once the person's client has the channel's confirmation: nothing is sent on a
    /// channel before it is open.
    pub(super) confirmed: tokio::sync::watch::Receiver<bool>,
    /// The channel's output, which waits for the person's window: the node's output reaches
    /// the person no faster than their client takes it (the session then gives the node its
    /// window back), instead of queueing in the proxy.
    pub(super) output: russh::ChannelWriteHalf<Msg>,
    pub(super) ch: ChannelId,
    pub(super) sessions: Sessions,
    pub(super) ended: Ended,
    pub(super) owed: Owed,
}

impl Door for SshDoor {
    async fn send(&self, event: Event) -> bool {
        let confirmed = *self.confirmed.borrow();
        if !confirmed {
            let mut wait = self.confirmed.clone();
            if wait.wait_for(|c| *c).await.is_err() {
                return false;
            }
        }
        let (user, ch) = (&self.user, self.ch);
        match event {
            Event::Data { ext: None, data } => self.output.data_bytes(data).await.is_ok(),
            Event::Data {
                ext: Some(ext),
                data,
            } => self.output.extended_data_bytes(ext, data).await.is_ok(),
            // The answer to the oldest request given to the session, sent when it asked for one.
            Event::Reply(ok) => {
                let wanted = self.owed.lock().ok().and_then(|mut o| o.pop_front());
                match (wanted, ok) {
                    (Some(true), true) => user.channel_success(ch).await.is_ok(),
                    (Some(true), false) => user.channel_failure(ch).await.is_ok(),
                    _ => true,
                }
            }
            Event::Eof => user.eof(ch).await.is_ok(),
            Event::ExitStatus(status) => user.exit_status_request(ch, status).await.is_ok(),
            Event::ExitSignal {
                signal,
                core_dumped,
                message,
            } => user
                .exit_signal_request(ch, signal, core_dumped, message, String::new())
                .await
                .is_ok(),
            Event::Closed { why } => {
                // Ended before it is forgotten, so a request in between is refused after this
                // session's last answers (`Inner::request`).
                if let Ok(mut e) = self.ended.lock() {
                    e.insert(ch);
                }
                if let Ok(mut s) = self.sessions.lock() {
                    s.remove(&ch);
                }
                match why {
                    // Idle or expired: the whole connection ends, as sshd's would.
                    Some(why @ Refusal::Expired(_)) => {
                        let _ = user
                            .disconnect(
                                russh::Disconnect::ByApplication,
                                why.to_string(),
                                String::new(),
                            )
                            .await;
                    }
                    _ => {
                        let _ = user.close(ch).await;
                    }
                }
                false
            }
        }
    }

    /// The inner connection's window (`sshcert::server_settings(ProxyInner)`), given back as
    /// the node takes the person's input (`WindowPolicy::Consumed`).
    fn window(&self) -> Option<u32> {
        Some(sallyport_core::flow::CLIENT_WINDOW)
    }

    fn consumed(&self, bytes: usize) {
        let _ = self.user.consumed(self.ch, bytes);
    }
}
