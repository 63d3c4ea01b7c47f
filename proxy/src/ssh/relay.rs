//! The inner connection: the client's SSH session with the node, terminated here as the node
//! (host certificate for its names) so that every channel request can be authorized, relayed
//! one for one to the node, recorded and audited. One node connection per session channel, so
//! closing one channel never touches another (ControlMaster).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use russh::client::Msg as ClientMsg;
use russh::keys::ssh_key::{self, Certificate};
use russh::server::{Auth, Handle, Msg, Session};
use russh::{
    Channel, ChannelId, ChannelMsg, ChannelOpenFailure, ChannelReadHalf, ChannelWriteHalf, Pty, Sig,
};
use sallyport_core::api::{NodeInfo, SessionEnd, SessionGrant, SessionRequest};
use sallyport_core::flow::{self, Input};
use tokio::io::{AsyncRead, AsyncWrite};

use super::SshState;
use super::record::{Header, Recorder};

pub async fn serve_inner<S>(
    state: Arc<SshState>,
    stream: S,
    user: String,
    node: NodeInfo,
    cert: Certificate,
    addr: SocketAddr,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let config = russh::server::Config {
        methods: russh::MethodSet::from(&[russh::MethodKind::PublicKey][..]),
        auth_rejection_time: Duration::from_millis(300),
        auth_rejection_time_initial: Some(Duration::ZERO),
        keys: vec![(*state.key).clone()],
        certificates: vec![cert],
        inactivity_timeout: None,
        window_size: 8 * 1024 * 1024,
        // Slack between nested session loops: see `sallyport_core::flow`.
        channel_buffer_size: sallyport_core::flow::CHANNEL_BUFFER,
        preferred: sallyport_core::sshcert::preferred(),
        ..Default::default()
    };
    let inner = Inner {
        state,
        user,
        node,
        addr,
        login: None,
        refusal: None,
        chans: HashMap::new(),
    };
    match russh::server::run_stream(Arc::new(config), stream, inner).await {
        Ok(s) => {
            let _ = s.await;
        }
        Err(e) => tracing::debug!(error = %e, "inner handshake failed"),
    }
}

type Shared<T> = Arc<Mutex<T>>;

struct Relay {
    node: Arc<ChannelWriteHalf<ClientMsg>>,
    input: flow::Sender,
    grant: SessionGrant,
    rec: Shared<Option<Recorder>>,
    pty: Option<(String, u32, u32)>,
    command: Shared<Option<String>>,
    bytes_in: Arc<AtomicU64>,
    recording_started: bool,
}

struct Inner {
    state: Arc<SshState>,
    user: String,
    node: NodeInfo,
    addr: SocketAddr,
    login: Option<String>,
    /// Why sessions on this connection will be refused, when the certificate checked out but
    /// does not cover the login: said at channel open, where OpenSSH shows it to the user.
    refusal: Option<String>,
    chans: HashMap<ChannelId, Relay>,
}

/// The proxy's SSH client toward a node: checks the node's host certificate (agents) or its
/// pinned host key (agentless OpenSSH servers), and keeps the reason of a refused channel.
struct NodeClient {
    state: Arc<SshState>,
    node: NodeInfo,
    open_failure: Shared<Option<String>>,
    /// Why the node's host key was not trusted, for the person's error message.
    host_key_problem: Shared<Option<String>>,
}

impl russh::client::Handler for NodeClient {
    type Error = russh::Error;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, Self::Error> {
        match key {
            russh::keys::PublicKeyOrCertificate::Certificate(cert) => {
                let ok = sallyport_core::sshcert::verify_host(
                    cert,
                    &self.state.host_cas,
                    &self.node.id,
                    sallyport_core::sshcert::now(),
                );
                if let Err(e) = &ok {
                    tracing::warn!(node = %self.node.hostname, error = %e, "node host certificate refused");
                    if let Ok(mut p) = self.host_key_problem.lock() {
                        *p = Some(format!(
                            "node {}: host certificate refused: {e}",
                            self.node.hostname
                        ));
                    }
                }
                Ok(ok.is_ok())
            }
            russh::keys::PublicKeyOrCertificate::PublicKey { key, .. }
                if self.node.kind == "agentless" =>
            {
                let text = key.to_openssh().map_err(russh::Error::from)?;
                let path = format!("/v1/nodes/{}/host-key", self.node.id);
                let pinned: Result<serde_json::Value, _> = self
                    .state
                    .auth
                    .json(
                        reqwest::Method::POST,
                        &path,
                        Some(&serde_json::json!({"host_key": text})),
                    )
                    .await;
                let ok = pinned
                    .ok()
                    .and_then(|v| v["host_key"].as_str().map(|k| k == text))
                    .unwrap_or(false);
                if !ok {
                    tracing::warn!(node = %self.node.hostname, "agentless node presented a host key other than the pinned one");
                    if let Ok(mut p) = self.host_key_problem.lock() {
                        *p = Some(format!(
                            "node {} presented a host key other than the one pinned at its first connection; if the server was reinstalled, remove the node and add it again",
                            self.node.hostname
                        ));
                    }
                }
                Ok(ok)
            }
            _ => Ok(false),
        }
    }

    async fn channel_open_failure(
        &mut self,
        _channel: ChannelId,
        _reason: ChannelOpenFailure,
        description: &str,
        _language: &str,
        _session: &mut russh::client::Session,
    ) -> Result<(), Self::Error> {
        if let Ok(mut f) = self.open_failure.lock() {
            *f = Some(description.to_string());
        }
        Ok(())
    }
}

fn refuse(reason: impl Into<String>) -> ChannelOpenFailure {
    ChannelOpenFailure::Other {
        code: 1,
        reason: reason.into(),
    }
}

impl Inner {
    /// Authorize with auth, then open a session on the node with the per-session certificate.
    async fn open_node_session(&self) -> Result<(SessionGrant, Channel<ClientMsg>), String> {
        let login = self.login.clone().ok_or("not authenticated")?;
        if let Some(refusal) = &self.refusal {
            // Ask auth anyway: it audits the refusal with the roles' explanation.
            let req = SessionRequest {
                user: self.user.clone(),
                login: login.clone(),
                node: self.node.id.clone(),
                public_key: self
                    .state
                    .key
                    .public_key()
                    .to_openssh()
                    .map_err(|e| e.to_string())?,
                remote_addr: self.addr.to_string(),
            };
            return match self
                .state
                .auth
                .json::<_, SessionGrant>(reqwest::Method::POST, "/v1/sessions", Some(&req))
                .await
            {
                Err(e) => Err(e.to_string()),
                Ok(g) => {
                    let end = SessionEnd {
                        status: "complete".into(),
                        exit_code: Some(255),
                        ..Default::default()
                    };
                    Inner::end_session(self.state.clone(), &g, end).await;
                    Err(format!(
                        "{refusal}; run `sally login` to get a certificate with your current logins"
                    ))
                }
            };
        }
        let public_key = self
            .state
            .key
            .public_key()
            .to_openssh()
            .map_err(|e| e.to_string())?;
        let req = SessionRequest {
            user: self.user.clone(),
            login: login.clone(),
            node: self.node.id.clone(),
            public_key,
            remote_addr: self.addr.to_string(),
        };
        let grant: SessionGrant = self
            .state
            .auth
            .json(reqwest::Method::POST, "/v1/sessions", Some(&req))
            .await
            .map_err(|e| e.to_string())?;
        let cert = Certificate::from_openssh(grant.ssh_cert.trim()).map_err(|e| e.to_string())?;
        let open_failure = Arc::new(Mutex::new(None));
        let host_key_problem: Shared<Option<String>> = Arc::new(Mutex::new(None));
        let client = NodeClient {
            state: self.state.clone(),
            node: grant.node.clone(),
            open_failure: open_failure.clone(),
            host_key_problem: host_key_problem.clone(),
        };
        let explain = |e: russh::Error| -> String {
            host_key_problem
                .lock()
                .ok()
                .and_then(|p| p.clone())
                .unwrap_or_else(|| format!("node {}: {e}", grant.node.hostname))
        };
        let mut config = russh::client::Config {
            inactivity_timeout: None,
            window_size: 8 * 1024 * 1024,
            // Slack between nested session loops: see `sallyport_core::flow`.
            channel_buffer_size: sallyport_core::flow::CHANNEL_BUFFER,
            preferred: sallyport_core::sshcert::preferred(),
            nodelay: true,
            ..Default::default()
        };
        config.preferred.host_key_certificates =
            std::borrow::Cow::Borrowed(&[ssh_key::Algorithm::Ed25519]);
        let config = Arc::new(config);
        let offline = || {
            format!(
                "node {} is offline: its agent is not connected to this proxy",
                grant.node.hostname
            )
        };
        let mut handle = if grant.node.kind == "agent" {
            let stream = self
                .state
                .tunnels
                .open(&grant.node.id)
                .await
                .ok_or_else(offline)?;
            russh::client::connect_stream(
                config,
                sallyport_core::flow::Decoupled::new(stream),
                client,
            )
            .await
            .map_err(explain)?
        } else {
            let addr = grant.node.addr.clone().ok_or("the node has no address")?;
            let tcp = tokio::time::timeout(
                Duration::from_secs(10),
                tokio::net::TcpStream::connect(&addr),
            )
            .await
            .map_err(|_| format!("node {} at {addr} did not answer", grant.node.hostname))?
            .map_err(|e| format!("node {} at {addr}: {e}", grant.node.hostname))?;
            let _ = tcp.set_nodelay(true);
            russh::client::connect_stream(config, sallyport_core::flow::Decoupled::new(tcp), client)
                .await
                .map_err(explain)?
        };
        let auth = handle
            .authenticate_openssh_cert(login.clone(), self.state.key.clone(), cert)
            .await
            .map_err(|e| format!("node {}: {e}", grant.node.hostname))?;
        if !auth.success() {
            return Err(format!(
                "node {} refused the session certificate for login {login}; does it trust `sallyctl auth export --type=user`?",
                grant.node.hostname
            ));
        }
        let channel = match handle.channel_open_session().await {
            Ok(c) => c,
            Err(e) => {
                let why = open_failure
                    .lock()
                    .ok()
                    .and_then(|f| f.clone())
                    .unwrap_or_else(|| e.to_string());
                return Err(why);
            }
        };
        // The node connection lives as long as its channel: dropping the handle does not close it.
        tokio::spawn(async move {
            let _keep = handle;
            std::future::pending::<()>().await;
        });
        Ok((grant, channel))
    }

    async fn end_session(state: Arc<SshState>, grant: &SessionGrant, end: SessionEnd) {
        let path = format!("/v1/sessions/{}/end", grant.session_id);
        if let Err(e) = state
            .auth
            .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(&end))
            .await
        {
            tracing::error!(session = %grant.session_id, error = %e, "session end not recorded");
        }
    }

    fn start_recording(&mut self, ch: ChannelId, command: Option<&str>) -> Result<(), String> {
        let Some(r) = self.chans.get_mut(&ch) else {
            return Ok(());
        };
        if r.recording_started {
            return Ok(());
        }
        r.recording_started = true;
        if let (Some(c), Ok(mut slot)) = (command, r.command.lock()) {
            *slot = Some(c.to_string());
        }
        {
            let state = self.state.clone();
            let path = format!("/v1/sessions/{}/update", r.grant.session_id);
            let body = SessionEnd {
                kind: Some(if command.is_some() { "exec" } else { "shell" }.into()),
                command: command.map(str::to_string),
                ..Default::default()
            };
            tokio::spawn(async move {
                let _ = state
                    .auth
                    .json::<_, serde_json::Value>(reqwest::Method::POST, &path, Some(&body))
                    .await;
            });
        }
        let (term, cols, rows) = r.pty.clone().unwrap_or_else(|| ("dumb".into(), 80, 24));
        let title = format!(
            "{}@{} ({})",
            self.login.as_deref().unwrap_or("?"),
            self.node.hostname,
            self.user
        );
        let header = Header {
            width: cols,
            height: rows,
            term: &term,
            title: &title,
            command,
        };
        match Recorder::create(&self.state.recordings, &r.grant.session_id, &header) {
            Ok(rec) => {
                if let Ok(mut slot) = r.rec.lock() {
                    *slot = Some(rec);
                }
                Ok(())
            }
            Err(e) if r.grant.record == "strict" => Err(format!(
                "this session must be recorded (record_session: strict) and the recording failed: {e}"
            )),
            Err(e) => {
                tracing::error!(session = %r.grant.session_id, error = %e, "recording failed; session continues unrecorded (best_effort)");
                Ok(())
            }
        }
    }
}

/// Node → user: output, exit status, replies; records output; ends the session in auth.
async fn node_to_user(
    state: Arc<SshState>,
    mut read: ChannelReadHalf,
    user: Handle,
    ch: ChannelId,
    grant: SessionGrant,
    rec: Shared<Option<Recorder>>,
    command: Shared<Option<String>>,
    bytes_in: Arc<AtomicU64>,
) {
    let mut exit_code: Option<i64> = None;
    let mut bytes_out = 0u64;
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let record = |data: &[u8]| {
        if let Ok(mut r) = rec.lock()
            && let Some(r) = r.as_mut()
        {
            r.output(data);
        }
    };
    loop {
        let msg = tokio::select! {
            m = read.wait() => m,
            _ = tick.tick() => {
                if let Ok(mut r) = rec.lock()
                    && let Some(r) = r.as_mut() { r.tick(); }
                continue;
            }
        };
        let Some(msg) = msg else { break };
        match msg {
            ChannelMsg::Data { data } => {
                bytes_out += data.len() as u64;
                record(&data);
                if user.data(ch, data).await.is_err() {
                    break;
                }
            }
            ChannelMsg::ExtendedData { data, ext } => {
                bytes_out += data.len() as u64;
                record(&data);
                if user.extended_data(ch, ext, data).await.is_err() {
                    break;
                }
            }
            ChannelMsg::ExitStatus { exit_status } => {
                exit_code = Some(i64::from(exit_status));
                let _ = user.exit_status_request(ch, exit_status).await;
            }
            ChannelMsg::ExitSignal {
                signal_name,
                core_dumped,
                error_message,
                lang_tag,
            } => {
                exit_code = Some(-1);
                let _ = user
                    .exit_signal_request(ch, signal_name, core_dumped, error_message, lang_tag)
                    .await;
            }
            ChannelMsg::Success => {
                let _ = user.channel_success(ch).await;
            }
            ChannelMsg::Failure => {
                let _ = user.channel_failure(ch).await;
            }
            ChannelMsg::Eof => {
                let _ = user.eof(ch).await;
            }
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    let _ = user.close(ch).await;
    let finished = rec.lock().ok().and_then(|mut r| r.take());
    if let Some(r) = finished {
        r.finish();
    }
    let command = command.lock().ok().and_then(|c| c.clone());
    let end = SessionEnd {
        exit_code,
        bytes_in: bytes_in.load(Ordering::Relaxed),
        bytes_out,
        status: "complete".into(),
        kind: Some(if command.is_some() { "exec" } else { "shell" }.into()),
        command,
    };
    Inner::end_session(state, &grant, end).await;
}

/// User → node: data, EOF and resizes in order, without ever stalling the user's session loop.
async fn user_to_node(mut rx: flow::Receiver, node: Arc<ChannelWriteHalf<ClientMsg>>) {
    while let Some(item) = rx.recv().await {
        let ok = match item {
            Input::Data(d) => node.data_bytes(d).await.is_ok(),
            Input::Eof => node.eof().await.is_ok(),
            Input::Resize { cols, rows } => node.window_change(cols, rows, 0, 0).await.is_ok(),
        };
        if !ok {
            break;
        }
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
                Ok(Auth::Accept)
            }
            // Genuine, current, this user's — but without this login: let the session be
            // refused at channel open, where the reason reaches the person.
            Err(e @ sallyport_core::sshcert::CertRefusal::Principal { .. })
                if sallyport_core::sshcert::verify_user_any_login(cert, &cas, now).as_deref()
                    == Ok(self.user.as_str()) =>
            {
                self.login = Some(login.to_string());
                self.refusal = Some(e.to_string());
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
        drop(channel);
        match self.open_node_session().await {
            Ok((grant, node_channel)) => {
                let (read, write) = node_channel.split();
                let write = Arc::new(write);
                let (tx, rx) = flow::inbox();
                let rec = Arc::new(Mutex::new(None));
                let command = Arc::new(Mutex::new(None));
                let bytes_in = Arc::new(AtomicU64::new(0));
                tokio::spawn(user_to_node(rx, write.clone()));
                tokio::spawn(node_to_user(
                    self.state.clone(),
                    read,
                    session.handle(),
                    id,
                    grant.clone(),
                    rec.clone(),
                    command.clone(),
                    bytes_in.clone(),
                ));
                self.chans.insert(
                    id,
                    Relay {
                        node: write,
                        input: tx,
                        grant,
                        rec,
                        pty: None,
                        command,
                        bytes_in,
                        recording_started: false,
                    },
                );
                reply.accept().await;
            }
            Err(reason) => {
                tracing::info!(user = %self.user, node = %self.node.hostname, %reason, "session refused");
                reply.reject(refuse(reason)).await;
            }
        }
        Ok(())
    }

    async fn pty_request(
        &mut self,
        ch: ChannelId,
        term: &str,
        cols: u32,
        rows: u32,
        pw: u32,
        ph: u32,
        modes: &[(Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let Some(r) = self.chans.get_mut(&ch) else {
            return session.channel_failure(ch);
        };
        r.pty = Some((term.to_string(), cols, rows));
        if r.node
            .request_pty(true, term, cols, rows, pw, ph, modes)
            .await
            .is_err()
        {
            session.channel_failure(ch)?;
        }
        Ok(())
    }

    async fn env_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        value: &str,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            let _ = r.node.set_env(false, name, value).await;
        }
        Ok(())
    }

    async fn shell_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Err(e) = self.start_recording(ch, None) {
            session.extended_data(ch, 1, Bytes::from(format!("sallyport: {e}\r\n")))?;
            session.channel_failure(ch)?;
            return session.close(ch);
        }
        match self.chans.get(&ch) {
            Some(r) if r.node.request_shell(true).await.is_ok() => Ok(()),
            _ => session.channel_failure(ch),
        }
    }

    async fn exec_request(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let cmd = String::from_utf8_lossy(data).into_owned();
        if let Err(e) = self.start_recording(ch, Some(&cmd)) {
            session.extended_data(ch, 1, Bytes::from(format!("sallyport: {e}\r\n")))?;
            session.channel_failure(ch)?;
            return session.close(ch);
        }
        match self.chans.get(&ch) {
            Some(r) if r.node.exec(true, data.to_vec()).await.is_ok() => Ok(()),
            _ => session.channel_failure(ch),
        }
    }

    async fn subsystem_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match self.chans.get(&ch) {
            Some(r) if r.node.request_subsystem(true, name).await.is_ok() => Ok(()),
            _ => session.channel_failure(ch),
        }
    }

    async fn data(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            r.bytes_in.fetch_add(data.len() as u64, Ordering::Relaxed);
            if let Ok(mut rec) = r.rec.lock()
                && let Some(rec) = rec.as_mut()
            {
                rec.input(data);
            }
            if !r
                .input
                .send(Input::Data(Bytes::copy_from_slice(data)))
                .await
            {
                tracing::warn!(user = %self.user, node = %self.node.hostname, "closing a channel the node stopped reading");
                if let Some(r) = self.chans.remove(&ch) {
                    let _ = r.node.close().await;
                }
                return _session.close(ch);
            }
        }
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            r.input.send(Input::Eof).await;
        }
        Ok(())
    }

    async fn window_change_request(
        &mut self,
        ch: ChannelId,
        cols: u32,
        rows: u32,
        _pw: u32,
        _ph: u32,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            if let Ok(mut rec) = r.rec.lock()
                && let Some(rec) = rec.as_mut()
            {
                rec.resize(cols, rows);
            }
            r.input.send(Input::Resize { cols, rows }).await;
        }
        Ok(())
    }

    async fn signal(
        &mut self,
        ch: ChannelId,
        sig: Sig,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.get(&ch) {
            let _ = r.node.signal(sig).await;
        }
        Ok(())
    }

    async fn channel_close(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(r) = self.chans.remove(&ch) {
            let _ = r.node.close().await;
        }
        Ok(())
    }
}
