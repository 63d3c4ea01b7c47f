//! The SPDY front end against a client that opens its streams as kubectl does (one at a time,
//! each after the last one's reply), over `sallyport_core::spdy` on an in-memory pipe: which
//! requests are SPDY, which streams are waited for, output and the final Status as kubectl
//! reads them, input taken no faster than the node takes it.

use std::time::Duration;

use axum::http::HeaderMap;
use bytes::Bytes;
use sallyport_core::spdy::{Config, End, Headers, Incoming, Session, Side, Stream};
use tokio::sync::mpsc;

use super::*;

trait Must<T> {
    fn must(self) -> T;
}

impl<T, E: std::fmt::Debug> Must<T> for Result<T, E> {
    fn must(self) -> T {
        self.unwrap_or_else(|e| panic!("{e:?}"))
    }
}

impl<T> Must<T> for Option<T> {
    fn must(self) -> T {
        self.unwrap_or_else(|| panic!("none"))
    }
}

fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(
            axum::http::HeaderName::from_bytes(k.as_bytes()).must(),
            v.parse().must(),
        );
    }
    h
}

#[test]
fn a_spdy_upgrade_is_served_when_it_offers_v4() {
    let kubectl = [
        ("Connection", "Upgrade"),
        ("Upgrade", "SPDY/3.1"),
        ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
        ("X-Stream-Protocol-Version", "v3.channel.k8s.io"),
        ("X-Stream-Protocol-Version", "v2.channel.k8s.io"),
        ("X-Stream-Protocol-Version", "channel.k8s.io"),
    ];
    type Case<'a> = (&'a [(&'a str, &'a str)], bool, Option<&'a str>);
    let cases: &[Case] = &[
        (&kubectl, true, Some("v4.channel.k8s.io")),
        (
            &[
                ("connection", "keep-alive, upgrade"),
                ("upgrade", "spdy/3.1"),
                (
                    "x-stream-protocol-version",
                    "v3.channel.k8s.io, v4.channel.k8s.io",
                ),
            ],
            true,
            Some("v4.channel.k8s.io"),
        ),
        // Older protocols only: their error stream is no Status.
        (
            &[
                ("Connection", "Upgrade"),
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v3.channel.k8s.io"),
            ],
            true,
            None,
        ),
        (
            &[
                ("Upgrade", "SPDY/3.1"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
            ],
            false,
            None,
        ),
        (
            &[
                ("Connection", "Upgrade"),
                ("Upgrade", "websocket"),
                ("X-Stream-Protocol-Version", "v4.channel.k8s.io"),
            ],
            false,
            None,
        ),
        (&[], false, None),
    ];
    for (h, upgrade, protocol) in cases {
        let h = headers(h);
        assert_eq!(is_upgrade(&h), *upgrade, "{h:?}");
        assert_eq!(offered(&h), *protocol, "{h:?}");
    }
    let resp = switching(PROTOCOL);
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers()["upgrade"], "SPDY/3.1");
    assert_eq!(resp.headers()["connection"], "Upgrade");
    assert_eq!(
        resp.headers()["x-stream-protocol-version"],
        "v4.channel.k8s.io"
    );
}

#[test]
fn the_streams_waited_for_follow_the_query() {
    let q = |s: &str| exec::read_query(s, "exec").must();
    let e = Expected::of(&q("command=ls&stdout=true&stderr=true"));
    assert_eq!(
        e,
        Expected {
            stdin: false,
            stdout: true,
            stderr: true,
            resize: false
        }
    );
    // A terminal: no stderr (the kubelet refuses both), and a resize stream.
    let e = Expected::of(&q("command=sh&stdin=true&stdout=true&stderr=true&tty=true"));
    assert_eq!(
        e,
        Expected {
            stdin: true,
            stdout: true,
            stderr: false,
            resize: true
        }
    );
}

#[test]
fn resize_messages_are_read_across_pieces() {
    let mut buf = Vec::new();
    assert_eq!(resizes(&mut buf, b"{\"Width\":100,"), vec![]);
    assert_eq!(
        resizes(
            &mut buf,
            b"\"Height\":40}\n{\"Width\":80,\"Height\":24}\n{\"Wid"
        ),
        vec![(100, 40), (80, 24)]
    );
    assert_eq!(resizes(&mut buf, b"th\":1,\"Height\":2}"), vec![(1, 2)]);
    assert!(buf.is_empty());
    // Without newlines, sizes that make no sense, and garbage: what can be read is.
    assert_eq!(
        resizes(
            &mut buf,
            b"{\"Width\":0,\"Height\":5}{\"Width\":99999,\"Height\":5} {\"Width\":3,\"Height\":4}"
        ),
        vec![(3, 4)]
    );
    assert_eq!(
        resizes(&mut buf, b"not json {\"Width\":3,\"Height\":4}"),
        vec![]
    );
    assert!(buf.is_empty());
    // An object that never ends is not kept past its bound.
    let mut long = b"{\"Width\":\"".to_vec();
    long.extend(std::iter::repeat_n(b'x', 2 * MAX_RESIZE));
    assert_eq!(resizes(&mut buf, &long), vec![]);
    assert!(buf.is_empty());
}

/// A connected pair: the door's side (server) and kubectl's (client).
fn connection() -> (Session, Incoming, Session) {
    let (a, b) = tokio::io::duplex(256 * 1024);
    let (door, incoming) = Session::start(a, Side::Server, Config::default());
    let (kubectl, _) = Session::start(b, Side::Client, Config::default());
    (door, incoming, kubectl)
}

/// Opens `kinds` as kubectl does: one after the other, each once replied to.
async fn open_as_kubectl(kubectl: &Session, kinds: &[&str]) -> Vec<Stream> {
    let mut out = Vec::new();
    for k in kinds {
        out.push(
            kubectl
                .open(Headers::new().with("streamType", k))
                .await
                .must(),
        );
    }
    out
}

async fn read_all(s: &mut Stream) -> Vec<u8> {
    let mut got = Vec::new();
    while let Some(d) = s.recv.read().await {
        got.extend_from_slice(&d);
    }
    got
}

#[tokio::test]
async fn kubectls_streams_carry_output_and_end_with_the_status() {
    let (door, mut incoming, kubectl) = connection();
    let expected = Expected {
        stdin: true,
        stdout: true,
        stderr: true,
        resize: false,
    };
    let opener = {
        let kubectl = kubectl.clone();
        tokio::spawn(async move {
            open_as_kubectl(&kubectl, &["error", "stdin", "stdout", "stderr"]).await
        })
    };
    let Ok(kinds) = accept_streams(&mut incoming, expected, Duration::from_secs(5)).await else {
        panic!("kubectl's streams were not all taken");
    };
    let mut client = opener.await.must();
    let window = Arc::new(InputWindow::new(INPUT_WINDOW as usize));
    let (streams, stdin, resize) = SpdyStreams::new(door.clone(), kinds, window);
    assert!(stdin.is_some() && resize.is_none());
    assert!(streams.output(false, Bytes::from_static(b"out\n")).await);
    assert!(streams.output(true, Bytes::from_static(b"err\n")).await);
    assert_eq!(streams.window(), Some(INPUT_WINDOW));
    let status = serde_json::json!({"metadata": {}, "status": "Success"});
    streams.finish(status.clone()).await;
    assert!(!streams.output(false, Bytes::from_static(b"late")).await);
    // kubectl reads stdout and stderr to their end, then the error stream's Status; its stdin
    // stream ends too, which is what lets kubectl's stdin copy finish.
    let [error, stdin, stdout, stderr] = &mut client[..] else {
        panic!("four streams");
    };
    assert_eq!(read_all(stdout).await, b"out\n");
    assert_eq!(read_all(stderr).await, b"err\n");
    let said: serde_json::Value = serde_json::from_slice(&read_all(error).await).must();
    assert_eq!(said, status);
    assert_eq!(read_all(stdin).await, b"");
    for s in [error, stdin, stdout, stderr] {
        assert_eq!(s.recv.end(), Some(End::Fin));
    }
    // Then GOAWAY: kubectl's side of the connection is over.
    tokio::time::timeout(Duration::from_secs(5), kubectl.ended())
        .await
        .must();
}

#[tokio::test]
async fn a_terminals_output_goes_to_stdout_and_missing_streams_time_out() {
    let (door, mut incoming, kubectl) = connection();
    let expected = Expected {
        stdin: true,
        stdout: true,
        stderr: false,
        resize: true,
    };
    let opener = {
        let kubectl = kubectl.clone();
        tokio::spawn(async move {
            // An unknown kind is replied to and ignored; stdin never comes.
            open_as_kubectl(&kubectl, &["error", "stdout", "bogus", "resize"]).await
        })
    };
    let kinds = match accept_streams(&mut incoming, expected, Duration::from_millis(300)).await {
        Err(k) => k,
        Ok(_) => panic!("the streams were complete without stdin"),
    };
    let client = opener.await.must();
    assert_eq!(client.len(), 4, "every stream was replied to");
    assert!(kinds.error.is_some() && kinds.stdout.is_some() && kinds.resize.is_some());
    assert!(kinds.stdin.is_none() && kinds.stderr.is_none());
    // With what there is, stderr falls back to stdout.
    let (streams, _, _) = SpdyStreams::new(
        door,
        kinds,
        Arc::new(InputWindow::new(INPUT_WINDOW as usize)),
    );
    assert!(streams.output(true, Bytes::from_static(b"to stdout")).await);
    let mut client = client;
    streams
        .finish(serde_json::json!({"status": "Failure"}))
        .await;
    assert_eq!(read_all(&mut client[1]).await, b"to stdout");
}

async fn next(rx: &mut mpsc::Receiver<Input>) -> Input {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .must()
        .must()
}

#[tokio::test]
async fn input_is_taken_no_faster_than_the_node_takes_it() {
    let (door, mut incoming, kubectl) = connection();
    let expected = Expected {
        stdin: true,
        stdout: true,
        stderr: false,
        resize: true,
    };
    let opener = {
        let kubectl = kubectl.clone();
        tokio::spawn(async move {
            open_as_kubectl(&kubectl, &["error", "stdin", "stdout", "resize"]).await
        })
    };
    let Ok(kinds) = accept_streams(&mut incoming, expected, Duration::from_secs(5)).await else {
        panic!("kubectl's streams were not all taken");
    };
    let mut client = opener.await.must();
    let window = Arc::new(InputWindow::new(INPUT_WINDOW as usize));
    let (_streams, stdin, resize) = SpdyStreams::new(door.clone(), kinds, window.clone());
    let (tx, mut rx) = mpsc::channel(16);
    tokio::spawn(read_input(door, stdin, resize, window.clone(), tx));

    client[3]
        .send
        .write(Bytes::from_static(b"{\"Width\":120,\"Height\":30}\n"))
        .await
        .must();
    assert!(matches!(
        next(&mut rx).await,
        Input::Resize {
            cols: 120,
            rows: 30
        }
    ));
    // 3 MiB of stdin while the node takes nothing: about the input window is taken, then
    // reading stops (and with it the connection's, which holds kubectl's writes back).
    let mut stdin_stream = client.remove(1);
    let stdin_writer = tokio::spawn(async move {
        let send = &mut stdin_stream.send;
        send.write(Bytes::from(vec![7u8; 3 << 20])).await.must();
        send.finish().await.must();
        stdin_stream
    });
    let mut taken = 0;
    while let Ok(Some(i)) = tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
        let Input::Data(d) = i else {
            panic!("{i:?}");
        };
        taken += d.len();
    }
    assert!(
        taken >= INPUT_WINDOW as usize && taken < INPUT_WINDOW as usize + 64 * 1024,
        "{taken}"
    );
    assert!(!stdin_writer.is_finished());
    // The node takes it all: the rest follows, then stdin's end.
    let mut eof = false;
    while !eof {
        window.consumed(taken);
        taken = 0;
        match next(&mut rx).await {
            Input::Data(d) => taken += d.len(),
            Input::Eof => eof = true,
            i => panic!("{i:?}"),
        }
    }
    stdin_writer.await.must();
    // kubectl goes away: said once.
    kubectl.close().await;
    assert!(matches!(next(&mut rx).await, Input::Closed));
}
