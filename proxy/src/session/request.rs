//! What each of the person's requests may do, decided as the command task carries it to the
//! node: a shell or command starts the recording (and tells auth the session's kind); a file
//! copy (`sftp`, or a command that is exactly what scp or rsync sends) is checked against
//! `ssh_file_copy` and audited instead of recorded; agent and X11 forwarding against the grant;
//! the person's input is audited when it is a copy and recorded when a role asks. Each request
//! is answered once, in its turn (`reply`): here when the session decides it, else by the node.

use bytes::Bytes;
use russh::ChannelWriteHalf;
use russh::client::Msg as ClientMsg;
use sallyport_core::api::{NodeKind, RecordMode, SessionKind};
use sallyport_core::audit::EventType;
use sallyport_core::scp::{Direction, FileCopy};
use sallyport_core::sftp::SftpAudit;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::authorize::X11_FORWARDING_REFUSED;
use super::copy::CopyAudit;
use super::record::{Header, Limits, Recorder};
use super::relay::Live;
use super::{Command, Door, Event, Refusal, watchdog};

const FILE_COPY_REFUSED: &str =
    "file copy (scp, sftp, rsync) is not allowed by your roles (ssh_file_copy: false)";

pub(super) struct CommandState<'a, D> {
    live: &'a Live<D>,
    node: &'a ChannelWriteHalf<ClientMsg>,
    /// The terminal asked for: (term, cols, rows).
    pty: Option<(String, u32, u32)>,
    /// A shell, command or subsystem was asked for on this channel. One per channel: a second
    /// one is refused whatever the node answered the first, so a refused `subsystem sftp`
    /// cannot leave a channel set up as an unrecorded copy for an `exec`. Stricter than sshd,
    /// which takes another after a failed one (PuTTY's psftp falls back that way, to `exec
    /// sftp-server`; through Sallyport it needs the server's sftp subsystem).
    asked: bool,
}

impl<'a, D: Door> CommandState<'a, D> {
    pub(super) fn new(live: &'a Live<D>, node: &'a ChannelWriteHalf<ClientMsg>) -> Self {
        CommandState {
            live,
            node,
            pty: None,
            asked: false,
        }
    }

    /// Carries out one command; false when the session is over.
    pub(super) async fn run(&mut self, command: Command) -> bool {
        let (live, node) = (self.live, self.node);
        if matches!(
            command,
            Command::Shell | Command::Exec(_) | Command::Subsystem(_)
        ) {
            if self.asked {
                tracing::warn!(session = %live.grant.session_id, "refused a second shell, command or subsystem on one channel");
                return self.answer(false).await;
            }
            self.asked = true;
        }
        match command {
            Command::Pty {
                term,
                cols,
                rows,
                pix_width,
                pix_height,
                modes,
            } => {
                self.pty = Some((term.clone(), cols, rows));
                self.ask(node.request_pty(true, &term, cols, rows, pix_width, pix_height, &modes))
                    .await
            }
            Command::Env { name, value } => {
                // Passed on; whether the node takes it is its business (sshd and the agent
                // ignore names they do not accept).
                let _ = node.set_env(false, name, value).await;
                self.answer(true).await
            }
            Command::Shell => {
                if let Err(e) = self.begin(SessionKind::Shell, None, true).await {
                    return self.fail(e).await;
                }
                self.ask(node.request_shell(true)).await
            }
            Command::Exec(data) => self.exec(data).await,
            Command::Subsystem(name) => {
                if name != "sftp" {
                    let msg = format!("subsystem {name:?} is not offered (only sftp)");
                    return self.refuse(&msg).await;
                }
                if !live.grant.file_copy {
                    live.audit
                        .event(
                            EventType::Sftp,
                            json!({"action": "start", "result": FILE_COPY_REFUSED}),
                        )
                        .await;
                    return self.refuse(FILE_COPY_REFUSED).await;
                }
                if let Ok(mut slot) = live.copy.lock() {
                    *slot = Some(CopyAudit::Sftp(SftpAudit::new()));
                }
                if let Err(e) = self.begin(SessionKind::Sftp, None, false).await {
                    return self.refuse(&e).await;
                }
                self.ask(node.request_subsystem(true, &name)).await
            }
            Command::Agent => {
                // The door answered already (russh takes the answer from its callback); only
                // an allowed request reaches here.
                if live.grant.forward_agent {
                    live.asked.agent.store(true, Ordering::Relaxed);
                    if node.agent_forward(false).await.is_ok() {
                        live.audit
                            .event(EventType::AgentForward, json!({"result": "ok"}))
                            .await;
                    }
                }
                true
            }
            Command::X11 {
                single_connection,
                protocol,
                cookie,
                screen,
            } => {
                if !live.grant.x11_forwarding {
                    live.notice(format!("sallyport: {X11_FORWARDING_REFUSED}\r\n"))
                        .await;
                    return self.answer(false).await;
                }
                live.asked.x11.store(true, Ordering::Relaxed);
                // The node's answer reaches the person through the output task.
                if !self.to_node().await {
                    return false;
                }
                if node
                    .request_x11(true, single_connection, &protocol, &cookie, screen)
                    .await
                    .is_err()
                {
                    // Not audited as forwarding: answered with a failure, in its turn.
                    self.live.replies.not_sent(&*self.live.door).await;
                    return true;
                }
                live.audit
                    .event(
                        EventType::X11Forward,
                        json!({"screen": screen, "result": "ok"}),
                    )
                    .await;
                true
            }
            Command::Data(data) => self.input(data).await,
            Command::Eof => node.eof().await.is_ok(),
            Command::Resize { cols, rows } => {
                if let Some(rec) = live.recorder() {
                    rec.resize(cols, rows).await;
                }
                let ok = node.window_change(cols, rows, 0, 0).await.is_ok();
                self.answer(ok).await && ok
            }
            Command::Signal(sig) => {
                let ok = node.signal(sig).await.is_ok();
                self.answer(ok).await
            }
            Command::Close => false,
        }
    }

    /// The person's input: audited when it is a file copy, recorded when a role asks, then on
    /// to the node.
    async fn input(&mut self, data: Bytes) -> bool {
        let live = self.live;
        live.bytes_in
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        watchdog::touch(&live.activity);
        let audited = match live.copy.lock() {
            Ok(mut c) => match c.as_mut() {
                Some(c) => c.feed(Direction::Upload, &data),
                None => Ok(vec![]),
            },
            Err(_) => Err("audit state lost".to_string()),
        };
        match audited {
            Ok(list) if list.is_empty() => {}
            Ok(list) => live.audit.events(list).await,
            Err(e) => {
                tracing::warn!(session = %live.grant.session_id, error = %e, "closing a file copy that cannot be audited");
                live.audit_copy_aborted(&e).await;
                // The node's answer to the copy's command first, as it gave it.
                self.settle().await;
                live.notice(format!("sallyport: {e}; closing\r\n")).await;
                live.close(Some(Refusal::Failed(e))).await;
                return false;
            }
        }
        let mut chunk = data;
        if let Some(rec) = live.recorder() {
            // Under `strict` (and `record_input`), input the recording cannot hold does not
            // reach the node either; the output task then ends the session.
            chunk.truncate(rec.input(chunk.clone()).await);
        }
        chunk.is_empty() || self.node.data_bytes(chunk).await.is_ok()
    }

    async fn exec(&mut self, data: Vec<u8>) -> bool {
        let live = self.live;
        // Bounded before it is parsed, audited or sent on (agentless nodes have only this check).
        if data.len() > sallyport_core::names::MAX_EXEC_COMMAND {
            let e = format!(
                "the command is {} bytes long; the limit is {}",
                data.len(),
                sallyport_core::names::MAX_EXEC_COMMAND
            );
            return self.refuse(&e).await;
        }
        let cmd = String::from_utf8_lossy(&data).into_owned();
        // An rsync to a node without the agent runs through the login's shell (sshd's way),
        // which the login can make run anything, and rsync's stream is not held to its
        // protocol as scp's and SFTP's are: there it is a recorded session. (An agent runs
        // copies itself, never through the shell.)
        let agentless = live.grant.node.kind != NodeKind::Agent;
        let copy = sallyport_core::scp::classify(&cmd)
            .filter(|c| !(agentless && matches!(c, FileCopy::Rsync { .. })));
        // Refused when it is a copy or only wraps one: what `ssh_file_copy: false` refused
        // before stays refused, though only an exact copy goes unrecorded.
        if !live.grant.file_copy && (copy.is_some() || sallyport_core::scp::mentions_copy(&cmd)) {
            live.audit
                .event(
                    EventType::Scp,
                    json!({"command": cmd, "result": FILE_COPY_REFUSED}),
                )
                .await;
            return self.refuse(FILE_COPY_REFUSED).await;
        }
        if let Some(copy) = copy {
            if let Ok(mut slot) = live.copy.lock() {
                *slot = Some(CopyAudit::new(copy));
            }
            if let Err(e) = self.begin(SessionKind::Exec, Some(&cmd), false).await {
                return self.refuse(&e).await;
            }
        } else if let Err(e) = self.begin(SessionKind::Exec, Some(&cmd), true).await {
            return self.fail(e).await;
        }
        self.ask(self.node.exec(true, data)).await
    }

    /// A request the session answers itself (`reply`: in its turn). False when the session
    /// ended instead (too many answers owed).
    async fn answer(&self, ok: bool) -> bool {
        self.live.replies.decided(&*self.live.door, ok).await || self.owes_too_much().await
    }

    /// A request about to go to the node with a reply wanted: its place in the answers owed,
    /// taken before it leaves so the node's answer always finds it. False when the session
    /// ended instead (too many answers owed).
    async fn to_node(&self) -> bool {
        self.live.replies.await_node().await || self.owes_too_much().await
    }

    /// Sends `request` to the node with a reply wanted, after taking its place ([`to_node`]);
    /// one that cannot be sent is answered with a failure, in its turn. False when the session
    /// ended instead.
    ///
    /// [`to_node`]: Self::to_node
    async fn ask<T, E>(&self, request: impl std::future::Future<Output = Result<T, E>>) -> bool {
        if !self.to_node().await {
            return false;
        }
        if request.await.is_err() {
            self.live.replies.not_sent(&*self.live.door).await;
        }
        true
    }

    /// Before the session ends here: the node's answers to the requests before this one (a
    /// terminal, say), up to [`SETTLE`](super::reply::SETTLE), so the person reads them as the
    /// node gave them (failed answers would make OpenSSH quit before it shows why).
    async fn settle(&self) {
        let _ = tokio::time::timeout(super::reply::SETTLE, self.live.replies.settled()).await;
    }

    /// The node has left [`MAX_OWED`](super::reply::MAX_OWED) answers owed while the person
    /// kept asking: the session ends (its channel closes, so nothing more is owed).
    async fn owes_too_much(&self) -> bool {
        let why = format!(
            "more than {} requests are waiting for the node's answer; the session ends",
            super::reply::MAX_OWED
        );
        tracing::warn!(session = %self.live.grant.session_id, node = %self.live.grant.node.hostname, "{why}");
        self.live.notice(format!("sallyport: {why}\r\n")).await;
        self.live.close(Some(Refusal::Limit(why))).await;
        false
    }

    /// A session that cannot start as asked: the person is told why, the request fails, the
    /// session ends.
    async fn fail(&self, why: String) -> bool {
        self.live.notice(format!("sallyport: {why}\r\n")).await;
        self.live.replies.decided(&*self.live.door, false).await;
        self.settle().await;
        self.live.close(Some(Refusal::Limit(why))).await;
        false
    }

    /// Refuses a request with a message the person sees on stderr, and ends the session:
    /// accepted, then ended with the message and status 1, since OpenSSH clients exit at once
    /// on a failed subsystem request, before printing what the channel said.
    async fn refuse(&self, why: &str) -> bool {
        let live = self.live;
        tracing::info!(session = %live.grant.session_id, node = %live.grant.node.hostname, why, "channel request refused");
        live.replies.decided(&*live.door, true).await;
        self.settle().await;
        live.notice(format!("sallyport: {why}\r\n")).await;
        live.door.send(Event::ExitStatus(1)).await;
        live.door.send(Event::Eof).await;
        live.close(Some(Refusal::Denied {
            explanation: why.to_string(),
        }))
        .await;
        false
    }

    /// The session starts `kind` (`shell`, `exec`, `sftp`): tells auth, and records it unless
    /// it is a file copy (audited per file instead).
    async fn begin(
        &mut self,
        kind: SessionKind,
        command: Option<&str>,
        record: bool,
    ) -> Result<(), String> {
        // Reached once per channel at most: only behind `asked`.
        let live = self.live;
        if let Ok(mut slot) = live.kind.lock() {
            *slot = Some((kind, command.map(str::to_string)));
        }
        // A kube exec's kind and command are in its session row since the grant: auth wrote
        // them there from the signed exec, and nothing needs telling while it starts.
        if live.grant.node.kind != NodeKind::Kube {
            live.audit.update(kind, command).await;
        }
        if !record {
            return Ok(());
        }
        let (term, cols, rows) = self.pty.clone().unwrap_or_else(|| ("dumb".into(), 80, 24));
        let strict = live.grant.record == RecordMode::Strict;
        let limits = Limits {
            input: live.grant.record_input,
            max_bytes: live.state.max_recording_size,
            strict,
        };
        // The file is created and its header written on a blocking thread: a recordings disk
        // that hangs (a stalled network mount) holds back this session, not an async worker
        // and every session on it.
        let (dir, id, title) = (
            live.state.recordings.clone(),
            live.grant.session_id.clone(),
            live.title.clone(),
        );
        let command = command.map(str::to_string);
        let created = tokio::task::spawn_blocking(move || {
            let header = Header {
                width: cols,
                height: rows,
                term: &term,
                title: &title,
                command: command.as_deref(),
            };
            Recorder::create(&dir, &id, &header, limits)
        });
        let created = match tokio::time::timeout(super::record::STALL, created).await {
            Ok(Ok(created)) => created,
            Ok(Err(e)) => Err(std::io::Error::other(format!(
                "starting the recording: {e}"
            ))),
            Err(_) => Err(std::io::Error::other(format!(
                "the recording's file was not created within {} s (is the recordings disk stalled?)",
                super::record::STALL.as_secs()
            ))),
        };
        match created {
            Ok(rec) => {
                if let Ok(mut slot) = live.rec.lock() {
                    *slot = Some(Arc::new(rec));
                }
                Ok(())
            }
            Err(e) => {
                // Audited either way; under `best_effort` the session goes on unrecorded.
                live.recording_failed(&e.to_string()).await;
                if strict {
                    return Err(format!(
                        "this session must be recorded (record_session: strict) and the recording failed: {e}"
                    ));
                }
                Ok(())
            }
        }
    }
}
