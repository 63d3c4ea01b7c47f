//! Channel request replies in order (RFC 4254 §5.4) with a server that answers later, as the
//! proxy does (it relays the node's answers): our russh patch (`vendor/russh/PATCHES.md`)
//! keeps, per channel, the replies owed in the order the requests came, where russh kept one
//! flag that each new request overwrote. Between a real russh server and client over a pipe.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use russh::server::{Auth, ChannelOpenHandle, Handle, Msg, Session};
use russh::{Channel, ChannelId, ChannelMsg};
use tokio::sync::mpsc;

/// A server that answers every request that asked for a reply a little later, in order, from a
/// task of its own (through `Handle`), and the agent request at once (russh sends its answer).
struct Server {
    answers: mpsc::UnboundedSender<(Handle, ChannelId, bool)>,
    /// Whether to answer at all (false: a server that never answers).
    answer: bool,
}

impl Server {
    fn later(&self, ch: ChannelId, ok: bool, session: &mut Session) {
        if self.answer && session.wants_reply(ch) {
            self.answers.send((session.handle(), ch, ok)).unwrap();
        }
    }
}

impl russh::server::Handler for Server {
    type Error = russh::Error;

    async fn auth_publickey(
        &mut self,
        _: &str,
        _: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        Ok(Auth::Accept)
    }

    async fn channel_open_session(
        &mut self,
        _: Channel<Msg>,
        reply: ChannelOpenHandle,
        _: &mut Session,
    ) -> Result<(), Self::Error> {
        reply.accept().await;
        Ok(())
    }

    async fn pty_request(
        &mut self,
        ch: ChannelId,
        _: &str,
        _: u32,
        _: u32,
        _: u32,
        _: u32,
        _: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.later(ch, true, session);
        Ok(())
    }

    async fn env_request(
        &mut self,
        ch: ChannelId,
        _: &str,
        _: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.later(ch, true, session);
        Ok(())
    }

    async fn x11_request(
        &mut self,
        ch: ChannelId,
        _: bool,
        _: &str,
        _: &str,
        _: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.later(ch, false, session);
        Ok(())
    }

    async fn agent_request(&mut self, _: ChannelId, _: &mut Session) -> Result<bool, Self::Error> {
        Ok(true)
    }

    async fn shell_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.later(ch, true, session);
        Ok(())
    }

    async fn exec_request(
        &mut self,
        ch: ChannelId,
        _: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.later(ch, true, session);
        Ok(())
    }
}

/// A connected client and a session channel on a server that answers as `answer` says.
async fn connect(
    answer: bool,
) -> (
    russh::client::Handle<common::AnyHostKey>,
    Channel<russh::client::Msg>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Handle, ChannelId, bool)>();
    // The answers, each 50 ms after the last: every later request is on the wire by then.
    tokio::spawn(async move {
        while let Some((handle, ch, ok)) = rx.recv().await {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let _ = if ok {
                handle.channel_success(ch).await
            } else {
                handle.channel_failure(ch).await
            };
        }
    });
    let server = Server {
        answers: tx,
        answer,
    };
    let handle = common::connect(
        server,
        Default::default(),
        common::AnyHostKey,
        Default::default(),
    )
    .await;
    let channel = handle.channel_open_session().await.unwrap();
    (handle, channel)
}

/// The replies on `channel` (true: success): `n` of them, and any more that follow within
/// half a second.
async fn replies(channel: &mut Channel<russh::client::Msg>, n: usize) -> Vec<bool> {
    let mut got = Vec::new();
    let mut next = async || loop {
        match channel.wait().await {
            Some(ChannelMsg::Success) => return Some(true),
            Some(ChannelMsg::Failure) => return Some(false),
            Some(_) => {}
            None => return None,
        }
    };
    while got.len() < n {
        match tokio::time::timeout(Duration::from_secs(5), next()).await {
            Ok(Some(r)) => got.push(r),
            _ => return got,
        }
    }
    while let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(500), next()).await {
        got.push(r);
    }
    got
}

#[tokio::test]
async fn pipelined_requests_answered_later_get_every_reply_in_order() {
    let (_handle, mut channel) = connect(true).await;
    // What OpenSSH sends for `ssh -t -X -A host`, back to back, without waiting for a reply:
    // the pty request's answer is still owed when the environment (no reply wanted), X11 and
    // agent requests arrive, and russh answers the agent request itself, at once.
    channel
        .request_pty(true, "xterm", 80, 24, 0, 0, &[])
        .await
        .unwrap();
    channel.set_env(false, "LANG", "C.UTF-8").await.unwrap();
    channel
        .request_x11(true, false, "MIT-MAGIC-COOKIE-1", "00", 0)
        .await
        .unwrap();
    channel.agent_forward(true).await.unwrap();
    channel.request_shell(true).await.unwrap();
    assert_eq!(
        replies(&mut channel, 4).await,
        // pty, X11 (refused), agent, shell: one each, in order, none for the environment.
        vec![true, false, true, true],
    );
}

#[tokio::test]
async fn a_reply_wanted_after_one_that_was_not_is_the_only_one_sent() {
    let (_handle, mut channel) = connect(true).await;
    channel.set_env(false, "A", "1").await.unwrap();
    channel.set_env(true, "B", "2").await.unwrap();
    channel.exec(false, "true").await.unwrap();
    assert_eq!(replies(&mut channel, 1).await, vec![true]);
}

#[tokio::test]
async fn a_peer_with_too_many_requests_awaiting_a_reply_is_disconnected() {
    // A server that never answers: the replies owed are bounded, and a peer pipelining past
    // the bound is disconnected rather than remembered without end.
    let (handle, channel) = connect(false).await;
    for _ in 0..russh::MAX_PENDING_REPLIES {
        channel.exec(true, "true").await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !handle.is_closed(),
        "within the bound, the connection stays"
    );
    let _ = channel.exec(true, "true").await;
    let closed = async {
        while !handle.is_closed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("disconnected past MAX_PENDING_REPLIES");
}
