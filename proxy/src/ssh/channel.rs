//! The SSH door's side of one session channel ([`SshDoor`]): the engine's events rendered as
//! SSH messages on the person's channel, and the per-channel state the inner connection's
//! handler keeps beside each session (its command queue, the replies it owes).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use russh::ChannelId;
use russh::server::{Handle, Msg};

use crate::session::{Commands, Door, Event, Refusal};

/// The session channels of one inner connection, under one lock.
pub(super) type Sessions = Arc<Mutex<Channels>>;

#[derive(Default)]
pub(super) struct Channels {
    by_id: HashMap<ChannelId, Slot>,
    /// The connection has ended: a session that finishes opening now ends at once.
    pub(super) gone: bool,
}

pub(super) enum Slot {
    Live(Live),
    /// Its session ended and the client has not closed the channel yet: the engine's last
    /// answers there may still be on their way through the handle.
    Ended,
}

impl Channels {
    pub(super) fn get(&self, ch: ChannelId) -> Option<&Slot> {
        self.by_id.get(&ch)
    }

    pub(super) fn live(&self, ch: ChannelId) -> Option<&Live> {
        match self.by_id.get(&ch) {
            Some(Slot::Live(l)) => Some(l),
            _ => None,
        }
    }

    /// Session channels with a live session (`max_sessions` counts these).
    pub(super) fn live_count(&self) -> usize {
        self.by_id
            .values()
            .filter(|s| matches!(s, Slot::Live(_)))
            .count()
    }

    /// A session opened on `ch`: kept, unless the connection has ended (then false).
    pub(super) fn insert(&mut self, ch: ChannelId, live: Live) -> bool {
        if self.gone {
            return false;
        }
        self.by_id.insert(ch, Slot::Live(live));
        true
    }

    /// `ch`'s session ended (a channel the client already closed stays forgotten): what it
    /// held, to close.
    pub(super) fn end(&mut self, ch: ChannelId) -> Option<Live> {
        let slot = self.by_id.get_mut(&ch)?;
        match std::mem::replace(slot, Slot::Ended) {
            Slot::Live(l) => Some(l),
            Slot::Ended => None,
        }
    }

    /// The client closed `ch`: forgotten; its session, if still live, to close.
    pub(super) fn remove(&mut self, ch: ChannelId) -> Option<Live> {
        match self.by_id.remove(&ch) {
            Some(Slot::Live(l)) => Some(l),
            _ => None,
        }
    }

    /// The connection ended: every live session, to close; none is kept from now on.
    pub(super) fn end_all(&mut self) -> Vec<Live> {
        self.gone = true;
        self.by_id
            .drain()
            .filter_map(|(_, s)| match s {
                Slot::Live(l) => Some(l),
                Slot::Ended => None,
            })
            .collect()
    }
}

pub(super) struct Live {
    pub(super) commands: Commands,
    pub(super) forward_agent: bool,
    /// Whether each request given to the engine and not yet answered asked for a reply.
    pub(super) owed: Owed,
}

/// Whether each request given to a session and not yet answered asked for a reply, oldest
/// first: the engine answers every request ([`Event::Reply`]), the client only some.
pub(super) type Owed = Arc<Mutex<VecDeque<bool>>>;

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
                // Marked ended, so a request in between is refused after this session's last
                // answers (`Inner::request`).
                if let Ok(mut s) = self.sessions.lock() {
                    s.end(ch);
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
