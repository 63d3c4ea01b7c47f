//! `sally ssh -L/-R/-D/-A`: OpenSSH's forwarding, over the inner connection to the node.
//!
//! `-L [bind:]port:host:hostport` and `-D [bind:]port` listen here (loopback unless a bind
//! address is given) and open `direct-tcpip` channels; `-R [bind:]port:host:hostport` asks the
//! node to listen and connects what arrives to host:hostport here; `-A` answers the node's
//! agent channels from `$SSH_AUTH_SOCK`.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result, anyhow, bail};
use russh::client::Handle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::ssh::HostCheck;

type Failure = Arc<Mutex<Option<String>>>;

/// `[bind:]port:host:hostport`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    pub bind: Option<String>,
    pub port: u16,
    pub host: String,
    pub host_port: u16,
}

fn split_spec(s: &str) -> Vec<String> {
    // Colons inside [brackets] (IPv6 addresses) do not separate.
    let mut parts = vec![String::new()];
    let mut depth = 0;
    for ch in s.chars() {
        match ch {
            '[' => depth += 1,
            ']' => depth -= 1,
            ':' if depth == 0 => {
                parts.push(String::new());
                continue;
            }
            _ => {}
        }
        if let Some(last) = parts.last_mut()
            && ch != '['
            && ch != ']'
        {
            last.push(ch);
        }
    }
    parts
}

fn port(s: &str, what: &str) -> Result<u16> {
    s.parse()
        .map_err(|_| anyhow!("{what} {s:?} is not a port number"))
}

impl std::str::FromStr for Spec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let p = split_spec(s);
        let (bind, rest) = match p.len() {
            3 => (None, &p[..]),
            4 => (Some(p[0].clone()), &p[1..]),
            _ => bail!("{s:?}: expected [bind_address:]port:host:hostport"),
        };
        Ok(Spec {
            bind: bind.filter(|b| !b.is_empty()),
            port: port(&rest[0], "listen port")?,
            host: rest[1].clone(),
            host_port: port(&rest[2], "target port")?,
        })
    }
}

/// `[bind:]port` for `-D`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DynamicSpec {
    pub bind: Option<String>,
    pub port: u16,
}

impl std::str::FromStr for DynamicSpec {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Self> {
        let p = split_spec(s);
        match p.as_slice() {
            [port_s] => Ok(DynamicSpec {
                bind: None,
                port: port(port_s, "listen port")?,
            }),
            [bind, port_s] => Ok(DynamicSpec {
                bind: Some(bind.clone()).filter(|b| !b.is_empty()),
                port: port(port_s, "listen port")?,
            }),
            _ => bail!("{s:?}: expected [bind_address:]port"),
        }
    }
}

/// A remote forward as the node names it: the (address, port) asked for.
pub type RemoteKey = (String, u32);

/// What the node may open toward us: remote forwards by the (address, port) asked for, and
/// the local agent when `-A` was given.
#[derive(Clone, Default)]
pub struct Incoming {
    pub remote: Arc<Mutex<HashMap<RemoteKey, (String, u16)>>>,
    pub agent: Option<PathBuf>,
}

async fn bind(bind: Option<&str>, port: u16) -> Result<TcpListener> {
    let host = bind.unwrap_or("127.0.0.1");
    let host = if host == "*" { "0.0.0.0" } else { host };
    TcpListener::bind((host, port))
        .await
        .with_context(|| format!("cannot listen on {host}:{port}"))
}

/// `-L`: starts listening now (so a busy port is an error before the session starts), then
/// serves in the background.
pub async fn local(handle: Arc<Handle<HostCheck>>, failure: Failure, spec: Spec) -> Result<()> {
    let listener = bind(spec.bind.as_deref(), spec.port).await?;
    tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            let (handle, host, failure) = (handle.clone(), spec.host.clone(), failure.clone());
            let target = u32::from(spec.host_port);
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                match open(&handle, &failure, &host, target, peer).await {
                    Ok(ch) => {
                        sallyport_core::flow::splice(tcp, ch).await;
                    }
                    Err(e) => eprintln!("sally: forward to {host}:{target} refused: {e}"),
                }
            });
        }
    });
    Ok(())
}

async fn open(
    handle: &Handle<HostCheck>,
    failure: &Failure,
    host: &str,
    port: u32,
    peer: SocketAddr,
) -> Result<russh::ChannelStream<russh::client::Msg>> {
    let ch = handle
        .channel_open_direct_tcpip(host, port, peer.ip().to_string(), u32::from(peer.port()))
        .await;
    match ch {
        Ok(ch) => Ok(ch.into_stream()),
        Err(e) => Err(anyhow!(
            "{}",
            sallyport_core::flow::open_failure_reason(failure, e).await
        )),
    }
}

/// `-D`: a SOCKS5 (and SOCKS4a) server whose CONNECTs become `direct-tcpip` channels, names
/// resolved on the node's side.
pub async fn dynamic(
    handle: Arc<Handle<HostCheck>>,
    failure: Failure,
    spec: DynamicSpec,
) -> Result<()> {
    let listener = bind(spec.bind.as_deref(), spec.port).await?;
    tokio::spawn(async move {
        while let Ok((tcp, peer)) = listener.accept().await {
            let (handle, failure) = (handle.clone(), failure.clone());
            tokio::spawn(async move {
                let _ = tcp.set_nodelay(true);
                if let Err(e) = socks(&handle, &failure, tcp, peer).await {
                    eprintln!("sally: SOCKS: {e}");
                }
            });
        }
    });
    Ok(())
}

async fn socks(
    handle: &Handle<HostCheck>,
    failure: &Failure,
    mut tcp: TcpStream,
    peer: SocketAddr,
) -> Result<()> {
    let version = tcp.read_u8().await?;
    match version {
        5 => {
            let n = tcp.read_u8().await?;
            let mut methods = vec![0u8; usize::from(n)];
            tcp.read_exact(&mut methods).await?;
            if !methods.contains(&0) {
                tcp.write_all(&[5, 0xff]).await?;
                bail!("the SOCKS client offers no method without authentication");
            }
            tcp.write_all(&[5, 0]).await?;
            let mut head = [0u8; 4];
            tcp.read_exact(&mut head).await?;
            if head[1] != 1 {
                tcp.write_all(&[5, 7, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
                bail!("only CONNECT is supported");
            }
            let host = match head[3] {
                1 => {
                    let mut a = [0u8; 4];
                    tcp.read_exact(&mut a).await?;
                    std::net::Ipv4Addr::from(a).to_string()
                }
                3 => {
                    let len = tcp.read_u8().await?;
                    let mut name = vec![0u8; usize::from(len)];
                    tcp.read_exact(&mut name).await?;
                    String::from_utf8(name).map_err(|_| anyhow!("a host name that is not UTF-8"))?
                }
                4 => {
                    let mut a = [0u8; 16];
                    tcp.read_exact(&mut a).await?;
                    std::net::Ipv6Addr::from(a).to_string()
                }
                t => bail!("unknown SOCKS address type {t}"),
            };
            let port = tcp.read_u16().await?;
            match open(handle, failure, &host, u32::from(port), peer).await {
                Ok(ch) => {
                    tcp.write_all(&[5, 0, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
                    sallyport_core::flow::splice(tcp, ch).await;
                    Ok(())
                }
                Err(e) => {
                    tcp.write_all(&[5, 5, 0, 1, 0, 0, 0, 0, 0, 0]).await?;
                    Err(anyhow!("{host}:{port}: {e}"))
                }
            }
        }
        4 => {
            let mut head = [0u8; 7];
            tcp.read_exact(&mut head).await?;
            if head[0] != 1 {
                bail!("only CONNECT is supported");
            }
            let port = u16::from_be_bytes([head[1], head[2]]);
            let ip = std::net::Ipv4Addr::new(head[3], head[4], head[5], head[6]);
            let _user = read_nul(&mut tcp).await?;
            // SOCKS4a: 0.0.0.x means a host name follows.
            let host = if head[3..6] == [0, 0, 0] && head[6] != 0 {
                read_nul(&mut tcp).await?
            } else {
                ip.to_string()
            };
            match open(handle, failure, &host, u32::from(port), peer).await {
                Ok(ch) => {
                    tcp.write_all(&[0, 90, 0, 0, 0, 0, 0, 0]).await?;
                    sallyport_core::flow::splice(tcp, ch).await;
                    Ok(())
                }
                Err(e) => {
                    tcp.write_all(&[0, 91, 0, 0, 0, 0, 0, 0]).await?;
                    Err(anyhow!("{host}:{port}: {e}"))
                }
            }
        }
        v => bail!("SOCKS version {v} is not supported"),
    }
}

async fn read_nul(tcp: &mut TcpStream) -> Result<String> {
    let mut out = Vec::new();
    loop {
        let b = tcp.read_u8().await?;
        if b == 0 {
            break;
        }
        if out.len() >= 255 {
            bail!("a SOCKS4 field longer than 255 bytes");
        }
        out.push(b);
    }
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// `-R`: asks the node to listen; what arrives is connected to host:hostport from here.
pub async fn remote(handle: &Handle<HostCheck>, incoming: &Incoming, spec: Spec) -> Result<()> {
    let address = spec.bind.clone().unwrap_or_else(|| "localhost".into());
    let port = handle
        .tcpip_forward(address.clone(), u32::from(spec.port))
        .await
        .map_err(|_| {
            anyhow!(
                "remote port forwarding failed for listen port {}: refused by the proxy or the node",
                spec.port
            )
        })?;
    let port = if spec.port == 0 {
        eprintln!(
            "Allocated port {port} for remote forward to {}:{}",
            spec.host, spec.host_port
        );
        port
    } else {
        u32::from(spec.port)
    };
    if let Ok(mut r) = incoming.remote.lock() {
        r.insert((address, port), (spec.host, spec.host_port));
    }
    Ok(())
}
