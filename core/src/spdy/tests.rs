//! SPDY/3.1 as data and against itself: the dictionary and header blocks checked against real
//! zlib's output (Python's, as `tests/kube/spdy31.py` makes them), every frame through the
//! codec, frames split at any boundary, a session against itself both ways at once, and flow
//! control against a hand-driven peer: windows exhausted and reopened, SETTINGS, a peer that
//! never opens windows (spdystream), PING echoes, limits.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

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

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).must())
        .collect()
}

#[test]
fn the_dictionary_is_spdy3s_byte_for_byte() {
    let d = dictionary();
    assert_eq!(d.len(), 1423);
    assert_eq!(
        ::hex::encode(crate::sha256(d)),
        "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
    );
    assert_eq!(adler32(d), 0xE3C6_A7C2);
    assert_eq!(adler32(b""), 1);
    assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
}

/// Three header blocks real zlib compressed in one stream with the dictionary, each ended with
/// a sync flush (`zlib.compressobj(9, ..., zdict=...)` and `Z_SYNC_FLUSH`): the second refers
/// back into the first.
const PYTHON_BLOCKS: [&str; 3] = [
    "78f9e3c6a7c202a62346703a2b294a4dcc851625aca9a08006000000ffff",
    "c22e555c02cc2e00000000ffff",
    "02e5292096acd08548ea023369497e727e8e2e225d2b9799e8016d079697397ad916c57a99f90c65c6e82298c51817c2ff00000000ffff",
];

fn block(raw: &[u8]) -> Headers {
    Headers::decode(raw).must()
}

#[test]
fn real_zlibs_header_blocks_read_in_one_context() {
    let mut inflate = HeaderInflate::new();
    let got: Vec<Headers> = PYTHON_BLOCKS
        .iter()
        .map(|b| block(&inflate.decompress(&hex(b), 4096).must()))
        .collect();
    assert_eq!(got[0], Headers::new().with("streamtype", "error"));
    assert_eq!(got[1], Headers::new().with("streamtype", "stdin"));
    assert_eq!(
        got[2],
        Headers::new()
            .with("x-stream-protocol-version", "v4.channel.k8s.io")
            .with("x-stream-protocol-version", "v3.channel.k8s.io")
            .with("content-type", "text/plain")
    );
    // The second block alone means nothing: a fresh context has no zlib header for it.
    assert!(
        HeaderInflate::new()
            .decompress(&hex(PYTHON_BLOCKS[1]), 4096)
            .is_err()
    );
    // Nor after only the third: the context is the whole stream, in order.
    let mut skipped = HeaderInflate::new();
    skipped.decompress(&hex(PYTHON_BLOCKS[0]), 4096).must();
    let wrong = skipped.decompress(&hex(PYTHON_BLOCKS[2]), 4096);
    assert!(wrong.is_err() || Headers::decode(&wrong.must()) != Ok(got[2].clone()));
}

#[test]
fn our_header_blocks_name_the_dictionary_and_keep_their_context() {
    let mut deflate = HeaderDeflate::new();
    let h = Headers::new()
        .with("streamtype", "stdout")
        .with("content-type", "text/plain");
    let raw = h.encode();
    let (mut first, mut second) = (Vec::new(), Vec::new());
    deflate.compress(&raw, &mut first).must();
    deflate.compress(&raw, &mut second).must();
    // zlib, level best, FDICT, the SPDY/3 dictionary's id: what Go's zlib writer starts with.
    assert_eq!(first[..6], [0x78, 0xF9, 0xE3, 0xC6, 0xA7, 0xC2]);
    // Each block ends with the sync flush's empty stored block.
    assert!(first.ends_with(&[0, 0, 0xFF, 0xFF]) && second.ends_with(&[0, 0, 0xFF, 0xFF]));
    // The same block again is mostly a reference back: the context carried over.
    assert!(second.len() < first.len() - 6, "{first:?} {second:?}");
    // "content-type" and "text/plain" are in the dictionary: a match from the first block on.
    assert!(first.len() < raw.len(), "{} >= {}", first.len(), raw.len());
    let mut inflate = HeaderInflate::new();
    assert_eq!(block(&inflate.decompress(&first, 4096).must()), h);
    assert_eq!(block(&inflate.decompress(&second, 4096).must()), h);
}

#[test]
fn header_blocks_are_bounded_and_checked() {
    // 1 MiB of one header compresses to a few KiB: refused past the limit, not allocated.
    let big = Headers::new().with("x", &"a".repeat(1024 * 1024));
    let mut out = Vec::new();
    HeaderDeflate::new()
        .compress(&big.encode(), &mut out)
        .must();
    assert!(out.len() < 16 * 1024);
    assert!(matches!(
        HeaderInflate::new().decompress(&out, 64 * 1024),
        Err(FrameError::TooLarge { .. })
    ));
    // Another dictionary named.
    assert!(
        HeaderInflate::new()
            .decompress(&[0x78, 0xF9, 1, 2, 3, 4, 0, 0, 0, 0xFF, 0xFF], 4096)
            .is_err()
    );
    // A count that the block cannot hold.
    assert!(Headers::decode(&[0, 0xFF, 0xFF, 0xFF, 0, 0, 0, 1, b'a']).is_err());
    // Bytes after the block.
    let mut raw = Headers::new().with("a", "b").encode();
    raw.push(0);
    assert!(Headers::decode(&raw).is_err());
    // A long name over a value of NULs would be that name once per piece: refused, where 64
    // KiB would have become a gigabyte.
    let mut raw = Vec::new();
    raw.extend(1u32.to_be_bytes());
    raw.extend((32 * 1024u32).to_be_bytes());
    raw.extend(std::iter::repeat_n(b'n', 32 * 1024));
    raw.extend((32 * 1024u32).to_be_bytes());
    raw.extend(std::iter::repeat_n(0u8, 32 * 1024));
    assert!(Headers::decode(&raw).is_err());
    // Many empty pieces of a short name: past the entry cap.
    let mut raw = Vec::new();
    raw.extend(1u32.to_be_bytes());
    raw.extend(1u32.to_be_bytes());
    raw.push(b'n');
    raw.extend(4096u32.to_be_bytes());
    raw.extend(std::iter::repeat_n(0u8, 4096));
    assert!(Headers::decode(&raw).is_err());
    // What kubectl sends reads as ever.
    let kubectl = Headers::new()
        .with("streamtype", "data")
        .with("port", "8080")
        .with("requestid", "0");
    assert_eq!(Headers::decode(&kubectl.encode()).must(), kubectl);
}

fn every_frame() -> Vec<Frame> {
    vec![
        Frame::SynStream {
            id: 1,
            associated: 0,
            priority: 3,
            fin: false,
            unidirectional: false,
            headers: Headers::new().with("streamtype", "error"),
        },
        Frame::SynStream {
            id: 3,
            associated: 1,
            priority: 0,
            fin: true,
            unidirectional: true,
            headers: Headers::new()
                .with("streamtype", "stdin")
                .with("port", "80"),
        },
        Frame::SynReply {
            id: 1,
            fin: false,
            headers: Headers::new(),
        },
        Frame::Data {
            id: 1,
            fin: false,
            data: Bytes::from_static(b"hello"),
        },
        Frame::Data {
            id: 3,
            fin: true,
            data: Bytes::new(),
        },
        Frame::Headers {
            id: 1,
            fin: true,
            headers: Headers::new().with("a", "b"),
        },
        Frame::RstStream {
            id: 5,
            status: rst::CANCEL,
        },
        Frame::Settings(vec![Setting {
            flags: 0,
            id: SETTINGS_INITIAL_WINDOW_SIZE,
            value: 1 << 20,
        }]),
        Frame::Ping(7),
        Frame::WindowUpdate {
            id: 0,
            delta: 12345,
        },
        Frame::GoAway {
            last_good: 3,
            status: goaway::OK,
        },
    ]
}

/// Decodes all of `wire`, fed in pieces of the given sizes (cycled), joining DATA pieces.
fn decode_in_pieces(wire: &[u8], sizes: &[usize]) -> Vec<Frame> {
    let mut dec = Decoder::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut frames: Vec<Frame> = Vec::new();
    let mut at = 0;
    let mut i = 0;
    while at < wire.len() {
        let n = sizes[i % sizes.len()].max(1).min(wire.len() - at);
        i += 1;
        buf.extend_from_slice(&wire[at..at + n]);
        at += n;
        while let Some(f) = dec.decode(&mut buf).must() {
            // A DATA frame may come in pieces: joined again here until its end. (No two DATA
            // frames of one stream follow each other in the frames decoded here.)
            match (frames.last_mut(), f) {
                (
                    Some(Frame::Data {
                        id: pid,
                        fin: pfin @ false,
                        data: pdata,
                    }),
                    Frame::Data { id, fin, data },
                ) if *pid == id => {
                    let mut joined = BytesMut::from(&pdata[..]);
                    joined.extend_from_slice(&data);
                    *pdata = joined.freeze();
                    *pfin = fin;
                }
                (_, f) => frames.push(f),
            }
        }
    }
    assert!(buf.is_empty());
    frames
}

#[test]
fn every_frame_round_trips_through_the_codec() {
    let mut enc = Encoder::new();
    let mut wire = BytesMut::new();
    for f in every_frame() {
        enc.encode(&f, &mut wire).must();
    }
    assert_eq!(decode_in_pieces(&wire, &[wire.len()]), every_frame());
}

proptest! {
    #[test]
    fn frames_split_at_any_boundary_read_the_same(sizes in proptest::collection::vec(1usize..40, 1..20)) {
        let mut enc = Encoder::new();
        let mut wire = BytesMut::new();
        for f in every_frame() {
            enc.encode(&f, &mut wire).must();
        }
        prop_assert_eq!(decode_in_pieces(&wire, &sizes), every_frame());
    }
}

#[test]
fn data_frames_are_handed_on_as_they_arrive() {
    let mut enc = Encoder::new();
    let mut wire = BytesMut::new();
    let payload = Bytes::from(vec![7u8; 100_000]);
    enc.encode(
        &Frame::Data {
            id: 1,
            fin: true,
            data: payload.clone(),
        },
        &mut wire,
    )
    .must();
    let mut dec = Decoder::new(Limits::default());
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    let mut fins = 0;
    for piece in wire.chunks(4096) {
        buf.extend_from_slice(piece);
        while let Some(Frame::Data { data, fin, .. }) = dec.decode(&mut buf).must() {
            assert!(data.len() <= 4096);
            got.extend_from_slice(&data);
            fins += usize::from(fin);
        }
    }
    assert_eq!(got, payload);
    assert_eq!(fins, 1);
}

#[test]
fn control_frames_past_the_limit_and_bad_frames_are_refused() {
    let mut dec = Decoder::new(Limits {
        max_control: 100,
        max_header_block: 100,
    });
    // A SYN_STREAM saying 1000 bytes: refused from its head, before they arrive.
    let mut buf = BytesMut::from(&[0x80, 3, 0, 1, 0, 0, 0x03, 0xE8][..]);
    assert!(matches!(
        dec.decode(&mut buf),
        Err(FrameError::TooLarge { len: 1000, .. })
    ));
    let mut dec = Decoder::new(Limits::default());
    let mut buf = BytesMut::from(&[0x80, 2, 0, 6, 0, 0, 0, 4, 0, 0, 0, 1][..]);
    assert_eq!(dec.decode(&mut buf), Err(FrameError::Version(2)));
    let mut buf = BytesMut::from(&[0, 0, 0, 0, 0, 0, 0, 1, 9][..]);
    assert!(Decoder::new(Limits::default()).decode(&mut buf).is_err());
    // An unknown control type is skipped.
    let mut buf = BytesMut::from(
        &[
            0x80, 3, 0, 0x42, 0, 0, 0, 2, 1, 2, 0x80, 3, 0, 6, 0, 0, 0, 4, 0, 0, 0, 9,
        ][..],
    );
    assert_eq!(
        Decoder::new(Limits::default()).decode(&mut buf),
        Ok(Some(Frame::Ping(9)))
    );
}

/// The far end of a connection, driven by hand.
struct Raw {
    io: DuplexStream,
    enc: Encoder,
    dec: Decoder,
    buf: BytesMut,
}

impl Raw {
    fn new(io: DuplexStream) -> Self {
        Raw {
            io,
            enc: Encoder::new(),
            dec: Decoder::new(Limits::default()),
            buf: BytesMut::new(),
        }
    }

    async fn send(&mut self, f: Frame) {
        let mut b = BytesMut::new();
        self.enc.encode(&f, &mut b).must();
        self.io.write_all(&b).await.must();
    }

    /// The next frame, `None` at EOF or after `wait` without one.
    async fn next_within(&mut self, wait: Duration) -> Option<Frame> {
        loop {
            if let Some(f) = self.dec.decode(&mut self.buf).must() {
                return Some(f);
            }
            let read = tokio::time::timeout(wait, self.io.read_buf(&mut self.buf)).await;
            match read {
                Ok(Ok(n)) if n > 0 => {}
                _ => return None,
            }
        }
    }

    async fn next(&mut self) -> Frame {
        self.next_within(Duration::from_secs(5)).await.must()
    }

    /// Frames until `until` matches one; DATA bytes for stream `id` counted on the way.
    async fn data_until(&mut self, wait: Duration) -> (usize, Vec<Frame>) {
        let (mut bytes, mut other) = (0, Vec::new());
        while let Some(f) = self.next_within(wait).await {
            match f {
                Frame::Data { data, .. } => bytes += data.len(),
                f => other.push(f),
            }
        }
        (bytes, other)
    }
}

/// A session and, at its far end, a peer driven by hand (past the session's first frame).
async fn pair(config: Config) -> (Session, Incoming, Raw) {
    let (a, b) = tokio::io::duplex(1 << 20);
    let (s, i) = Session::start(a, Side::Server, config);
    let mut raw = Raw::new(b);
    // First, the session says what window it gives.
    assert_eq!(
        raw.next().await,
        Frame::Settings(vec![Setting {
            flags: 0,
            id: SETTINGS_INITIAL_WINDOW_SIZE,
            value: config.window
        }])
    );
    (s, i, raw)
}

async fn open_raw(raw: &mut Raw, incoming: &mut Incoming, id: u32) -> Stream {
    raw.send(Frame::SynStream {
        id,
        associated: 0,
        priority: 0,
        fin: false,
        unidirectional: false,
        headers: Headers::new().with("streamtype", "stdout"),
    })
    .await;
    let req = incoming.next().await.must();
    assert_eq!(req.id, id);
    assert_eq!(req.headers.get("streamType"), Some("stdout"));
    let s = req.accept().await.must();
    assert_eq!(
        raw.next().await,
        Frame::SynReply {
            id,
            fin: false,
            headers: Headers::new()
        }
    );
    s
}

#[tokio::test]
async fn a_session_talks_to_itself_both_ways_with_half_close() {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (server, mut incoming) = Session::start(a, Side::Server, Config::default());
    let (client, _none) = Session::start(b, Side::Client, Config::default());
    let big: Bytes = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let echo = tokio::spawn(async move {
        let mut n = 0;
        while let Some(req) = incoming.next().await {
            n += 1;
            let kind = req
                .headers
                .get("streamtype")
                .unwrap_or_default()
                .to_string();
            let mut s = req.accept().await.must();
            tokio::spawn(async move {
                // Echo while reading (both ways at once), then say how it ended.
                while let Some(d) = s.recv.read().await {
                    s.send.write(d).await.must();
                }
                assert_eq!(s.recv.end(), Some(End::Fin), "{kind}");
                s.send.write(Bytes::from(kind)).await.must();
                s.send.finish().await.must();
            });
        }
        n
    });
    let mut streams = Vec::new();
    for kind in ["error", "stdin", "stdout"] {
        let s = client
            .open(Headers::new().with("streamType", kind))
            .await
            .must();
        assert_eq!(s.id % 2, 1);
        streams.push((kind, s));
    }
    let mut tasks = Vec::new();
    for (kind, s) in streams {
        let big = big.clone();
        tasks.push(tokio::spawn(async move {
            let Stream {
                mut recv, mut send, ..
            } = s;
            let writer = tokio::spawn(async move {
                send.write(big).await.must();
                send.finish().await.must();
            });
            let mut got = Vec::new();
            while let Some(d) = recv.read().await {
                got.extend_from_slice(&d);
            }
            writer.await.must();
            assert_eq!(recv.end(), Some(End::Fin));
            (kind, got)
        }));
    }
    for t in tasks {
        let (kind, got) = t.await.must();
        assert_eq!(got.len(), big.len() + kind.len());
        assert!(got[..big.len()] == big[..], "{kind}: the echo differs");
        assert_eq!(&got[big.len()..], kind.as_bytes());
    }
    client.close().await;
    tokio::time::timeout(Duration::from_secs(5), server.ended())
        .await
        .must();
    assert_eq!(echo.await.must(), 3);
}

#[tokio::test]
async fn a_peer_without_flow_control_is_never_waited_for() {
    // spdystream: never a WINDOW_UPDATE. 1 MiB goes out all the same.
    let (server, mut incoming, mut raw) = pair(Config::default()).await;
    let mut s = open_raw(&mut raw, &mut incoming, 1).await;
    let writer = tokio::spawn(async move {
        s.send.write(Bytes::from(vec![1u8; 1 << 20])).await.must();
        s.send.finish().await.must();
        s
    });
    let (bytes, _) = raw.data_until(Duration::from_millis(500)).await;
    assert_eq!(bytes, 1 << 20);
    writer.await.must();
    drop(server);
}

#[tokio::test]
async fn the_peers_window_is_waited_for_once_it_does_flow_control() {
    let (_server, mut incoming, mut raw) = pair(Config::default()).await;
    // The peer says its streams start with 16 KiB.
    raw.send(Frame::Settings(vec![Setting {
        flags: 0,
        id: SETTINGS_INITIAL_WINDOW_SIZE,
        value: 16 * 1024,
    }]))
    .await;
    let mut s = open_raw(&mut raw, &mut incoming, 1).await;
    let writer = tokio::spawn(async move {
        s.send.write(Bytes::from(vec![2u8; 200_000])).await.must();
        s
    });
    let quiet = Duration::from_millis(300);
    let (bytes, _) = raw.data_until(quiet).await;
    assert_eq!(bytes, 16 * 1024, "the stream's window");
    raw.send(Frame::WindowUpdate {
        id: 1,
        delta: 100_000,
    })
    .await;
    let (bytes, _) = raw.data_until(quiet).await;
    assert_eq!(bytes, 64 * 1024 - 16 * 1024, "then the session's window");
    raw.send(Frame::WindowUpdate {
        id: 0,
        delta: 1 << 20,
    })
    .await;
    let (bytes, _) = raw.data_until(quiet).await;
    assert_eq!(
        bytes,
        100_000 + 16 * 1024 - 64 * 1024,
        "then the stream's again"
    );
    assert!(!writer.is_finished());
    raw.send(Frame::WindowUpdate {
        id: 1,
        delta: 1 << 20,
    })
    .await;
    let (bytes, _) = raw.data_until(quiet).await;
    assert_eq!(bytes, 200_000 - 100_000 - 16 * 1024);
    writer.await.must();
}

#[tokio::test]
async fn consuming_sends_window_updates_and_a_slow_reader_holds_the_peer_back() {
    let (_server, mut incoming, mut raw) = pair(Config::default()).await;
    let mut s = open_raw(&mut raw, &mut incoming, 1).await;
    // The peer sends 256 KiB regardless of windows (as spdystream would), then a PING.
    let chunk = Bytes::from(vec![3u8; 32 * 1024]);
    for _ in 0..8 {
        raw.send(Frame::Data {
            id: 1,
            fin: false,
            data: chunk.clone(),
        })
        .await;
    }
    raw.send(Frame::Ping(5)).await;
    // Nobody reads: the session holds about a window and stops reading, so no echo yet.
    assert_eq!(raw.next_within(Duration::from_millis(300)).await, None);
    // Reading lets it on: the PING is answered, and what was read is given back as window, at
    // half a window at a time, for the stream and for the session.
    let mut read = 0;
    while read < 8 * 32 * 1024 {
        read += s.recv.read().await.must().len();
    }
    let mut stream_updates = 0;
    let mut session_updates = 0;
    let mut pinged = false;
    while let Some(f) = raw.next_within(Duration::from_millis(300)).await {
        match f {
            Frame::WindowUpdate { id: 1, delta } => stream_updates += delta,
            Frame::WindowUpdate { id: 0, delta } => session_updates += delta,
            Frame::Ping(5) => pinged = true,
            f => panic!("{f:?}"),
        }
    }
    assert!(pinged);
    assert_eq!(stream_updates, 8 * 32 * 1024);
    assert_eq!(session_updates, 8 * 32 * 1024);
}

#[tokio::test]
async fn pings_of_the_peers_parity_are_echoed_and_ours_are_not() {
    let (_server, _incoming, mut raw) = pair(Config::default()).await;
    raw.send(Frame::Ping(1)).await;
    raw.send(Frame::Ping(2)).await;
    raw.send(Frame::Ping(3)).await;
    assert_eq!(raw.next().await, Frame::Ping(1));
    assert_eq!(raw.next().await, Frame::Ping(3));
    assert_eq!(raw.next_within(Duration::from_millis(200)).await, None);
}

#[tokio::test]
async fn too_many_streams_are_refused_and_bad_ids_are_protocol_errors() {
    let config = Config {
        max_streams: 2,
        ..Config::default()
    };
    let (_server, mut incoming, mut raw) = pair(config).await;
    let _a = open_raw(&mut raw, &mut incoming, 1).await;
    let _b = open_raw(&mut raw, &mut incoming, 3).await;
    for id in [5, 2, 3] {
        raw.send(Frame::SynStream {
            id,
            associated: 0,
            priority: 0,
            fin: false,
            unidirectional: false,
            headers: Headers::new(),
        })
        .await;
    }
    assert_eq!(
        raw.next().await,
        Frame::RstStream {
            id: 5,
            status: rst::REFUSED_STREAM
        }
    );
    // An even id from a client, and an id that went backwards.
    for id in [2, 3] {
        assert_eq!(
            raw.next().await,
            Frame::RstStream {
                id,
                status: rst::PROTOCOL_ERROR
            }
        );
    }
    // A stream nobody takes is refused too.
    drop(incoming);
    raw.send(Frame::RstStream {
        id: 1,
        status: rst::CANCEL,
    })
    .await;
    raw.send(Frame::SynStream {
        id: 7,
        associated: 0,
        priority: 0,
        fin: false,
        unidirectional: false,
        headers: Headers::new(),
    })
    .await;
    assert_eq!(
        raw.next().await,
        Frame::RstStream {
            id: 7,
            status: rst::REFUSED_STREAM
        }
    );
}

#[tokio::test]
async fn a_frame_past_the_limit_ends_the_connection_with_goaway() {
    let (server, _incoming, mut raw) = pair(Config::default()).await;
    raw.io
        .write_all(&[0x80, 3, 0, 4, 0, 0x10, 0, 0])
        .await
        .must();
    assert_eq!(
        raw.next().await,
        Frame::GoAway {
            last_good: 0,
            status: goaway::PROTOCOL_ERROR
        }
    );
    assert_eq!(raw.next_within(Duration::from_secs(2)).await, None);
    tokio::time::timeout(Duration::from_secs(2), server.ended())
        .await
        .must();
}

#[tokio::test]
async fn reset_and_goaway_end_readers_writers_and_openers() {
    let (server, mut incoming, mut raw) = pair(Config::default()).await;
    let mut s = open_raw(&mut raw, &mut incoming, 1).await;
    raw.send(Frame::RstStream {
        id: 1,
        status: rst::CANCEL,
    })
    .await;
    assert_eq!(s.recv.read().await, None);
    assert_eq!(s.recv.end(), Some(End::Reset(rst::CANCEL)));
    assert!(s.send.write(Bytes::from_static(b"x")).await.is_err());
    // A stream this side opens, refused.
    let opener = {
        let server = server.clone();
        tokio::spawn(async move { server.open(Headers::new().with("a", "b")).await })
    };
    let Frame::SynStream { id, headers, .. } = raw.next().await else {
        panic!("no SYN_STREAM");
    };
    assert_eq!((id, headers.get("a")), (2, Some("b")));
    raw.send(Frame::RstStream {
        id: 2,
        status: rst::REFUSED_STREAM,
    })
    .await;
    assert!(matches!(
        opener.await.must(),
        Err(Error::Refused(rst::REFUSED_STREAM))
    ));
    // GOAWAY: the peer's side is over.
    let mut s3 = open_raw(&mut raw, &mut incoming, 3).await;
    raw.send(Frame::GoAway {
        last_good: 0,
        status: goaway::OK,
    })
    .await;
    assert_eq!(s3.recv.read().await, None);
    assert_eq!(s3.recv.end(), Some(End::Closed));
    tokio::time::timeout(Duration::from_secs(2), server.ended())
        .await
        .must();
    assert!(matches!(
        server.open(Headers::new()).await,
        Err(Error::Closed)
    ));
    // This side's close: what was written, then GOAWAY, then EOF.
    s3.send.write(Bytes::from_static(b"last")).await.must();
    server.close().await;
    let (mut data, mut after) = (Vec::new(), Vec::new());
    while let Some(f) = raw.next_within(Duration::from_secs(2)).await {
        match f {
            Frame::Data { id: 3, data: d, .. } if after.is_empty() => data.extend_from_slice(&d),
            f => after.push(f),
        }
    }
    assert_eq!(data, b"last");
    assert_eq!(
        after,
        vec![Frame::GoAway {
            last_good: 3,
            status: goaway::OK
        }]
    );
}

#[tokio::test]
async fn what_the_peer_sends_after_this_sides_goaway_still_arrives() {
    // A Status may be on its way when this side's writing ends: it is read all the same.
    let (server, mut incoming, mut raw) = pair(Config::default()).await;
    let mut s = open_raw(&mut raw, &mut incoming, 1).await;
    server.close().await;
    assert_eq!(
        raw.next().await,
        Frame::GoAway {
            last_good: 1,
            status: goaway::OK
        }
    );
    raw.send(Frame::Data {
        id: 1,
        fin: true,
        data: Bytes::from_static(b"the status"),
    })
    .await;
    assert_eq!(
        s.recv.read().await.must(),
        Bytes::from_static(b"the status")
    );
    assert_eq!(s.recv.read().await, None);
    assert_eq!(s.recv.end(), Some(End::Fin));
    assert!(s.send.write(Bytes::from_static(b"x")).await.is_err());
}

#[tokio::test]
async fn an_abort_lets_go_of_a_peer_that_stopped_reading() {
    // A peer without flow control that stops reading: the writer is stuck mid-write.
    let config = Config {
        drain: Duration::from_millis(100),
        ..Config::default()
    };
    let (server, mut incoming, mut raw) = pair(config).await;
    let mut s = open_raw(&mut raw, &mut incoming, 1).await;
    let writer = tokio::spawn(async move {
        let _ = s.send.write(Bytes::from(vec![1u8; 4 << 20])).await;
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        !writer.is_finished(),
        "the peer took 4 MiB through a 1 MiB pipe"
    );
    server.abort();
    // The connection is let go: the peer's writes then fail (its far end is gone).
    let ping = {
        let mut b = BytesMut::new();
        raw.enc.encode(&Frame::Ping(2), &mut b).must();
        b
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        if raw.io.write_all(&ping).await.is_err() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the aborted session still holds its connection"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    writer.abort();
}
