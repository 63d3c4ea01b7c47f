//! What the node does for forwarding, as sshd would: connects `direct-tcpip` channels (`ssh -L`,
//! `ssh -D`), listens for `tcpip-forward` (`ssh -R`, on loopback only), and offers a forwarded
//! SSH agent (`ssh -A`) on a socket only the login can reach. Every listener and connection
//! belongs to one SSH connection and ends with it.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use russh::server::{Handle, Msg};
use russh::{Channel, ChannelOpenFailure, ChannelStream};
use sallyport_core::flow;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio_util::sync::CancellationToken;

/// Connects a `direct-tcpip` channel to `host:port` from the node, then relays until either
/// side closes or the SSH connection ends.
pub async fn direct(
    channel: Channel<Msg>,
    handle: Handle,
    host: String,
    port: u32,
    reply: russh::server::ChannelOpenHandle,
    stop: CancellationToken,
) {
    let Ok(port) = u16::try_from(port) else {
        reply.reject(ChannelOpenFailure::ConnectFailed).await;
        return;
    };
    let tcp = tokio::time::timeout(
        Duration::from_secs(10),
        TcpStream::connect((host.as_str(), port)),
    )
    .await;
    let tcp = match tcp {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            tracing::debug!(%host, port, error = %e, "forward target refused");
            reply
                .reject(ChannelOpenFailure::Other {
                    code: 2,
                    reason: format!("connect to {host}:{port} failed: {e}"),
                })
                .await;
            return;
        }
        Err(_) => {
            reply
                .reject(ChannelOpenFailure::Other {
                    code: 2,
                    reason: format!("connect to {host}:{port} timed out"),
                })
                .await;
            return;
        }
    };
    let _ = tcp.set_nodelay(true);
    reply.accept().await;
    splice(credited(channel, &handle), tcp, stop).await;
}

/// A channel's byte stream that gives the proxy its window back as the bytes read from it are
/// written on (this server runs `WindowPolicy::Consumed`): a slow socket slows the proxy.
fn credited(channel: Channel<Msg>, handle: &Handle) -> flow::Credited<ChannelStream<Msg>> {
    let credit = flow::server_credit(handle.clone(), channel.id());
    flow::Credited::new(channel.into_stream(), credit)
}

/// Relays two byte streams until both directions end or `stop` fires.
pub async fn splice<A, B>(a: A, b: B, stop: CancellationToken)
where
    A: tokio::io::AsyncRead + tokio::io::AsyncWrite,
    B: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    tokio::select! {
        _ = sallyport_core::flow::splice(a, b) => {}
        _ = stop.cancelled() => {}
    }
}

/// The address a remote forward listens on: loopback, whatever the client asked for, unless it
/// named a loopback address itself. `None` for anything else (refused, as sshd's
/// `GatewayPorts no` would bind loopback and refuse explicit outside addresses).
pub fn bind_address(requested: &str) -> Option<IpAddr> {
    match requested {
        "" | "localhost" | "0.0.0.0" | "*" | "::" => Some(IpAddr::V4(Ipv4Addr::LOCALHOST)),
        other => other.parse::<IpAddr>().ok().filter(|ip| ip.is_loopback()),
    }
}

/// Accepts on `listener` until `stop` (after the first connection when `single`); each
/// connection is relayed over the channel `open` makes toward the client for its peer.
async fn relay_accepted<F, Fut>(
    listener: TcpListener,
    handle: Handle,
    stop: CancellationToken,
    single: bool,
    what: &'static str,
    open: F,
) where
    F: Fn(SocketAddr) -> Fut,
    Fut: std::future::Future<Output = Result<Channel<Msg>, russh::Error>> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        let Ok((tcp, peer)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (channel, stop, handle) = (open(peer), stop.clone(), handle.clone());
        tokio::spawn(async move {
            match channel.await {
                Ok(ch) => splice(credited(ch, &handle), tcp, stop).await,
                Err(e) => tracing::debug!(error = %e, what, "the client refused the channel"),
            }
        });
        if single {
            return;
        }
    }
}

/// Listens for `ssh -R`: each connection becomes a `forwarded-tcpip` channel to the client,
/// named with the address and port the client asked for.
pub async fn listen_remote(
    listener: TcpListener,
    handle: Handle,
    requested: String,
    port: u32,
    stop: CancellationToken,
) {
    relay_accepted(
        listener,
        handle.clone(),
        stop,
        false,
        "remote forward",
        move |peer| {
            let (handle, requested) = (handle.clone(), requested.clone());
            async move {
                handle
                    .channel_open_forwarded_tcpip(
                        requested,
                        port,
                        peer.ip().to_string(),
                        u32::from(peer.port()),
                    )
                    .await
            }
        },
    )
    .await;
}

/// Binds a remote forward's listener for the login `uid`. The agent runs as root, but the
/// listener is the login's: a port the login could not bind itself is refused.
pub async fn bind_remote(requested: &str, port: u32, uid: u32) -> Result<TcpListener, String> {
    let ip = bind_address(requested).ok_or_else(|| {
        format!("remote forwards bind on the node's loopback only, not {requested}")
    })?;
    let port = u16::try_from(port).map_err(|_| format!("{port} is not a port"))?;
    login_may_bind(uid, port, unprivileged_port_start())?;
    TcpListener::bind(SocketAddr::new(ip, port))
        .await
        .map_err(|e| format!("cannot listen on {ip}:{port}: {e}"))
}

/// The lowest port a process without `CAP_NET_BIND_SERVICE` may bind
/// (`net.ipv4.ip_unprivileged_port_start`, 1024 unless the host changed it).
fn unprivileged_port_start() -> u16 {
    std::fs::read_to_string("/proc/sys/net/ipv4/ip_unprivileged_port_start")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(1024)
}

/// What the kernel would decide for a process running as `uid` without extra capabilities: a
/// port below `start` needs root. (The listener is the agent's own socket: the agent is
/// multi-threaded and cannot switch one thread to the login, so it applies the kernel's rule
/// for the login instead of binding as it; `unsafe` stays confined to the session spawn. A login
/// given `CAP_NET_BIND_SERVICE` through its programs' file capabilities does not get it here,
/// which errs on the refusing side.) Port 0 asks for any free port, which is never privileged.
pub fn login_may_bind(uid: u32, port: u16, start: u16) -> Result<(), String> {
    if port == 0 || port >= start || uid == 0 {
        Ok(())
    } else {
        Err(format!(
            "port {port} is privileged (below {start}) and the login is not root"
        ))
    }
}

/// A forwarded agent: a socket in a fresh directory owned by the login (0700), whose
/// connections become `auth-agent@openssh.com` channels to the client. The directory is
/// removed when the connection ends.
pub struct AgentSocket {
    pub dir: PathBuf,
    pub path: PathBuf,
}

impl AgentSocket {
    pub fn create(uid: u32, gid: u32) -> Result<(Self, UnixListener), String> {
        let name = format!("sallyport-agent-{}", sallyport_core::random_hex(8));
        let dir = std::env::temp_dir().join(name);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let owned = || -> Result<(PathBuf, UnixListener), String> {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| e.to_string())?;
            let path = dir.join("agent.sock");
            let listener = UnixListener::bind(&path).map_err(|e| e.to_string())?;
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid)).map_err(|e| e.to_string())?;
            Ok((path, listener))
        };
        match owned() {
            Ok((path, listener)) => Ok((AgentSocket { dir, path }, listener)),
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                Err(format!("cannot create the forwarded agent socket: {e}"))
            }
        }
    }

    pub async fn serve(self, listener: UnixListener, handle: Handle, stop: CancellationToken) {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = stop.cancelled() => break,
            };
            let Ok((unix, _)) = accepted else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let (handle, stop) = (handle.clone(), stop.clone());
            tokio::spawn(async move {
                match handle.channel_open_agent().await {
                    Ok(ch) => {
                        splice(credited(ch, &handle), unix, stop).await;
                    }
                    Err(e) => tracing::debug!(error = %e, "agent channel refused by the client"),
                }
            });
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// X11 forwarding as sshd does it with `X11UseLocalhost yes`: a display on 127.0.0.1:6000+N
/// (N from 10 up), the client's (fake) cookie added to the login's `~/.Xauthority` with
/// `xauth`, and every connection to the display an `x11` channel to the client, which swaps in
/// the real cookie. Returns the `DISPLAY` value.
pub async fn x11_display(
    login: &crate::passwd::Login,
    protocol: &str,
    cookie: &str,
    screen: u32,
) -> Result<(String, TcpListener), String> {
    if protocol != "MIT-MAGIC-COOKIE-1"
        || cookie.is_empty()
        || cookie.len() > 256
        || !cookie.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Err(format!("unsupported X11 authentication {protocol:?}"));
    }
    let mut found = None;
    for n in 10..1000u16 {
        if let Ok(l) = TcpListener::bind((Ipv4Addr::LOCALHOST, 6000 + n)).await {
            found = Some((n, l));
            break;
        }
    }
    let (n, listener) = found.ok_or("no free X11 display between 10 and 999")?;
    let xauth = [
        "/usr/bin/xauth",
        "/usr/X11R6/bin/xauth",
        "/usr/local/bin/xauth",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())
    .ok_or("xauth is not installed on the node (Debian: xauth)")?;
    let mut child = tokio::process::Command::new(xauth)
        .arg("-q")
        .arg("-")
        .env_clear()
        .env("HOME", &login.home)
        .env("PATH", "/usr/bin:/bin")
        .current_dir(if login.home.is_dir() {
            login.home.clone()
        } else {
            "/".into()
        })
        .uid(login.uid)
        .gid(login.gid)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run xauth: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        use tokio::io::AsyncWriteExt;
        let script =
            format!("remove unix:{n}.{screen}\nadd unix:{n}.{screen} {protocol} {cookie}\n");
        stdin
            .write_all(script.as_bytes())
            .await
            .map_err(|e| format!("xauth: {e}"))?;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| format!("xauth: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "xauth failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok((format!("localhost:{n}.{screen}"), listener))
}

/// Serves an X11 display: each connection becomes an `x11` channel (only the first when
/// `single`), until the SSH connection ends.
pub async fn serve_x11(
    listener: TcpListener,
    handle: Handle,
    single: bool,
    stop: CancellationToken,
) {
    relay_accepted(listener, handle.clone(), stop, single, "x11", move |peer| {
        let handle = handle.clone();
        async move {
            handle
                .channel_open_x11(peer.ip().to_string(), u32::from(peer.port()))
                .await
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_login_binds_what_the_kernel_would_let_it() {
        for (uid, port, start, ok) in [
            (1000, 80, 1024, false),
            (1000, 1023, 1024, false),
            (1000, 1024, 1024, true),
            (1000, 0, 1024, true),
            (1000, 80, 80, true),
            (1000, 80, 0, true),
            (0, 22, 1024, true),
        ] {
            assert_eq!(
                login_may_bind(uid, port, start).is_ok(),
                ok,
                "{uid} {port} {start}"
            );
        }
    }
}
