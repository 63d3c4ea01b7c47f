//! sallyport patch (see PATCHES.md): the replies a server owes its peer's global requests.
//!
//! RFC 4254 §4: the replies to global requests are sent in the order the requests were
//! received; the client matches them by that order (OpenSSH keeps one queue of the replies it
//! expects). russh kept a single `wants_reply` flag, overwritten by every global request, and
//! took each answer from the callback's return value, so a handler that needs time to answer
//! (Sallyport's proxy binds `tcpip-forward` on another host) stalled the whole connection.
//! Here every request that asked for a reply gets a place in a queue, answered either at once
//! (russh's own answers and the callbacks' return values, as before) or later, by the handler
//! ([`Session::defer_global_reply`], then [`Handle::global_reply`]); answers go out oldest
//! first, so a late one is never overtaken.

use std::collections::VecDeque;

#[allow(unused_imports)] // for the docs
use super::{Handle, Session};
use crate::Error;

/// The most replies a connection may owe its peer's global requests at once: a peer that
/// sends more requests wanting a reply than the handler has answered is disconnected
/// ([`Error::TooManyPendingGlobalReplies`]) rather than queued without end.
pub const MAX_PENDING_GLOBAL_REPLIES: usize = 1024;

/// A global request whose answer the handler gives later ([`Session::defer_global_reply`]):
/// passed back to [`Handle::global_reply`] or [`Session::global_reply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GlobalRequestId(u64);

/// An answer to a global request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GlobalReply {
    /// `REQUEST_SUCCESS`, with the allocated port as its payload for a `tcpip-forward` that
    /// asked for port 0.
    Success(Option<u32>),
    Failure,
}

#[derive(Debug)]
struct Owed {
    id: GlobalRequestId,
    /// Whether the request was a `tcpip-forward` to port 0, whose success carries the port.
    port_payload: bool,
    answer: Option<GlobalReply>,
}

/// The replies owed, oldest first. The front is never answered: answers are sent as soon as
/// nothing older is owed.
#[derive(Debug, Default)]
pub(crate) struct GlobalReplies {
    owed: VecDeque<Owed>,
    next_id: u64,
    /// Whether the request being handled may carry a port in its success (`tcpip-forward` to
    /// port 0).
    pub(crate) current_port_payload: bool,
}

impl GlobalReplies {
    /// A request that asked for a reply was received: refused when as many are owed as
    /// allowed (so that whatever answers it, now or later, takes at most the last place).
    pub(crate) fn received(&mut self, want_reply: bool) -> Result<(), Error> {
        self.current_port_payload = false;
        if want_reply && self.owed.len() >= MAX_PENDING_GLOBAL_REPLIES {
            return Err(Error::TooManyPendingGlobalReplies);
        }
        Ok(())
    }

    /// The request being handled is answered now: the answer to send at once if nothing older
    /// is owed; otherwise it waits its turn.
    pub(crate) fn decided(&mut self, reply: GlobalReply) -> Option<GlobalReply> {
        if self.owed.is_empty() {
            return Some(reply);
        }
        let id = self.new_id();
        self.owed.push_back(Owed {
            id,
            port_payload: false,
            answer: Some(reply),
        });
        None
    }

    /// The request being handled will be answered later.
    pub(crate) fn deferred(&mut self) -> GlobalRequestId {
        let id = self.new_id();
        self.owed.push_back(Owed {
            id,
            port_payload: self.current_port_payload,
            answer: None,
        });
        id
    }

    /// The handler's answer to `id`; false when `id` is owed nothing (answered already).
    pub(crate) fn answered(&mut self, id: GlobalRequestId, reply: GlobalReply) -> bool {
        match self
            .owed
            .iter_mut()
            .find(|o| o.id == id && o.answer.is_none())
        {
            Some(o) => {
                o.answer = Some(match reply {
                    GlobalReply::Success(port) if o.port_payload => GlobalReply::Success(port),
                    GlobalReply::Success(_) => GlobalReply::Success(None),
                    GlobalReply::Failure => GlobalReply::Failure,
                });
                true
            }
            None => false,
        }
    }

    /// The next answer due, in order.
    pub(crate) fn next_due(&mut self) -> Option<GlobalReply> {
        let answer = self.owed.front()?.answer?;
        self.owed.pop_front();
        Some(answer)
    }

    fn new_id(&mut self) -> GlobalRequestId {
        self.next_id = self.next_id.wrapping_add(1);
        GlobalRequestId(self.next_id)
    }
}
