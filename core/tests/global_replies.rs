//! Global request replies in order (RFC 4254 §4) with a server that answers a `tcpip-forward`
//! later, as the proxy does (it binds on the node first): our russh patch
//! (`vendor/russh/PATCHES.md`, "Global request replies in order") keeps the replies owed in the
//! order the requests came, where russh took each answer from the callback (stalling the whole
//! connection while it waited) and kept one flag that every request overwrote. Between a real
//! russh server and client over a pipe; the client matches replies to its requests by order,
//! as OpenSSH does.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use russh::server::{Auth, GlobalRequestId, Handle, Session};
use tokio::sync::mpsc;

/// How long the server takes to answer a deferred `tcpip-forward`.
const LATE: Duration = Duration::from_millis(400);

/// The port the server says it allocated (it binds nothing).
const ALLOCATED: u32 = 4321;

/// A server that answers `tcpip-forward` later, from a task of its own (through `Handle`),
/// except for the address "now", answered from the callback as russh handlers always did;
/// `cancel-tcpip-forward` is answered from the callback; russh itself refuses the rest
/// (keepalives among them).
struct Server {
    later: mpsc::UnboundedSender<(Handle, GlobalRequestId)>,
    /// Whether to answer deferred requests at all (false: a server that never does).
    answer: bool,
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

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        if address == "now" {
            if *port == 0 {
                *port = ALLOCATED + 1;
            }
            return Ok(true);
        }
        if let Some(id) = session.defer_global_reply()
            && self.answer
        {
            self.later.send((session.handle(), id)).unwrap();
        }
        // Ignored: the answer was deferred.
        Ok(false)
    }

    async fn cancel_tcpip_forward(
        &mut self,
        _: &str,
        _: u32,
        _: &mut Session,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }
}

/// A connected client of a server that answers deferred requests as `answer` says, each
/// [`LATE`] after it was asked, always as success with [`ALLOCATED`] as the port (which russh
/// must send only for a `tcpip-forward` to port 0).
async fn connect(answer: bool) -> Arc<russh::client::Handle<common::AnyHostKey>> {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Handle, GlobalRequestId)>();
    tokio::spawn(async move {
        while let Some((handle, id)) = rx.recv().await {
            tokio::spawn(async move {
                tokio::time::sleep(LATE).await;
                handle.global_reply(id, true, Some(ALLOCATED)).unwrap();
            });
        }
    });
    let server = Server { later: tx, answer };
    let handle = common::connect(
        server,
        Default::default(),
        common::AnyHostKey,
        Default::default(),
    )
    .await;
    Arc::new(handle)
}

#[tokio::test]
async fn a_late_tcpip_forward_reply_is_not_overtaken_by_a_keepalive_reply() {
    let client = connect(true).await;
    let start = Instant::now();
    let forward = tokio::spawn({
        let client = client.clone();
        async move { client.tcpip_forward("127.0.0.1", 0).await }
    });
    // OpenSSH's keepalive@openssh.com (want_reply) while the forward is pending: russh refuses
    // it at once, but its reply must wait for the forward's, or the client takes it for the
    // forward's (and the forward's success, port and all, for the keepalive's).
    tokio::time::sleep(Duration::from_millis(50)).await;
    client.send_ping().await.unwrap();
    let pinged = start.elapsed();
    assert!(
        pinged >= LATE - Duration::from_millis(60),
        "the keepalive's reply came after {pinged:?}, before the forward's (due after {LATE:?})"
    );
    assert_eq!(
        forward.await.unwrap().ok(),
        Some(ALLOCATED),
        "the forward to port 0 gets its success with the allocated port"
    );
    // A callback's own answer after that goes at once, as before.
    let start = Instant::now();
    client
        .cancel_tcpip_forward("127.0.0.1", ALLOCATED)
        .await
        .unwrap();
    assert!(start.elapsed() < LATE, "nothing older was owed");
}

#[tokio::test]
async fn the_connection_is_not_held_up_while_a_forward_is_pending() {
    // Before, the callback itself waited: nothing else of the connection moved meanwhile. Now
    // a session channel opens (and a forward answered from its callback is answered, in turn)
    // while the deferred forward waits.
    let client = connect(true).await;
    let start = Instant::now();
    let forward = tokio::spawn({
        let client = client.clone();
        async move { client.tcpip_forward("127.0.0.1", 0).await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let opened = client.channel_open_session().await;
    // russh's default handler refuses sessions: what matters is that it answered now.
    assert!(opened.is_err());
    assert!(
        start.elapsed() < LATE,
        "a channel open was answered while the forward was pending"
    );
    let now = client.tcpip_forward("now", 0).await.unwrap();
    assert_eq!(
        now,
        ALLOCATED + 1,
        "a callback's answer carries its port, as before"
    );
    assert!(start.elapsed() >= LATE - Duration::from_millis(60));
    assert_eq!(forward.await.unwrap().ok(), Some(ALLOCATED));
}

#[tokio::test]
async fn a_late_success_for_a_fixed_port_carries_no_port() {
    let client = connect(true).await;
    // The server answers with ALLOCATED; the request named its port, so the success carries
    // none (russh's client reads an empty success as 0).
    assert_eq!(client.tcpip_forward("127.0.0.1", 2222).await.unwrap(), 0);
    assert_eq!(client.tcpip_forward("now", 2223).await.unwrap(), 0);
}

#[tokio::test]
async fn a_peer_with_too_many_global_requests_awaiting_a_reply_is_disconnected() {
    // A server that never answers its deferred forward: every later reply waits behind it, and
    // a peer asking past the bound is disconnected rather than remembered without end.
    let client = connect(false).await;
    tokio::spawn({
        let client = client.clone();
        async move { client.tcpip_forward("127.0.0.1", 0).await }
    });
    // The forward first, so that every keepalive's reply waits behind it.
    tokio::time::sleep(Duration::from_millis(50)).await;
    for _ in 1..russh::server::MAX_PENDING_GLOBAL_REPLIES {
        client.send_keepalive(true).await.unwrap();
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !client.is_closed(),
        "within the bound, the connection stays"
    );
    let _ = client.send_keepalive(true).await;
    let closed = async {
        while !client.is_closed() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), closed)
        .await
        .expect("disconnected past MAX_PENDING_GLOBAL_REPLIES");
}
