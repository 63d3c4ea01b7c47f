//! Consumer-driven channel windows (russh `WindowPolicy::Consumed`, our patch in
//! `vendor/russh/PATCHES.md`, with `flow::windowed_inbox`), between a real russh server and
//! client: a sender streaming 64 MiB to a consumer four times slower than the link may get at
//! most about one window ahead of what was consumed, each way. Under russh's own
//! `WindowPolicy::Auto` the same stream piles up tens of megabytes, which is what these tests
//! exist to catch.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use russh::server::{Auth, ChannelOpenHandle, Msg, Session};
use russh::{Channel, ChannelId, ChannelMsg, WindowPolicy};
use sallyport_core::flow::{self, Input};

const WINDOW: u32 = 1024 * 1024;
const TOTAL: usize = 64 * 1024 * 1024;
const CHUNK: usize = 256 * 1024;

/// Bytes the receiving session got, bytes its consumer finished with, and the most the first
/// ever led the second by.
#[derive(Default)]
struct Ledger {
    received: AtomicUsize,
    consumed: AtomicUsize,
    peak: AtomicUsize,
}

impl Ledger {
    fn received(&self, n: usize) {
        let received = self.received.fetch_add(n, Ordering::SeqCst) + n;
        let behind = received.saturating_sub(self.consumed.load(Ordering::SeqCst));
        self.peak.fetch_max(behind, Ordering::SeqCst);
    }

    /// A slow consumer: about 64 MiB/s (a millisecond per 64 KiB), well below what russh
    /// moves through a pipe here.
    async fn consume(&self, n: usize) {
        tokio::time::sleep(Duration::from_micros((n as u64 * 1000) / (64 * 1024))).await;
        self.consumed.fetch_add(n, Ordering::SeqCst);
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Receiver {
    Server,
    Client,
}

struct Server {
    ledger: Arc<Ledger>,
    policy: WindowPolicy,
    receiver: Receiver,
    inbox: Option<flow::Sender>,
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
        channel: Channel<Msg>,
        reply: ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let id = channel.id();
        if self.receiver == Receiver::Client {
            // The sender: every write waits for the client's window.
            tokio::spawn(async move {
                let chunk = Bytes::from(vec![0u8; CHUNK]);
                for _ in 0..TOTAL / CHUNK {
                    channel.data_bytes(chunk.clone()).await.unwrap();
                }
                channel.eof().await.unwrap();
            });
        } else {
            drop(channel);
            let handle = session.handle();
            let (tx, mut rx) = match self.policy {
                WindowPolicy::Consumed => flow::windowed_inbox(
                    WINDOW,
                    Arc::new(move |n| {
                        let _ = handle.consumed(id, n);
                    }),
                ),
                WindowPolicy::Auto => flow::inbox(),
            };
            self.inbox = Some(tx);
            let ledger = self.ledger.clone();
            tokio::spawn(async move {
                while let Some(item) = rx.recv().await {
                    if let Input::Data(d) = item {
                        ledger.consume(d.len()).await;
                    }
                }
            });
        }
        reply.accept().await;
        Ok(())
    }

    async fn data(
        &mut self,
        _: ChannelId,
        data: &[u8],
        _: &mut Session,
    ) -> Result<(), Self::Error> {
        self.ledger.received(data.len());
        if let Some(tx) = &self.inbox {
            assert!(
                tx.send(Input::Data(Bytes::copy_from_slice(data))).await,
                "the client kept to its window"
            );
        }
        Ok(())
    }
}

struct Client {
    ledger: Arc<Ledger>,
}

impl russh::client::Handler for Client {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        _: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        Ok(true)
    }

    async fn data(
        &mut self,
        _: ChannelId,
        data: &[u8],
        _: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        self.ledger.received(data.len());
        Ok(())
    }
}

/// Streams [`TOTAL`] bytes to a slow consumer on `receiver`'s side, under `policy` there;
/// returns the most that was ever received and not yet consumed.
async fn stream(policy: WindowPolicy, receiver: Receiver) -> usize {
    let ledger = Arc::new(Ledger::default());
    let server_config = russh::server::Config {
        window_size: WINDOW,
        // As Sallyport's own settings (`sshcert`): russh's default of 100 queued messages
        // would hide the backlog in its channel queue, and stall nested session loops.
        channel_buffer_size: flow::CHANNEL_BUFFER,
        window_policy: if receiver == Receiver::Server {
            policy
        } else {
            WindowPolicy::Auto
        },
        ..Default::default()
    };
    let client_config = russh::client::Config {
        window_size: WINDOW,
        channel_buffer_size: flow::CHANNEL_BUFFER,
        window_policy: if receiver == Receiver::Client {
            policy
        } else {
            WindowPolicy::Auto
        },
        ..Default::default()
    };
    let server = Server {
        ledger: ledger.clone(),
        policy,
        receiver,
        inbox: None,
    };
    let client = Client {
        ledger: ledger.clone(),
    };
    let handle = common::connect(server, server_config, client, client_config).await;
    let mut channel = handle.channel_open_session().await.unwrap();
    let id = channel.id();
    if receiver == Receiver::Server {
        let chunk = Bytes::from(vec![0u8; CHUNK]);
        for _ in 0..TOTAL / CHUNK {
            channel.data_bytes(chunk.clone()).await.unwrap();
        }
        channel.eof().await.unwrap();
    } else {
        // As the proxy reads a node's output: through the channel, reporting each chunk once
        // it is handed on.
        let mut got = 0;
        while got < TOTAL {
            match channel.wait().await {
                Some(ChannelMsg::Data { data }) => {
                    ledger.consume(data.len()).await;
                    handle.consumed(id, data.len()).unwrap();
                    got += data.len();
                }
                Some(_) => {}
                None => break,
            }
        }
    }
    let done = async {
        while ledger.consumed.load(Ordering::SeqCst) < TOTAL {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(60), done)
        .await
        .expect("every byte consumed");
    assert_eq!(ledger.received.load(Ordering::SeqCst), TOTAL);
    ledger.peak.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_server_side_consumer_holds_the_client_to_the_window() {
    let peak = stream(WindowPolicy::Consumed, Receiver::Server).await;
    assert!(
        peak <= 2 * WINDOW as usize,
        "{peak} bytes were received and not consumed (window {WINDOW})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_client_side_consumer_holds_the_server_to_the_window() {
    let peak = stream(WindowPolicy::Consumed, Receiver::Client).await;
    assert!(
        peak <= 2 * WINDOW as usize,
        "{peak} bytes were received and not consumed (window {WINDOW})"
    );
}

/// The same streams under russh's own policy, which re-opens the window on receipt: the
/// backlog grows far beyond the window (what the tests above would see without the patch).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_it_a_slow_consumer_falls_megabytes_behind() {
    for receiver in [Receiver::Server, Receiver::Client] {
        let peak = stream(WindowPolicy::Auto, receiver).await;
        assert!(
            peak > 8 * WINDOW as usize,
            "only {peak} bytes were ever behind (window {WINDOW})"
        );
    }
}
