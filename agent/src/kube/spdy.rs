//! The kube agent's exec stream over SPDY/3.1 (`v4.channel.k8s.io`), for an API server that
//! refused the WebSocket (`exec`): the streams opened as kubectl opens them, one after the other
//! once each is replied to (error, stdin if asked, stdout, stderr unless a terminal, resize for
//! a terminal), and relayed as the SSH channel exactly as the WebSocket is: stdout as data,
//! stderr as extended data 1, the error stream's Status as the exit status, the channel's EOF
//! as stdin's FIN, window changes as resize messages.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use russh::ChannelWriteHalf;
use russh::server::Msg;
use sallyport_core::kube::KubeExec;
use sallyport_core::spdy::{Config, End, Headers, RecvStream, SendStream, Session, Side, Stream};
use tokio::io::{AsyncRead, AsyncWrite};

use super::exec::{Input, exit_of};

pub const UPGRADE: &str = "SPDY/3.1";

/// How long the API server has to reply to the streams (kubectl's own wait).
const STREAMS_TIMEOUT: Duration = Duration::from_secs(30);
/// The most of the error stream read: one Status.
const MAX_STATUS: usize = 64 * 1024;

/// An exec's streams with the API server.
pub struct SpdyExec {
    session: Session,
    error: Stream,
    stdin: Option<Stream>,
    stdout: Stream,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

impl SpdyExec {
    /// Opens the streams of `e` on the upgraded connection `io`.
    pub async fn open<IO>(io: IO, e: &KubeExec) -> Result<Self, String>
    where
        IO: AsyncRead + AsyncWrite + Send + 'static,
    {
        // Streams the API server would open are refused: none is expected.
        let (session, _) = Session::start(io, Side::Client, Config::default());
        let opened = tokio::time::timeout(STREAMS_TIMEOUT, async {
            let open = |kind: &'static str| {
                let session = session.clone();
                async move {
                    session
                        .open(Headers::new().with("streamType", kind))
                        .await
                        .map_err(|err| {
                            format!("the API server did not take the {kind} stream: {err}")
                        })
                }
            };
            let error = open("error").await?;
            let stdin = if e.stdin {
                Some(open("stdin").await?)
            } else {
                None
            };
            let stdout = open("stdout").await?;
            let stderr = if e.tty {
                None
            } else {
                Some(open("stderr").await?)
            };
            let resize = if e.tty {
                Some(open("resize").await?)
            } else {
                None
            };
            Ok::<_, String>((error, stdin, stdout, stderr, resize))
        })
        .await;
        let (error, stdin, stdout, stderr, resize) = match opened {
            Ok(Ok(s)) => s,
            Ok(Err(why)) => {
                session.close().await;
                return Err(why);
            }
            Err(_) => {
                session.close().await;
                return Err("the API server did not reply to the exec's streams in time".into());
            }
        };
        Ok(SpdyExec {
            session,
            error,
            stdin,
            stdout,
            stderr,
            resize,
        })
    }

    /// Carries the streams to the channel and the channel's input to them, until the API
    /// server ends the exec or the channel closes.
    pub async fn relay(self, out: Arc<ChannelWriteHalf<Msg>>, input: super::exec::Inbox) {
        let SpdyExec {
            session,
            error,
            stdin,
            stdout,
            stderr,
            resize,
        } = self;
        // What the API server sends on stdin and resize is nothing to read: dropped.
        let writer = tokio::spawn(write_input(
            session.clone(),
            stdin.map(|s| s.send),
            resize.map(|s| s.send),
            input,
        ));
        let to_stdout = copy(stdout.recv, out.clone(), None);
        let to_stderr = async {
            if let Some(s) = stderr {
                copy(s.recv, out.clone(), Some(1)).await;
            }
        };
        let status = read_status(error.recv);
        // As kubectl: stdout and stderr to their ends, and the Status.
        let ((), (), (said, end)) = tokio::join!(to_stdout, to_stderr, status);
        let exit = if said.is_empty() && end != Some(End::Closed) {
            // An error stream ended empty: kubectl takes that for success too.
            0
        } else {
            match exit_of(&said) {
                Ok(code) => code,
                Err(message) => {
                    let message = if said.is_empty() && writer.is_finished() {
                        // The channel closed first: the proxy ended the session (kubectl
                        // left, say), and this side closed the API server's streams
                        // (`write_input`). Nobody reads the channel any more.
                        let m = "the session was closed before the API server's exec ended";
                        tracing::debug!("kube exec over SPDY: {m}");
                        m.to_string()
                    } else if said.is_empty() {
                        let m = "the API server's exec stream ended without a status";
                        tracing::warn!("kube exec over SPDY: {m}");
                        m.to_string()
                    } else {
                        message
                    };
                    let _ = out
                        .extended_data_bytes(1, Bytes::from(format!("{message}\r\n")))
                        .await;
                    1
                }
            }
        };
        writer.abort();
        session.close().await;
        let _ = out.exit_status(exit).await;
        let _ = out.eof().await;
        let _ = out.close().await;
    }
}

/// The channel's input to the API server; the session closed once the channel is gone.
async fn write_input(
    session: Session,
    mut stdin: Option<SendStream>,
    mut resize: Option<SendStream>,
    mut input: super::exec::Inbox,
) {
    while let Some(i) = input.recv().await {
        match i {
            Input::Data(d) => {
                if let Some(s) = stdin.as_mut()
                    && s.write(d.data()).await.is_err()
                {
                    stdin = None;
                }
            }
            Input::Eof => {
                if let Some(mut s) = stdin.take() {
                    let _ = s.finish().await;
                }
            }
            Input::Resize(cols, rows) => {
                if let Some(s) = resize.as_mut() {
                    // As Go's json.Encoder writes it, newline and all.
                    let size = format!("{{\"Width\":{cols},\"Height\":{rows}}}\n");
                    let _ = s.write(Bytes::from(size)).await;
                }
            }
        }
    }
    // The channel closed: the exec is over for the proxy.
    session.close().await;
}

/// A stream's bytes to the channel (`ext` 1: as stderr), until either ends.
async fn copy(mut from: RecvStream, out: Arc<ChannelWriteHalf<Msg>>, ext: Option<u32>) {
    while let Some(d) = from.read().await {
        let sent = match ext {
            Some(n) => out.extended_data_bytes(n, d).await,
            None => out.data_bytes(d).await,
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The error stream's content (one Status, bounded), and how it ended.
async fn read_status(mut from: RecvStream) -> (Vec<u8>, Option<End>) {
    let mut said = Vec::new();
    while let Some(d) = from.read().await {
        let room = MAX_STATUS.saturating_sub(said.len());
        said.extend_from_slice(&d[..d.len().min(room)]);
    }
    (said, from.end())
}
