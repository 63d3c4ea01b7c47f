//! The outer connection on port 3023: admit it under the door's caps and per-address rate
//! (`sallyport_core::door`; refused with a reason before any key exchange), hold it to
//! `ssh_login_grace`, authenticate the user certificate, then serve only `direct-tcpip`
//! channels, each handed to [`super::inner`] as an inner SSH connection, at most
//! `max_jumps_per_connection` of them open at once per outer connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use russh::keys::ssh_key::Certificate;
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelOpenFailure};
use tokio::net::TcpListener;

use sallyport_core::door::{self, Door};

use super::SshState;

pub fn config(state: &SshState) -> russh::server::Config {
    super::server_settings(state, state.proxy_cert(), super::Door::Outer)
}

/// What the door on 3023 allows a connection that has not authenticated yet.
#[derive(Debug, Clone, Copy)]
pub struct Admission {
    pub limits: door::Limits,
    /// `ssh_login_grace`: how long a connection may take to authenticate.
    pub login_grace: Duration,
}

impl Default for Admission {
    fn default() -> Self {
        Admission {
            limits: door::Limits::default(),
            login_grace: door::DEFAULT_LOGIN_GRACE,
        }
    }
}

pub async fn serve(listener: TcpListener, state: Arc<SshState>, admission: Admission) {
    let mut config = Arc::new(config(&state));
    let mut cert_until = state.proxy_cert_until();
    let door = Door::new("ssh", admission.limits);
    loop {
        let Ok((tcp, addr)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        // A renewed host certificate is served from the next connection on.
        let until = state.proxy_cert_until();
        if until != cert_until {
            config = Arc::new(self::config(&state));
            cert_until = until;
        }
        let _ = tcp.set_nodelay(true);
        // Refused before any key exchange: a flood costs an accept and a few bytes.
        let counted = match door.admit(addr.ip()) {
            Ok(c) => c,
            Err(refusal) => {
                if let Some(permit) = door::telling_permit() {
                    let config = config.clone();
                    tokio::spawn(async move {
                        door::refuse_ssh(tcp, &config.server_id, &refusal.to_string()).await;
                        drop(permit);
                    });
                }
                continue;
            }
        };
        let (config, state) = (config.clone(), state.clone());
        tokio::spawn(async move {
            let (pending, login) = door::Pending::new(Some(counted));
            let conn = Outer {
                id: NEXT_CONN.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
                state,
                addr,
                user: None,
                refusal: None,
                pending,
                attempts: crate::failed_auth::SshAttempts::new(addr),
                jumps: Arc::new(AtomicUsize::new(0)),
            };
            // The peer is a client choosing its own windows: it may park a few of them here.
            let queue = sallyport_core::flow::CLIENT_WRITE_QUEUE;
            if let Err(e) =
                door::serve_ssh(config, tcp, conn, login, admission.login_grace, queue).await
            {
                tracing::debug!(peer = %addr, error = %e, "ssh connection ended");
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
    /// Counted against the door's caps, and held to the login grace, until authenticated.
    pending: door::Pending,
    /// Reported to auth's audit if the connection ends without authenticating.
    attempts: crate::failed_auth::SshAttempts,
    /// Inner connections open on this one (`max_jumps_per_connection`).
    jumps: Arc<AtomicUsize>,
}

/// One inner connection counted on its outer connection until it ends.
struct Jump(Arc<AtomicUsize>);

impl Drop for Jump {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Why a jump past `max_jumps_per_connection` is refused.
pub fn max_jumps_refusal(max: usize) -> String {
    format!(
        "this connection to the proxy already carries {max} connections to nodes, the most allowed (proxy_service.max_jumps_per_connection: {max}); open another connection to the proxy"
    )
}

impl Drop for Outer {
    fn drop(&mut self) {
        self.state.proxy.untrack(self.id);
        self.attempts.finish(&self.state.auth);
    }
}

impl russh::server::Handler for Outer {
    type Error = russh::Error;

    async fn auth_succeeded(&mut self, _session: &mut Session) -> Result<(), Self::Error> {
        self.pending.authenticated();
        self.attempts.authenticated();
        Ok(())
    }

    async fn auth_none(&mut self, _login: &str) -> Result<Auth, Self::Error> {
        self.attempts.attempted();
        Ok(Auth::reject())
    }

    /// Only certificates open this door; the key's signature verified, so it is audited.
    async fn auth_publickey(
        &mut self,
        login: &str,
        key: russh::server::VerifiedPublicKey<'_>,
    ) -> Result<Auth, Self::Error> {
        self.attempts.plain_key(login, key.public_key);
        Ok(Auth::reject())
    }

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
                self.attempts
                    .certificate_refused(login, cert, &e.to_string());
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
        if let Some(why) = self.state.proxy.lock_of(&user) {
            tracing::info!(%user, peer = %self.addr, "locked user refused at the proxy");
            let reason = format!("user {user} is locked: {why}");
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        // Each inner connection costs a key exchange and a task: one outer connection (a
        // ControlMaster, say) carries only so many at once, counted until each ends.
        let max = self.state.max_jumps_per_connection;
        if self.jumps.load(Ordering::Relaxed) >= max {
            tracing::info!(%user, peer = %self.addr, max, "proxy jump refused: too many on one connection");
            reply
                .reject(ChannelOpenFailure::Other {
                    code: 1,
                    reason: max_jumps_refusal(max),
                })
                .await;
            return Ok(());
        }
        self.jumps.fetch_add(1, Ordering::Relaxed);
        let jump = Jump(self.jumps.clone());
        self.state
            .proxy
            .track(self.id, &user, Arc::new(_session.handle()));
        // The node's identity comes from auth: asked on a task, the channel answered then.
        let state = self.state.clone();
        let (addr, host) = (self.addr, host.to_string());
        // The door runs `WindowPolicy::Consumed`: the channel's window is given back as the
        // inner server reads the stream (`Decoupled` reads only as far as its small queue lets
        // it), so what one jump holds here is bounded by the window, whatever the client sends.
        let credit = sallyport_core::flow::server_credit(_session.handle(), channel.id());
        tokio::spawn(async move {
            match state.node_identity(&host).await {
                Ok((cert, node)) => {
                    reply.accept().await;
                    let stream = sallyport_core::flow::Credited::new(channel.into_stream(), credit);
                    super::inner::serve(
                        state,
                        sallyport_core::flow::Decoupled::with_queue(
                            stream,
                            sallyport_core::flow::CLIENT_WRITE_QUEUE,
                        ),
                        user,
                        node,
                        cert,
                        addr,
                    )
                    .await;
                }
                Err(reason) => {
                    tracing::info!(%user, %host, error = %reason, "proxy jump refused");
                    reply
                        .reject(ChannelOpenFailure::Other { code: 2, reason })
                        .await;
                }
            }
            drop(jump);
        });
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
