//! The answers a session owes its door, in the order the person asked (RFC 4254 §5.4: replies
//! to channel requests come in the order the requests did).
//!
//! Invariant: every request command ([`Command::Pty`](super::Command::Pty), `Env`, `Shell`,
//! `Exec`, `Subsystem`, `X11`, `Resize`, `Signal`; not `Agent`, which the door answers) gets
//! exactly one [`Event::Reply`], in command order, before [`Event::Closed`], and none comes
//! after it. Two tasks answer: the command task decides some requests itself (refused by the
//! roles, not sendable, or nothing for the node to say) and sends the others to the node with
//! a reply wanted; the output task relays the node's answers. So the command task queues, in
//! command order, either an answer or a place for the node's (before the request leaves, so
//! the node's answer always finds it); a node answer fills the oldest place (the node answers
//! in the order it was asked); and the leading answers are sent as soon as nothing older is
//! owed, under one lock, so the two tasks never reorder them. A session that ends owes the
//! node's missing answers as failures.

use std::collections::VecDeque;

use super::{Door, Event};

/// The most answers a session may owe at once (requests decided or awaiting the node behind
/// one the node has not answered): a node that never answers while the person keeps asking
/// ends the session instead of growing this without end.
pub const MAX_OWED: usize = 1024;

#[derive(Default)]
pub(super) struct Replies {
    state: tokio::sync::Mutex<Owed>,
    /// Woken at each answer from the node ([`Replies::settled`]).
    answered: tokio::sync::Notify,
}

/// How long a session the proxy ends waits for the node's answers to earlier requests, so the
/// person reads them as the node gave them rather than as failures.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);

#[derive(Default)]
struct Owed {
    /// Oldest first: `None` awaits the node's answer; `Some` is decided and waits its turn.
    queue: VecDeque<Option<bool>>,
    /// The session told its door it is over: nothing more is sent.
    closed: bool,
}

impl Owed {
    fn push(&mut self, answer: Option<bool>) -> bool {
        if self.closed {
            return true;
        }
        if self.queue.len() >= MAX_OWED {
            return false;
        }
        self.queue.push_back(answer);
        true
    }
}

impl Replies {
    /// A request goes to the node with a reply wanted: its place, before it is sent. False
    /// when [`MAX_OWED`] answers are owed already (the session must end).
    pub(super) async fn await_node(&self) -> bool {
        self.state.lock().await.push(None)
    }

    /// The request sent last could not reach the node after all: it failed.
    pub(super) async fn not_sent<D: Door>(&self, door: &D) {
        let mut owed = self.state.lock().await;
        if let Some(place) = owed.queue.iter_mut().rev().find(|a| a.is_none()) {
            *place = Some(false);
        }
        flush(&mut owed, door).await;
    }

    /// A request the session answered itself. False when [`MAX_OWED`] answers are owed already.
    pub(super) async fn decided<D: Door>(&self, door: &D, ok: bool) -> bool {
        let mut owed = self.state.lock().await;
        if !owed.push(Some(ok)) {
            return false;
        }
        flush(&mut owed, door).await;
        true
    }

    /// The node answered (`CHANNEL_SUCCESS`/`FAILURE`): the oldest request awaiting it. An
    /// answer nothing awaits (a node answering more than it was asked) is dropped.
    pub(super) async fn node_answered<D: Door>(&self, door: &D, ok: bool) {
        let mut owed = self.state.lock().await;
        match owed.queue.iter_mut().find(|a| a.is_none()) {
            Some(place) => *place = Some(ok),
            None => return,
        }
        flush(&mut owed, door).await;
        self.answered.notify_waiters();
    }

    /// Returns once the node has answered every request sent to it so far (or the session is
    /// over). The output task must be running to relay the answers.
    pub(super) async fn settled(&self) {
        loop {
            let answered = self.answered.notified();
            tokio::pin!(answered);
            // Registered before the check, so an answer in between is not missed.
            answered.as_mut().enable();
            {
                let owed = self.state.lock().await;
                if owed.closed || owed.queue.iter().all(Option::is_some) {
                    return;
                }
            }
            answered.await;
        }
    }

    /// The session ends: what the node will now never answer failed; everything owed is sent,
    /// and nothing after.
    pub(super) async fn close<D: Door>(&self, door: &D) {
        let mut owed = self.state.lock().await;
        for a in owed.queue.iter_mut() {
            a.get_or_insert(false);
        }
        flush(&mut owed, door).await;
        owed.closed = true;
    }
}

/// Sends the answers now due, in order. (Once closed the queue stays empty: `close` sent all
/// of it, and `push` takes nothing more.)
async fn flush<D: Door>(owed: &mut Owed, door: &D) {
    while let Some(Some(ok)) = owed.queue.front().copied() {
        owed.queue.pop_front();
        door.send(Event::Reply(ok)).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Seen(Mutex<Vec<bool>>);

    impl Door for Seen {
        async fn send(&self, event: Event) -> bool {
            if let Event::Reply(ok) = event
                && let Ok(mut seen) = self.0.lock()
            {
                seen.push(ok);
            }
            true
        }
    }

    fn seen(door: &Seen) -> Vec<bool> {
        door.0.lock().map(|s| s.clone()).unwrap_or_default()
    }

    #[tokio::test]
    async fn a_decided_answer_waits_for_the_node_answers_owed_before_it() {
        let (r, door) = (Replies::default(), Seen::default());
        assert!(r.await_node().await); // pty-req, to the node
        assert!(r.decided(&door, true).await); // env
        assert!(r.decided(&door, false).await); // x11-req, refused by the roles
        assert!(r.await_node().await); // shell, to the node
        assert_eq!(
            seen(&door),
            Vec::<bool>::new(),
            "nothing overtakes the pty's answer"
        );
        r.node_answered(&door, true).await;
        assert_eq!(seen(&door), vec![true, true, false]);
        r.node_answered(&door, true).await;
        assert_eq!(seen(&door), vec![true, true, false, true]);
        r.node_answered(&door, true).await;
        assert_eq!(seen(&door).len(), 4, "an answer nothing awaits is dropped");
    }

    #[tokio::test]
    async fn a_request_that_never_left_fails_in_its_turn() {
        let (r, door) = (Replies::default(), Seen::default());
        assert!(r.await_node().await);
        assert!(r.await_node().await);
        r.not_sent(&door).await;
        assert_eq!(seen(&door), Vec::<bool>::new());
        r.node_answered(&door, true).await;
        assert_eq!(seen(&door), vec![true, false]);
    }

    #[tokio::test]
    async fn an_ending_session_fails_what_the_node_still_owes_and_sends_nothing_after() {
        let (r, door) = (Replies::default(), Seen::default());
        assert!(r.await_node().await);
        assert!(r.decided(&door, true).await);
        r.close(&door).await;
        assert_eq!(seen(&door), vec![false, true]);
        r.node_answered(&door, true).await;
        assert!(r.decided(&door, true).await);
        assert_eq!(seen(&door), vec![false, true], "nothing after the end");
    }

    #[tokio::test]
    async fn settled_waits_for_the_node_to_answer_what_it_was_asked() {
        let (r, door) = (std::sync::Arc::new(Replies::default()), Seen::default());
        r.settled().await;
        assert!(r.await_node().await);
        assert!(r.decided(&door, true).await);
        let waiting = tokio::spawn({
            let r = r.clone();
            async move { r.settled().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "the node still owes an answer");
        r.node_answered(&door, true).await;
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("settled once the node answered")
            .expect("no panic");
        assert_eq!(seen(&door), vec![true, true]);
    }

    #[tokio::test]
    async fn the_answers_owed_are_bounded() {
        let (r, door) = (Replies::default(), Seen::default());
        assert!(r.await_node().await);
        for _ in 1..MAX_OWED {
            assert!(r.decided(&door, true).await);
        }
        assert!(!r.decided(&door, true).await);
        assert!(!r.await_node().await);
    }
}
