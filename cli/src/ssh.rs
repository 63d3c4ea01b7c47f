//! `sally ssh` and `sally proxy ssh`: an SSH client (russh) that reaches nodes the way OpenSSH
//! does through the proxy — an outer connection to the proxy's port 3023, a `direct-tcpip`
//! channel to the node, and the inner SSH connection inside it — trusting hosts only through
//! the cluster's host CA and authenticating with the user certificate from `sally login`.

use std::io::Write;
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use russh::client::{Handle, Msg};
use russh::keys::ssh_key::{Certificate, PrivateKey, PublicKey};
use russh::{ChannelMsg, ChannelStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::profile::Profile;

/// The user's SSH credentials and the host CAs they trust.
pub struct Keys {
    pub key: Arc<PrivateKey>,
    pub cert: Certificate,
    pub host_cas: Vec<PublicKey>,
}

impl Keys {
    pub fn load(p: &Profile) -> Result<Self> {
        if p.expires().is_some_and(|e| e <= sallyport_core::unix_now()) {
            bail!(
                "your certificate expired at {}; run `sally login --proxy {} --user {}`",
                p.valid_until,
                p.proxy,
                p.user
            );
        }
        let paths = p.paths();
        let key_text = std::fs::read_to_string(&paths.key)
            .with_context(|| format!("cannot read {}", paths.key.display()))?;
        let key = PrivateKey::from_openssh(key_text.as_bytes())
            .map_err(|e| anyhow!("{}: {e}", paths.key.display()))?;
        let cert_text = std::fs::read_to_string(&paths.ssh_cert)
            .with_context(|| format!("cannot read {}", paths.ssh_cert.display()))?;
        let cert = Certificate::from_openssh(cert_text.trim())
            .map_err(|e| anyhow!("{}: {e}", paths.ssh_cert.display()))?;
        let kh =
            std::fs::read_to_string(crate::profile::home().join("known_hosts")).unwrap_or_default();
        let host_cas = kh
            .lines()
            .filter_map(|l| l.strip_prefix("@cert-authority "))
            .filter_map(|l| l.split_once(' ').map(|(_, key)| key))
            .filter_map(|k| PublicKey::from_openssh(k.trim()).ok())
            .collect::<Vec<_>>();
        if host_cas.is_empty() {
            bail!(
                "no host CA in {}; run `sally login` again",
                crate::profile::home().join("known_hosts").display()
            );
        }
        Ok(Keys {
            key: Arc::new(key),
            cert,
            host_cas,
        })
    }
}

/// Accepts a host only with a certificate from the host CA naming it.
pub struct HostCheck {
    host_cas: Vec<PublicKey>,
    name: String,
    failure: Arc<std::sync::Mutex<Option<String>>>,
    /// What the node may open toward us (`-R`, `-A`); nothing by default.
    incoming: crate::forward::Incoming,
}

impl russh::client::Handler for HostCheck {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        match key {
            russh::keys::PublicKeyOrCertificate::Certificate(c) => {
                let r = sallyport_core::sshcert::verify_host(
                    c,
                    &self.host_cas,
                    &self.name,
                    sallyport_core::sshcert::now(),
                );
                if let Err(e) = &r {
                    eprintln!("sally: host {} refused: {e}", self.name);
                }
                Ok(r.is_ok())
            }
            _ => {
                eprintln!(
                    "sally: host {} offered no certificate from this cluster's host CA",
                    self.name
                );
                Ok(false)
            }
        }
    }

    /// A server that ends the connection says why (the proxy's door: "too many
    /// unauthenticated connections from …"); kept to tell the person instead of "Disconnected".
    async fn disconnected(
        &mut self,
        reason: russh::client::DisconnectReason<Self::Error>,
    ) -> Result<(), Self::Error> {
        match reason {
            russh::client::DisconnectReason::ReceivedDisconnect(info) => {
                if let Ok(mut f) = self.failure.lock() {
                    *f = Some(info.message.chars().filter(|c| !c.is_control()).collect());
                }
                Ok(())
            }
            russh::client::DisconnectReason::Error(e) => Err(e),
        }
    }

    async fn channel_open_failure(
        &mut self,
        _channel: russh::ChannelId,
        _reason: russh::ChannelOpenFailure,
        description: &str,
        _language: &str,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        if let Ok(mut f) = self.failure.lock() {
            *f = Some(description.to_string());
        }
        Ok(())
    }

    async fn server_channel_open_forwarded_tcpip(
        &mut self,
        channel: russh::Channel<Msg>,
        connected_address: &str,
        connected_port: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        let target = self.incoming.remote.lock().ok().and_then(|r| {
            r.get(&(connected_address.to_string(), connected_port))
                .cloned()
        });
        let Some((host, port)) = target else {
            reply
                .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        tokio::spawn(async move {
            match tokio::net::TcpStream::connect((host.as_str(), port)).await {
                Ok(tcp) => {
                    let _ = tcp.set_nodelay(true);
                    reply.accept().await;
                    sallyport_core::flow::splice(tcp, channel.into_stream()).await;
                }
                Err(e) => {
                    eprintln!("sally: remote forward to {host}:{port} failed: {e}");
                    reply.reject(russh::ChannelOpenFailure::ConnectFailed).await;
                }
            }
        });
        Ok(())
    }

    async fn server_channel_open_agent_forward(
        &mut self,
        channel: russh::Channel<Msg>,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        let Some(path) = self.incoming.agent.clone() else {
            reply
                .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        tokio::spawn(async move {
            match tokio::net::UnixStream::connect(&path).await {
                Ok(unix) => {
                    reply.accept().await;
                    sallyport_core::flow::splice(unix, channel.into_stream()).await;
                }
                Err(_) => reply.reject(russh::ChannelOpenFailure::ConnectFailed).await,
            }
        });
        Ok(())
    }

    async fn server_channel_open_session(
        &mut self,
        _channel: russh::Channel<Msg>,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        reply
            .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
            .await;
        Ok(())
    }

    async fn server_channel_open_x11(
        &mut self,
        _channel: russh::Channel<Msg>,
        _originator_address: &str,
        _originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        reply
            .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
            .await;
        Ok(())
    }

    async fn server_channel_open_direct_tcpip(
        &mut self,
        _channel: russh::Channel<Msg>,
        _host_to_connect: &str,
        _port_to_connect: u32,
        _originator_address: &str,
        _originator_port: u32,
        reply: russh::client::ChannelOpenHandle,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        reply
            .reject(russh::ChannelOpenFailure::AdministrativelyProhibited)
            .await;
        Ok(())
    }
}

fn client_config() -> Arc<russh::client::Config> {
    Arc::new(sallyport_core::sshcert::client_config(
        sallyport_core::sshcert::preferred(),
    ))
}

pub struct Proxy {
    handle: Handle<HostCheck>,
    failure: Arc<std::sync::Mutex<Option<String>>>,
}

/// The outer connection to the proxy's SSH port.
pub async fn connect_proxy(p: &Profile, keys: &Keys, ssh_port: u16) -> Result<Proxy> {
    let web = p.addr();
    let host = web
        .rsplit_once(':')
        .map_or(web.as_str(), |(h, _)| h)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let addr = format!(
        "{}:{ssh_port}",
        web.rsplit_once(':').map_or(web.as_str(), |(h, _)| h)
    );
    let failure = Arc::new(std::sync::Mutex::new(None));
    let check = HostCheck {
        host_cas: keys.host_cas.clone(),
        name: host,
        failure: failure.clone(),
        incoming: Default::default(),
    };
    let tcp = tokio::net::TcpStream::connect(&addr)
        .await
        .with_context(|| format!("cannot reach the proxy's SSH port at {addr}"))?;
    let _ = tcp.set_nodelay(true);
    // The proxy's own words when it hung up on us (its door's caps), else russh's.
    let why = |e: russh::Error| {
        let said = failure.lock().ok().and_then(|mut f| f.take());
        anyhow!("proxy {addr}: {}", said.unwrap_or_else(|| e.to_string()))
    };
    let mut handle = russh::client::connect_stream(
        client_config(),
        sallyport_core::flow::Decoupled::new(tcp),
        check,
    )
    .await
    .map_err(why)?;
    let login = keys
        .cert
        .valid_principals()
        .first()
        .cloned()
        .unwrap_or_default();
    let ok = handle
        .authenticate_openssh_cert(login, keys.key.clone(), keys.cert.clone())
        .await
        .map_err(why)?;
    if !ok.success() {
        bail!("the proxy refused your certificate; run `sally login`");
    }
    Ok(Proxy { handle, failure })
}

impl Proxy {
    /// Ends the connection with a disconnect message rather than a reset.
    pub async fn disconnect(&self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }

    /// A byte stream to `target` (a node name, `name.cluster` or id) through the proxy.
    pub async fn open(&self, target: &str, port: u32) -> Result<ChannelStream<Msg>> {
        match self
            .handle
            .channel_open_direct_tcpip(target, port, "127.0.0.1", 0)
            .await
        {
            Ok(ch) => Ok(ch.into_stream()),
            Err(e) => Err(anyhow!(
                "{}",
                sallyport_core::flow::open_failure_reason(&self.failure, e).await
            )),
        }
    }
}

/// The inner SSH connection to a node, as `login`.
pub async fn connect_node(
    proxy: &Proxy,
    keys: &Keys,
    target: &str,
    login: &str,
    incoming: crate::forward::Incoming,
) -> Result<(Handle<HostCheck>, Arc<std::sync::Mutex<Option<String>>>)> {
    let stream = proxy.open(target, 22).await?;
    let failure = Arc::new(std::sync::Mutex::new(None));
    let check = HostCheck {
        host_cas: keys.host_cas.clone(),
        name: target.to_string(),
        failure: failure.clone(),
        incoming,
    };
    let mut handle = russh::client::connect_stream(
        client_config(),
        sallyport_core::flow::Decoupled::new(stream),
        check,
    )
    .await
    .map_err(|e| anyhow!("{target}: {e}"))?;
    let ok = handle
        .authenticate_openssh_cert(login, keys.key.clone(), keys.cert.clone())
        .await
        .map_err(|e| anyhow!("{target}: {e}"))?;
    if !ok.success() {
        bail!("{login}@{target}: the proxy refused your certificate");
    }
    Ok((handle, failure))
}

/// Puts the terminal in raw mode until dropped.
struct RawMode(Option<nix::sys::termios::Termios>);

impl RawMode {
    fn enter() -> Self {
        use nix::sys::termios::*;
        let stdin = std::io::stdin();
        match tcgetattr(&stdin) {
            Ok(orig) => {
                let mut raw = orig.clone();
                cfmakeraw(&mut raw);
                let _ = tcsetattr(&stdin, SetArg::TCSANOW, &raw);
                RawMode(Some(orig))
            }
            Err(_) => RawMode(None),
        }
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        if let Some(orig) = &self.0 {
            let _ = nix::sys::termios::tcsetattr(
                std::io::stdin(),
                nix::sys::termios::SetArg::TCSANOW,
                orig,
            );
        }
    }
}

/// Where output of a session goes: straight through, or line by line with a prefix.
pub enum Output {
    Direct,
    Prefixed(String),
}

/// Runs a shell or command on the node and returns its exit code (OpenSSH's: 255 for a
/// session that failed or ended by signal).
pub async fn run_session(
    handle: &Handle<HostCheck>,
    failure: &Arc<std::sync::Mutex<Option<String>>>,
    command: Option<String>,
    tty: bool,
    stdin_on: bool,
    output: Output,
    forward_agent: bool,
) -> Result<i32> {
    let channel = match handle.channel_open_session().await {
        Ok(c) => c,
        Err(e) => {
            return Err(anyhow!(
                "{}",
                sallyport_core::flow::open_failure_reason(failure, e).await
            ));
        }
    };
    if tty {
        let (cols, rows) = terminal_size::terminal_size()
            .map(|(w, h)| (u32::from(w.0), u32::from(h.0)))
            .unwrap_or((80, 24));
        let term = std::env::var("TERM").unwrap_or_else(|_| "xterm".into());
        channel
            .request_pty(true, &term, cols, rows, 0, 0, &[])
            .await?;
    }
    if let Ok(lang) = std::env::var("LANG") {
        let _ = channel.set_env(false, "LANG", lang).await;
    }
    if forward_agent {
        channel.agent_forward(false).await?;
    }
    match &command {
        Some(c) => channel.exec(true, c.as_bytes().to_vec()).await?,
        None => channel.request_shell(true).await?,
    }
    let (mut read, write) = channel.split();
    let write = Arc::new(write);
    let _raw = if tty && stdin_on {
        Some(RawMode::enter())
    } else {
        None
    };
    let (quit_tx, mut quit_rx) = tokio::sync::mpsc::channel::<()>(1);
    if stdin_on {
        let w = write.clone();
        tokio::spawn(async move {
            let mut stdin = tokio::io::stdin();
            let mut buf = vec![0u8; 32 * 1024];
            let mut at_line_start = true;
            let mut tilde = false;
            loop {
                let n = match stdin.read(&mut buf).await {
                    Ok(0) | Err(_) => {
                        let _ = w.eof().await;
                        break;
                    }
                    Ok(n) => n,
                };
                if !tty {
                    // No escapes off a terminal: the bytes go as they are.
                    if w.data_bytes(buf[..n].to_vec()).await.is_err() {
                        break;
                    }
                    continue;
                }
                let mut out = Vec::with_capacity(n);
                for &b in &buf[..n] {
                    // OpenSSH escapes, only on a terminal: ~. disconnects, ~? helps, ~~ sends ~.
                    if tilde {
                        tilde = false;
                        match b {
                            b'.' => {
                                let _ = quit_tx.send(()).await;
                                return;
                            }
                            b'?' => {
                                eprint!(
                                    "\r\nSupported escape sequences:\r\n ~.  - terminate connection\r\n ~?  - this message\r\n ~~  - send the escape character\r\n"
                                );
                                continue;
                            }
                            b'~' => {
                                out.push(b'~');
                                continue;
                            }
                            other => {
                                out.push(b'~');
                                out.push(other);
                                at_line_start = other == b'\r' || other == b'\n';
                                continue;
                            }
                        }
                    }
                    if at_line_start && b == b'~' {
                        tilde = true;
                        continue;
                    }
                    at_line_start = b == b'\r' || b == b'\n';
                    out.push(b);
                }
                if !out.is_empty() && w.data_bytes(out).await.is_err() {
                    break;
                }
            }
        });
        if tty {
            let w = write.clone();
            tokio::spawn(async move {
                let Ok(mut winch) =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::window_change())
                else {
                    return;
                };
                while winch.recv().await.is_some() {
                    if let Some((w0, h0)) = terminal_size::terminal_size() {
                        let _ = w
                            .window_change(u32::from(w0.0), u32::from(h0.0), 0, 0)
                            .await;
                    }
                }
            });
        }
    } else {
        let _ = write.eof().await;
    }
    let mut code = None;
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let mut pending = [Vec::new(), Vec::new()];
    loop {
        let msg = tokio::select! {
            m = read.wait() => m,
            Some(()) = quit_rx.recv() => {
                eprint!("\r\nConnection closed.\r\n");
                return Ok(255);
            }
        };
        let Some(msg) = msg else { break };
        match msg {
            ChannelMsg::Data { data } => emit(&output, &mut stdout, &mut pending[0], &data).await?,
            ChannelMsg::ExtendedData { data, .. } => {
                emit(&output, &mut stderr, &mut pending[1], &data).await?
            }
            ChannelMsg::ExitStatus { exit_status } => code = Some(exit_status as i32),
            ChannelMsg::ExitSignal { signal_name, .. } => {
                eprintln!("sally: remote command killed by signal {signal_name:?}");
                code = Some(255);
            }
            ChannelMsg::Failure => {
                let what = if command.is_some() {
                    "run the command"
                } else {
                    "start a shell"
                };
                eprintln!("sally: the node refused to {what}");
                code.get_or_insert(255);
            }
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    if let Output::Prefixed(p) = &output {
        for (buf, out) in [
            (&pending[0], &mut std::io::stdout() as &mut dyn Write),
            (&pending[1], &mut std::io::stderr()),
        ] {
            if !buf.is_empty() {
                let _ = writeln!(out, "[{p}] {}", String::from_utf8_lossy(buf));
            }
        }
    }
    stdout.flush().await?;
    Ok(code.unwrap_or(255))
}

async fn emit<W: tokio::io::AsyncWrite + Unpin>(
    output: &Output,
    w: &mut W,
    pending: &mut Vec<u8>,
    data: &[u8],
) -> Result<()> {
    match output {
        Output::Direct => {
            w.write_all(data).await?;
            w.flush().await?;
        }
        Output::Prefixed(p) => {
            pending.extend_from_slice(data);
            while let Some(i) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                let mut out = format!("[{p}] ").into_bytes();
                out.extend_from_slice(&line);
                w.write_all(&out).await?;
            }
            w.flush().await?;
        }
    }
    Ok(())
}

/// `sally proxy ssh`: pipes stdin/stdout to `target:port` through the proxy, for OpenSSH's
/// ProxyCommand.
pub async fn pipe(proxy: &Proxy, target: &str, port: u32) -> Result<()> {
    let stream = proxy.open(target, port).await?;
    let (mut r, mut w) = tokio::io::split(stream);
    let up = async {
        let mut stdin = tokio::io::stdin();
        let _ = tokio::io::copy(&mut stdin, &mut w).await;
        let _ = w.shutdown().await;
    };
    let down = async {
        let mut stdout = tokio::io::stdout();
        let _ = tokio::io::copy(&mut r, &mut stdout).await;
        let _ = stdout.flush().await;
    };
    tokio::select! {
        _ = async { tokio::join!(up, down) } => {},
    }
    Ok(())
}
