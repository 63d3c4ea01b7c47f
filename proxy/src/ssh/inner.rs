//! The inner connection: the client's SSH session with the node, terminated here as the node
//! (host certificate for its names). The handler only translates: it checks the certificate
//! is the outer connection's user's, turns each session channel into a session of the engine
//! (`crate::session`: authorize → dial → relay → record → audit, started on a task of its own,
//! the channel accepted or refused when it answers), and each channel request, byte, resize
//! and signal into a [`Command`] queued for it. No callback waits on auth or on a node:
//! `tcpip-forward` and `cancel-tcpip-forward` are queued too (`forward`) and answered later
//! through the handle; russh sends global replies in the order the requests came, so a
//! keepalive's reply never overtakes a pending bind's (our patch, `vendor/russh/PATCHES.md`).
//!
//! Every channel request gets exactly one answer, in the order the requests came (RFC 4254
//! §5.4): a session's are the engine's ([`Event::Reply`], one per request command, in order;
//! the door sends on those the client asked for, by a per-channel queue of whether each asked),
//! an agent request's is russh's, from the callback, which russh sends in its turn (our patch,
//! `vendor/russh/PATCHES.md`). A request on a channel whose session has ended is refused
//! through the connection's handle, after whatever the engine still queued there; on a
//! forwarding channel, at once.
//!
//! One node connection per session channel, so closing one never touches another
//! (ControlMaster). Forwarding channels share one further node connection (`forward`).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use russh::keys::ssh_key::Certificate;
use russh::server::{Auth, Msg, Session};
use russh::{Channel, ChannelId, ChannelOpenFailure, Pty, Sig};
use sallyport_core::api::NodeInfo;
use sallyport_core::unix_now_ms as now_ms;
use tokio::io::{AsyncRead, AsyncWrite};

use super::SshState;
use super::forward::Forwarding;
use crate::session::authorize::AGENT_FORWARDING_REFUSED;
use crate::session::dial::{Asked, Toward};
use crate::session::{self, Command, Refusal, Target};
use crate::state::OpenConnection;

use super::channel::{Live, Owed, Sessions, Slot, SshDoor};

/// Serves the inner connection carried in a `direct-tcpip` channel of `user`'s outer one.
pub async fn serve<S>(
    state: Arc<SshState>,
    stream: S,
    user: String,
    node: NodeInfo,
    cert: Certificate,
    addr: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = super::server_settings(&state, cert, super::Door::Inner);
    let activity = Arc::new(AtomicU64::new(now_ms()));
    let remote_forwards = Arc::new(Mutex::new(HashSet::new()));
    let inner = Inner {
        forwarding: Forwarding::new(activity.clone(), remote_forwards.clone()),
        state,
        user,
        node,
        addr,
        login: None,
        refusal: None,
        sessions: Sessions::default(),
        opening: Arc::new(AtomicUsize::new(0)),
        cert_expires: u64::MAX,
        activity,
        remote_forwards,
        counted: None,
        session_cap: Arc::new(Mutex::new(SessionCap::default())),
    };
    match russh::server::run_stream(Arc::new(config), stream, inner).await {
        Ok(s) => {
            let _ = s.await;
        }
        Err(e) => tracing::debug!(error = %e, "inner handshake failed"),
    }
}

/// `max_sessions` as the last grant said it, and whether auth has refused a channel past it:
/// from then on, channels past it are refused here without asking again, so a client opening
/// channels in a loop costs auth nothing and adds nothing to the audit log.
#[derive(Default)]
struct SessionCap {
    cap: Option<u32>,
    refused_past_cap: bool,
}

pub(super) struct Inner {
    pub(super) state: Arc<SshState>,
    pub(super) user: String,
    pub(super) node: NodeInfo,
    pub(super) addr: SocketAddr,
    login: Option<String>,
    /// Why sessions on this connection will be refused, when the certificate checked out but
    /// does not cover the login: said at channel open, where OpenSSH shows it to the user.
    refusal: Option<String>,
    sessions: Sessions,
    /// Session channels being opened (authorized and dialed) right now.
    opening: Arc<AtomicUsize>,
    pub(super) forwarding: Forwarding,
    /// When the inner connection's certificate expires (Unix seconds).
    pub(super) cert_expires: u64,
    /// When data last moved on any channel of this connection (Unix milliseconds): idle
    /// timeouts count the whole connection, so one quiet channel is not cut while another works.
    pub(super) activity: Arc<AtomicU64>,
    /// Remote forwards the person asked for and the node granted, by (address, port).
    pub(super) remote_forwards: Arc<Mutex<HashSet<(String, u32)>>>,
    /// This connection counted among its user's open ones (`max_connections`), once
    /// authenticated.
    counted: Option<Arc<OpenConnection>>,
    session_cap: Arc<Mutex<SessionCap>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The person's connection is gone without closing its sessions: close them on the
        // node, which hangs up everything they started there, as sshd's hang-up would.
        // Under the map's lock, so a session still opening sees it and ends itself.
        let open = self.sessions.lock().map(|mut s| s.end_all());
        for s in open.into_iter().flatten() {
            s.commands.send(Command::Close);
        }
        self.forwarding.close();
    }
}

fn refuse(reason: impl Into<String>) -> ChannelOpenFailure {
    ChannelOpenFailure::Other {
        code: 1,
        reason: reason.into(),
    }
}

impl Inner {
    /// The engine's view of a session asked for on this connection.
    pub(super) fn target(&self, open_sessions: Option<u32>) -> Result<Target, Refusal> {
        let login = self
            .login
            .clone()
            .ok_or_else(|| Refusal::Failed("not authenticated".into()))?;
        Ok(Target {
            user: self.user.clone(),
            login,
            node: self.node.clone(),
            addr: self.addr,
            cert_expires: self.cert_expires,
            open_sessions,
            connection: self.counted.clone(),
            credential_refusal: self.refusal.clone(),
            kube: None,
            door: sallyport_core::metrics::SessionDoor::Ssh,
        })
    }

    /// Queues `command` for channel `ch`'s session; a session that cannot take it (gone, or
    /// flooded with input its node does not read) is closed.
    fn command(&mut self, ch: ChannelId, command: Command, session: &mut Session) -> bool {
        let Ok(mut s) = self.sessions.lock() else {
            return false;
        };
        match s.live(ch).map(|l| l.commands.send(command)) {
            Some(true) => true,
            Some(false) => {
                tracing::warn!(user = %self.user, node = %self.node.hostname, "closing a channel the node stopped reading");
                if let Some(l) = s.end(ch) {
                    l.commands.send(Command::Close);
                }
                drop(s);
                let _ = session.close(ch);
                false
            }
            None => false,
        }
    }

    /// A request for channel `ch`, answered by the node or the engine through its session, in
    /// order; on a channel without one (a forwarding channel, a session that has ended), refused.
    fn request(
        &mut self,
        ch: ChannelId,
        command: Command,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let wanted = session.wants_reply(ch);
        let (owed, ended) = match self.sessions.lock() {
            Ok(s) => match s.get(ch) {
                Some(Slot::Live(l)) => (Some(l.owed.clone()), false),
                Some(Slot::Ended) => (None, true),
                None => (None, false),
            },
            Err(_) => (None, false),
        };
        let Some(owed) = owed else {
            if !wanted {
                return Ok(());
            }
            if ended {
                // Through the handle, as the engine answered: after any answer it queued before
                // its session ended (every answer here is a failure, so their own order is moot).
                let user = session.handle();
                tokio::spawn(async move { user.channel_failure(ch).await });
                return Ok(());
            }
            // A forwarding channel: nothing else ever answers there.
            return session.channel_failure(ch);
        };
        // Before the command is queued, so the engine's answer always finds its place.
        if let Ok(mut o) = owed.lock() {
            o.push_back(wanted);
        }
        self.command(ch, command, session);
        Ok(())
    }
}

impl russh::server::Handler for Inner {
    type Error = russh::Error;

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        cert: &Certificate,
    ) -> Result<Auth, Self::Error> {
        self.login = None;
        self.refusal = None;
        let cas = self.state.user_cas();
        let now = sallyport_core::sshcert::now();
        match sallyport_core::sshcert::verify_user(cert, &cas, login, now) {
            // The inner connection must be the same person as the outer one.
            Ok(user) if user == self.user => {
                self.login = Some(login.to_string());
                self.cert_expires = cert.valid_before();
                if self.counted.is_none() {
                    self.counted = Some(Arc::new(self.state.proxy.open_connection(&self.user)));
                }
                Ok(Auth::Accept)
            }
            // Genuine, current, this user's — but without this login: let the session be
            // refused at channel open, where the reason reaches the person.
            Err(e @ sallyport_core::sshcert::CertRefusal::Principal { .. })
                if sallyport_core::sshcert::verify_user_any_login(cert, &cas, now).as_deref()
                    == Ok(self.user.as_str()) =>
            {
                self.login = Some(login.to_string());
                self.refusal = Some(format!(
                    "{e}; run `sally login` to get a certificate with your current logins"
                ));
                if self.counted.is_none() {
                    self.counted = Some(Arc::new(self.state.proxy.open_connection(&self.user)));
                }
                Ok(Auth::Accept)
            }
            Ok(other) => {
                tracing::warn!(outer = %self.user, inner = %other, "inner certificate belongs to another user");
                Ok(Auth::reject())
            }
            Err(e) => {
                tracing::info!(user = %self.user, login, node = %self.node.hostname, error = %e, "certificate refused");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let id = channel.id();
        // Input arrives through `data`; output goes through the write half (see `SshDoor`).
        let (_, output) = channel.split();
        let established = self.sessions.lock().map(|s| s.live_count()).unwrap_or(0);
        let open =
            u32::try_from(established + self.opening.load(Ordering::Acquire)).unwrap_or(u32::MAX);
        let past_cap = match self.session_cap.lock() {
            Ok(c) => {
                let past = c.cap.is_some_and(|cap| open >= cap);
                if past && c.refused_past_cap {
                    let reason =
                        sallyport_core::api::max_sessions_refusal(open, c.cap.unwrap_or(0));
                    drop(c);
                    tokio::spawn(async move { reply.reject(refuse(reason)).await });
                    return Ok(());
                }
                past
            }
            Err(_) => false,
        };
        let target = match self.target(Some(open)) {
            Ok(t) => t,
            Err(why) => {
                tokio::spawn(async move { reply.reject(refuse(why.to_string())).await });
                return Ok(());
            }
        };
        let asked = Arc::new(Asked::default());
        let toward = Toward {
            user: session.handle(),
            asked,
            remote_forwards: self.remote_forwards.clone(),
            audit: Default::default(),
            recheck: Default::default(),
            forward_bytes: Default::default(),
            activity: self.activity.clone(),
        };
        let proxy = self.state.proxy.clone();
        let (sessions, opening, cap) = (
            self.sessions.clone(),
            self.opening.clone(),
            self.session_cap.clone(),
        );
        let (user, activity) = (session.handle(), self.activity.clone());
        let forwards_answered = super::forward::answered_so_far(&self.forwarding);
        opening.fetch_add(1, Ordering::AcqRel);
        tokio::spawn(async move {
            let opened = session::relay::open(proxy.clone(), &target, Some(toward)).await;
            forwards_answered.await;
            match opened {
                Ok(opened) => {
                    if let Ok(mut c) = cap.lock() {
                        c.cap = opened.grant.max_sessions;
                    }
                    let forward_agent = opened.grant.forward_agent;
                    let (confirm, confirmed) = tokio::sync::watch::channel(false);
                    let owed = Owed::default();
                    let door = Arc::new(SshDoor {
                        user,
                        confirmed,
                        output,
                        ch: id,
                        sessions: sessions.clone(),
                        owed: owed.clone(),
                    });
                    let commands = session::start(proxy, &target, opened, door, activity);
                    let live = Live {
                        commands: commands.clone(),
                        forward_agent,
                        owed,
                    };
                    let kept = sessions.lock().is_ok_and(|mut s| s.insert(id, live));
                    opening.fetch_sub(1, Ordering::AcqRel);
                    if !kept {
                        // The connection ended while the session opened: it ends at once, and
                        // is reported as ended.
                        commands.send(Command::Close);
                        return;
                    }
                    reply.accept().await;
                    let _ = confirm.send(true);
                }
                Err(why) => {
                    opening.fetch_sub(1, Ordering::AcqRel);
                    tracing::info!(user = %target.user, node = %target.node.hostname, reason = %why, "session refused");
                    if past_cap && let Ok(mut c) = cap.lock() {
                        c.refused_past_cap = true;
                    }
                    reply.reject(refuse(why.to_string())).await;
                }
            }
        });
        Ok(())
    }

    async fn pty_request(
        &mut self,
        ch: ChannelId,
        term: &str,
        cols: u32,
        rows: u32,
        pix_width: u32,
        pix_height: u32,
        modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = Command::Pty {
            term: term.to_string(),
            cols,
            rows,
            pix_width,
            pix_height,
            modes: modes.to_vec(),
        };
        self.request(ch, command, session)
    }

    async fn env_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = Command::Env {
            name: name.to_string(),
            value: value.to_string(),
        };
        self.request(ch, command, session)
    }

    async fn shell_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.request(ch, Command::Shell, session)
    }

    async fn exec_request(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.request(ch, Command::Exec(data.to_vec()), session)
    }

    async fn subsystem_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.request(ch, Command::Subsystem(name.to_string()), session)
    }

    async fn agent_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        // russh answers from this callback's return value, so the grant decides here.
        let allowed = self
            .sessions
            .lock()
            .ok()
            .and_then(|s| s.live(ch).map(|l| l.forward_agent));
        match allowed {
            None => Ok(false),
            Some(false) => {
                let msg = format!("sallyport: {AGENT_FORWARDING_REFUSED}\r\n");
                session.extended_data(ch, 1, Bytes::from(msg))?;
                Ok(false)
            }
            Some(true) => Ok(self.command(ch, Command::Agent, session)),
        }
    }

    async fn x11_request(
        &mut self,
        ch: ChannelId,
        single_connection: bool,
        protocol: &str,
        cookie: &str,
        screen: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let command = Command::X11 {
            single_connection,
            protocol: protocol.to_string(),
            cookie: cookie.to_string(),
            screen,
        };
        self.request(ch, command, session)
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        originator: &str,
        originator_port: u32,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        super::forward::direct_tcpip(
            self,
            session.handle(),
            channel,
            (host, port),
            (originator, originator_port),
            reply,
        );
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        // Queued; answered later through the handle (russh's deferred global reply).
        Ok(super::forward::tcpip_forward(self, session, address, *port))
    }

    async fn cancel_tcpip_forward(
        &mut self,
        address: &str,
        port: u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        Ok(super::forward::cancel_tcpip_forward(
            self, session, address, port,
        ))
    }

    async fn data(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // One copy out of russh's buffer, shared by the recorder and the relay. Its window is
        // given back once the node took it (`Door::consumed`); a forward's channel gives its own
        // back as its stream is read (`flow::Credited`), and a closed session's never needs it.
        self.command(ch, Command::Data(Bytes::copy_from_slice(data)), session);
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.command(ch, Command::Eof, session);
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        ch: ChannelId,
        cols: u32,
        rows: u32,
        _pw: u32,
        _ph: u32,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.request(ch, Command::Resize { cols, rows }, session)
    }

    async fn signal(
        &mut self,
        ch: ChannelId,
        sig: Sig,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.request(ch, Command::Signal(sig), session)
    }

    async fn channel_close(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        let gone = self.sessions.lock().ok().and_then(|mut s| s.remove(ch));
        if let Some(l) = gone {
            l.commands.send(Command::Close);
        }
        Ok(())
    }
}
