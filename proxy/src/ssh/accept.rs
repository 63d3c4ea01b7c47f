//! The outer connection on port 3023: authenticate the user certificate, then serve only
//! `direct-tcpip` channels, each handed to [`super::relay`] as an inner SSH connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use russh::keys::ssh_key::Certificate;
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelOpenFailure};
use tokio::net::TcpListener;

use super::SshState;

pub fn config(state: &SshState) -> russh::server::Config {
    russh::server::Config {
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        // Every refusal takes the same time, whatever the reason.
        auth_rejection_time: Duration::from_millis(300),
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![(*state.key).clone()],
        certificates: vec![state.proxy_cert.clone()],
        inactivity_timeout: Some(Duration::from_secs(3600)),
        max_auth_attempts: 6,
        nodelay: true,
        window_size: sallyport_core::flow::CLIENT_WINDOW,
        // Slack between nested session loops: see `sallyport_core::flow`.
        channel_buffer_size: sallyport_core::flow::CHANNEL_BUFFER,
        preferred: sallyport_core::sshcert::preferred(),
        ..Default::default()
    }
}

pub async fn serve(listener: TcpListener, state: Arc<SshState>) {
    let config = Arc::new(config(&state));
    loop {
        let Ok((tcp, addr)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (config, state) = (config.clone(), state.clone());
        tokio::spawn(async move {
            let conn = Outer {
                id: NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                state,
                addr,
                user: None,
                refusal: None,
            };
            match russh::server::run_stream(config, sallyport_core::flow::Decoupled::new(tcp), conn)
                .await
            {
                Ok(s) => {
                    let _ = s.await;
                }
                Err(e) => tracing::debug!(peer = %addr, error = %e, "ssh handshake failed"),
            }
        });
    }
}

static NEXT_CONN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

struct Outer {
    id: u64,
    state: Arc<SshState>,
    addr: SocketAddr,
    user: Option<String>,
    /// When set, every channel is refused with this reason (russh itself already refuses
    /// expired certificates before the handler sees them).
    refusal: Option<String>,
}

impl Drop for Outer {
    fn drop(&mut self) {
        self.state.untrack(self.id);
    }
}

impl russh::server::Handler for Outer {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        cert: &Certificate,
    ) -> Result<Auth, Self::Error> {
        // A new user name starts authentication over: nothing from an earlier attempt counts.
        self.user = None;
        self.refusal = None;
        let cas = self.state.user_cas();
        let now = sallyport_core::sshcert::now();
        match sallyport_core::sshcert::verify_user_any_login(cert, &cas, now) {
            Ok(user) => {
                tracing::debug!(%user, login, peer = %self.addr, "proxy connection authenticated");
                self.user = Some(user);
                Ok(Auth::Accept)
            }
            Err(e) => {
                tracing::info!(login, peer = %self.addr, error = %e, "certificate refused at the proxy");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        _channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(reason) = self.refusal.clone() {
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        let reason = "the proxy runs nothing itself: connect to a node (ssh -J proxy node, or sally ssh node)".to_string();
        reply
            .reject(ChannelOpenFailure::Other { code: 1, reason })
            .await;
        Ok(())
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        _port: u32,
        _originator: &str,
        _originator_port: u32,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(reason) = self.refusal.clone() {
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        let Some(user) = self.user.clone() else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        // Checked here, not at authentication: a locked user gets in only to be told why, and
        // a lock that arrives later refuses the next jump too.
        if let Some(why) = self.state.lock_of(&user) {
            tracing::info!(%user, peer = %self.addr, "locked user refused at the proxy");
            let reason = format!("user {user} is locked: {why}");
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        match self.state.node_identity(host).await {
            Ok((cert, node)) => {
                self.state.track(self.id, &user, _session.handle());
                reply.accept().await;
                let state = self.state.clone();
                let addr = self.addr;
                tokio::spawn(super::relay::serve_inner(
                    state,
                    sallyport_core::flow::Decoupled::new(channel.into_stream()),
                    user,
                    node,
                    cert,
                    addr,
                ));
            }
            Err(reason) => {
                tracing::info!(%user, host, error = %reason, "proxy jump refused");
                reply
                    .reject(ChannelOpenFailure::Other { code: 2, reason })
                    .await;
            }
        }
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        _address: &str,
        _port: &mut u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        Ok(false)
    }
}
