//! The browser terminal's limits, as a person meets them: a terminal nobody types in is ended
//! by the roles' `client_idle_timeout` (4408, the reason named), and a tab that stops reading a
//! flood of output holds the node back instead of growing the proxy, is pinged meanwhile (the
//! pings keep nothing alive), and gets the rest when it reads again.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use futures::StreamExt;
use sallyport_tests::web::*;
use sallyport_tests::*;
use tokio_tungstenite::tungstenite::Message;

const PASSWORD: &str = "correct horse battery";

fn cluster_with(role: &str) -> Cluster {
    let c = Cluster::start();
    c.wait_online("local1");
    c.create(role).ok();
    let token = c.add_user("alice", "impatient", "root");
    c.signup(&token, PASSWORD);
    c
}

#[test]
fn a_terminal_nobody_types_in_is_ended_by_client_idle_timeout() {
    let c = cluster_with(
        "kind: role\nversion: v1\nmetadata: {name: impatient}\nspec:\n  options: {client_idle_timeout: 3s}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    );
    rt().block_on(async {
        let mut b = Browser::new(&c);
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        let mut t = b.terminal("node=local1&login=root").await;
        t.input(b"echo up$((1+1))\n").await;
        t.wait_for("up2").await;
        let quiet = Instant::now();
        assert_eq!(t.closed().await, 4408, "{:?}", t.texts);
        assert!(quiet.elapsed() >= Duration::from_secs(2), "ended early");
        assert!(t.error().contains("client_idle_timeout"), "{:?}", t.texts);
    });
    // The session's end is audited as any session's.
    assert!(
        eventually(Duration::from_secs(10), || !c
            .events("session.end")
            .is_empty()),
        "no session.end"
    );
}

#[test]
fn a_tab_that_stops_reading_holds_the_node_back_not_the_proxy_and_is_pinged() {
    let c = cluster_with(
        "kind: role\nversion: v1\nmetadata: {name: impatient}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    );
    rt().block_on(async {
        let mut b = Browser::new(&c);
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        let mut t = b.terminal("node=local1&login=root").await;
        t.input(b"echo up$((1+1))\n").await;
        t.wait_for("up2").await;
        let before = c.rss();
        // An endless flood, and a tab that reads none of it for longer than a ping's interval.
        t.input(b"yes 0123456789abcdefghijklmnopqrstuvwxyz\n").await;
        tokio::time::sleep(Duration::from_secs(23)).await;
        let grown = c.rss().saturating_sub(before);
        assert!(
            grown < 48 << 20,
            "the proxy grew by {} MiB for a tab that reads nothing",
            grown >> 20
        );
        // Reading again: what waited comes, and the server's ping is among it.
        let (mut pings, mut bytes) = (0, 0usize);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline && (pings == 0 || bytes < 4 << 20) {
            match tokio::time::timeout(Duration::from_secs(5), t.ws.next()).await {
                Ok(Some(Ok(Message::Ping(_)))) => pings += 1,
                Ok(Some(Ok(Message::Binary(b)))) => bytes += b.len(),
                Ok(Some(Ok(_))) => {}
                other => panic!("the terminal ended: {other:?}"),
            }
        }
        assert!(pings >= 1, "no ping in {} s", PING_SECS);
        assert!(
            bytes >= 4 << 20,
            "only {bytes} bytes came once the tab read"
        );
        // The flood stops on Ctrl-C and the shell answers (what was in flight read through,
        // keeping only its tail).
        t.input(b"\x03").await;
        t.input(b"echo done$((1+1))\n").await;
        let mut tail: Vec<u8> = Vec::new();
        let answered = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(Ok(m)) = t.ws.next().await {
                if let Message::Binary(b) = m {
                    tail.extend_from_slice(&b);
                    if tail.windows(5).any(|w| w == b"done2") {
                        return true;
                    }
                    let keep = tail.len().saturating_sub(8);
                    tail.drain(..keep);
                }
            }
            false
        })
        .await;
        assert_eq!(answered, Ok(true), "the shell did not answer after Ctrl-C");
    });
}

/// The server's ping interval (`proxy::web::terminal::PING_EVERY`), for the message.
const PING_SECS: u64 = 20;

#[test]
fn a_login_granted_after_sign_in_says_to_sign_in_again() {
    let c = cluster_with(
        "kind: role\nversion: v1\nmetadata: {name: impatient}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    );
    rt().block_on(async {
        let mut b = Browser::new(&c);
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        // The roles now allow `nobody` too, but the session's certificate was made before.
        let wider = c.dir.path().join("wider.yaml");
        std::fs::write(
            &wider,
            "kind: role\nversion: v1\nmetadata: {name: impatient}\nspec:\n  allow:\n    logins: [root, nobody]\n    node_labels: {'*': '*'}\n",
        )
        .unwrap();
        c.sallyctl(&["create", "-f", &wider.display().to_string()])
            .ok();
        let mut t = b.terminal("node=local1&login=nobody").await;
        assert_eq!(t.closed().await, 4403, "{:?}", t.texts);
        let why = t.error();
        assert!(why.contains("does not allow login nobody"), "{why}");
        assert!(why.contains("sign out and in again"), "{why}");
        assert!(!why.contains("sally login"), "{why}");
    });
}
