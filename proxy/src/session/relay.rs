//! A running session: two tasks between the door and the node channel. The command task takes
//! the door's [`Command`]s in the order the person gave them (requests, input, resizes,
//! signals) and carries them to the node, deciding on the way what each request may do (file
//! copies and forwarding against the grant, the recording started); the output task carries the
//! node's output, replies and exit back as [`Event`]s, recording and auditing as it goes, and
//! watches the session ([`watchdog`](super::watchdog)). The door's callbacks never wait on
//! either: [`Commands::send`] only queues.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use russh::client::Msg as ClientMsg;
use russh::{Channel, ChannelMsg, ChannelReadHalf, ChannelWriteHalf};
use sallyport_core::api::{NodeKind, SessionEnd, SessionGrant, SessionKind, SessionStatus};
use sallyport_core::audit::EventType;
use sallyport_core::audit::catalogue::Source;
use sallyport_core::metrics::{ActiveSession, metrics};
use sallyport_core::scp::Direction;
use tokio::sync::mpsc;

use super::audit::Audit;
use super::authorize::{self, GrantRecheck, Target};
use super::copy::{CopyAudit, copy_aborted};
use super::dial::{Asked, Dialed, NodeConn, Toward};
use super::record::Recorder;
use super::reply::Replies;
use super::{Command, Door, Event, Refusal, watchdog};
use crate::state::ProxyState;

/// A session granted and its node channel open, not yet started.
pub struct Opened {
    pub grant: SessionGrant,
    conn: NodeConn,
    channel: Channel<ClientMsg>,
    asked: Arc<Asked>,
}

/// Authorizes `target` with auth, dials its node and opens a session channel there. A session
/// that cannot be opened is ended in auth before the refusal is returned.
pub async fn open(
    state: Arc<ProxyState>,
    target: &Target,
    toward: Option<Toward>,
) -> Result<Opened, Refusal> {
    let opened = open_session(state, target, toward).await;
    if let Err(why) = &opened {
        metrics().session_rejected(target.door, why.class());
    }
    opened
}

async fn open_session(
    state: Arc<ProxyState>,
    target: &Target,
    toward: Option<Toward>,
) -> Result<Opened, Refusal> {
    let asked = toward.as_ref().map(|t| t.asked.clone()).unwrap_or_default();
    let (grant, connected) = if super::dial::dials_ahead(&target.node) {
        // The node's key exchange runs while auth decides; a refusal drops it half-way, and
        // is the answer whatever the node's state (nothing about the node reaches a person
        // the roles do not let in).
        let connect = super::dial::connect(state.clone(), &target.node, toward);
        let asking = authorize::grant(&state, target);
        tokio::pin!(connect, asking);
        let mut connected = None;
        let grant = loop {
            tokio::select! {
                g = &mut asking => break g?,
                c = &mut connect, if connected.is_none() => connected = Some(c),
            }
        };
        let connected = match connected {
            Some(c) => c,
            None => connect.await,
        };
        (grant, connected)
    } else {
        let grant = authorize::grant(&state, target).await?;
        let connected = super::dial::connect(state.clone(), &grant.node, toward).await;
        (grant, connected)
    };
    let dialed = match connected {
        Ok(c) => c.authenticate(&grant, &target.login).await,
        Err(why) => Err(why),
    };
    let Dialed { conn, open_failure } = match dialed {
        Ok(d) => d,
        Err(why) => {
            super::audit::end_now(&state, &grant.session_id, authorize::failed_end()).await;
            return Err(why);
        }
    };
    match conn.channel_open_session().await {
        Ok(channel) => Ok(Opened {
            grant,
            conn,
            channel,
            asked,
        }),
        Err(e) => {
            let why = sallyport_core::flow::open_failure_reason(&open_failure, e).await;
            super::audit::end_now(&state, &grant.session_id, authorize::failed_end()).await;
            Err(Refusal::Failed(why))
        }
    }
}

/// The door's way into a running session: queues without ever waiting.
#[derive(Clone)]
pub struct Commands {
    /// At most [`MAX_PENDING`] commands of any kind waiting for the node.
    tx: mpsc::Sender<Command>,
    queued: Arc<AtomicUsize>,
    /// The door's window ([`Door::window`]), or the flood cap.
    limit: usize,
}

/// The most commands a session holds for its node at once: the window bounds the input's bytes,
/// this its messages (a request or a one-byte packet costs the proxy far more than its payload),
/// so a peer flooding requests, or input in tiny packets, at a node that does not read is
/// closed rather than queued without end. Requests count their payload against the window too.
pub const MAX_PENDING: usize = 16 * 1024;

/// Room for requests' payloads (environment, commands) beside the input the window allows. One
/// allowance for both: a full window of input may wait behind a `pty-req` without the session
/// being taken for a flood, so input too may run up to this far past the window.
const REQUEST_ROOM: usize = 1024 * 1024;

/// What a command's payload weighs against the window.
fn weight(command: &Command) -> usize {
    match command {
        Command::Data(d) => d.len(),
        Command::Env { name, value } => name.len() + value.len(),
        Command::Exec(c) => c.len(),
        Command::Subsystem(n) => n.len(),
        Command::Pty { term, modes, .. } => term.len() + modes.len() * 8,
        Command::X11 {
            protocol, cookie, ..
        } => protocol.len() + cookie.len(),
        _ => 0,
    }
}

impl Commands {
    /// Queues `command`. False when the session is gone, or when the input would take what
    /// waits for the node past the door's window (a peer ignoring flow control) or, for a door
    /// without one, past [`HIGH_WATER`](sallyport_core::flow::HIGH_WATER): the door then closes
    /// the session (its channel, never stalling the connection).
    pub fn send(&self, command: Command) -> bool {
        let w = weight(&command);
        let limit = self.limit.saturating_add(REQUEST_ROOM);
        if w > 0 {
            let queued = self.queued.fetch_add(w, Ordering::AcqRel);
            if queued.saturating_add(w) > limit {
                self.queued.fetch_sub(w, Ordering::AcqRel);
                return false;
            }
        }
        // Full (past MAX_PENDING) or closed: refused.
        if self.tx.try_send(command).is_err() {
            self.queued.fetch_sub(w, Ordering::AcqRel);
            return false;
        }
        true
    }
}

/// What both tasks of a session share.
pub(super) struct Live<D> {
    pub(super) state: Arc<ProxyState>,
    pub(super) grant: SessionGrant,
    pub(super) door: Arc<D>,
    pub(super) audit: Audit,
    pub(super) asked: Arc<Asked>,
    /// `login@host (user)`: a recording's title.
    pub(super) title: String,
    pub(super) cert_expires: u64,
    /// The recording, once a shell or command starts it; both tasks take a handle from here
    /// and use it with no lock held (`record::ended`).
    pub(super) rec: Mutex<Option<Arc<Recorder>>>,
    /// The recording could not be created or written: the session's end says `incomplete`.
    pub(super) recording_failed: AtomicBool,
    pub(super) copy: Mutex<Option<CopyAudit>>,
    /// What the session turned out to be, once it began (`shell`, `exec`, `sftp`).
    pub(super) kind: Mutex<Option<(SessionKind, Option<String>)>>,
    pub(super) bytes_in: AtomicU64,
    /// When data last moved either way on any of the person's channels (Unix milliseconds).
    pub(super) activity: Arc<AtomicU64>,
    pub(super) closed: AtomicBool,
    /// The command task ended (the person closed the session or left): output that waits
    /// for the person's window will never get it.
    pub(super) input_ended: AtomicBool,
    /// The answers owed to the person's requests, in their order (`reply`).
    pub(super) replies: Replies,
    /// Counted in `sallyport_sessions_active` while both tasks hold the session.
    _active: ActiveSession,
}

impl<D: Door> Live<D> {
    /// Tells the door the session is over, once.
    pub(super) async fn close(&self, why: Option<Refusal>) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            // Every request answered before the end, none after.
            self.replies.close(&*self.door).await;
            self.door.send(Event::Closed { why }).await;
        }
    }

    /// Audits why this channel's file copy was ended ([`CopyAudit::aborted`]; an SFTP abort
    /// when no copy is set).
    pub(super) async fn audit_copy_aborted(&self, why: &str) {
        let ev = self
            .copy
            .lock()
            .ok()
            .and_then(|c| c.as_ref().map(|c| c.aborted(why)))
            .unwrap_or_else(|| copy_aborted(why));
        self.audit.events(vec![ev]).await;
    }

    pub(super) async fn notice(&self, text: String) -> bool {
        self.door
            .send(Event::Data {
                ext: Some(1),
                data: Bytes::from(text),
            })
            .await
    }
}

/// Starts `opened` for `target`, its events going to `door`; `activity` is the person's
/// connection's (idle timeouts count all of its channels).
pub fn start<D: Door>(
    state: Arc<ProxyState>,
    target: &Target,
    opened: Opened,
    door: Arc<D>,
    activity: Arc<AtomicU64>,
) -> Commands {
    let Opened {
        grant,
        conn,
        channel,
        asked,
    } = opened;
    let audit = Audit::spawn(state.clone(), &grant.session_id);
    let _ = asked.audit.set(audit.clone());
    let _ = asked
        .recheck
        .set(Arc::new(GrantRecheck::new(state.clone(), &grant)));
    let live = Arc::new(Live {
        title: format!("{}@{} ({})", target.login, grant.node.hostname, target.user),
        cert_expires: target.cert_expires,
        state,
        grant,
        door,
        audit,
        asked,
        rec: Mutex::new(None),
        recording_failed: AtomicBool::new(false),
        copy: Mutex::new(None),
        kind: Mutex::new(None),
        bytes_in: AtomicU64::new(0),
        activity,
        closed: AtomicBool::new(false),
        input_ended: AtomicBool::new(false),
        replies: Replies::default(),
        _active: metrics().session_started(target.door),
    });
    let limit = live
        .door
        .window()
        .map_or(sallyport_core::flow::HIGH_WATER, |w| w as usize);
    // The node connection runs `WindowPolicy::Consumed` (`dial`): its window is given back as
    // the output task hands the node's bytes on.
    let credit = sallyport_core::flow::client_credit(conn.clone(), channel.id());
    let (read, write) = channel.split();
    let (tx, rx) = mpsc::channel(MAX_PENDING);
    let queued = Arc::new(AtomicUsize::new(0));
    tokio::spawn(commands(live.clone(), rx, queued.clone(), Arc::new(write)));
    tokio::spawn(output(live, read, conn, credit));
    Commands { tx, queued, limit }
}

/// The command task: the person's requests and input, in order, to the node.
async fn commands<D: Door>(
    live: Arc<Live<D>>,
    mut rx: mpsc::Receiver<Command>,
    queued: Arc<AtomicUsize>,
    node: Arc<ChannelWriteHalf<ClientMsg>>,
) {
    let mut c = super::request::CommandState::new(&live, &node);
    while let Some(command) = rx.recv().await {
        queued.fetch_sub(weight(&command), Ordering::AcqRel);
        let input = match &command {
            Command::Data(d) => d.len(),
            _ => 0,
        };
        if !c.run(command).await {
            break;
        }
        // Written into the node's window (or dropped): the person may send that much more.
        if input > 0 {
            live.door.consumed(input);
        }
    }
    live.input_ended.store(true, Ordering::Release);
    let _ = node.close().await;
}

/// Sends the node's output to the person, which waits for their window; meanwhile the session
/// is still watched. `Err` with why the session ends when it must end first (or the person
/// left: `None`).
async fn deliver<D: Door>(live: &Live<D>, event: Event) -> Result<bool, Option<Refusal>> {
    watchdog::watched(live.watch(true), live.door.send(event)).await
}

impl<D: Door> Live<D> {
    /// What a wait of this session watches; `for_person`: a wait for the person's window,
    /// which ends when they stopped sending.
    fn watch(&self, for_person: bool) -> watchdog::Watch<'_> {
        watchdog::Watch {
            grant: &self.grant,
            activity: &self.activity,
            cert_expires: self.cert_expires,
            closed: &self.closed,
            person_gone: for_person.then_some(&self.input_ended),
        }
    }
}

/// How long the watchdog's reason waits for room in the person's window before the session
/// ends without it in the output.
const NOTICE_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// The output task: node → person. Output, exit status, replies; records output; audits file
/// copies; watches the session; at the end completes the recording before the person sees the
/// end (its sync beside that; beside the end itself when the watchdog ends the session),
/// closes the node connection and ends the session in auth.
async fn output<D: Door>(
    live: Arc<Live<D>>,
    mut read: ChannelReadHalf,
    conn: NodeConn,
    credit: sallyport_core::flow::Credit,
) {
    let grant = &live.grant;
    let door = &live.door;
    let mut exit_code: Option<i64> = None;
    let mut bytes_out = 0u64;
    let mut agent_reported = false;
    // Error output of a file copy so far (`COPY_STDERR_MAX`).
    let mut copy_stderr = 0usize;
    let mut copy_stderr_cut = false;
    let mut why: Option<Refusal> = None;
    let mut tick = tokio::time::interval(watchdog::TICK);
    // How many leading bytes of `data` the recording takes: under `strict` near the limit
    // (or once it failed), fewer than all, and the person is shown only those before the
    // session ends. Its wait for room (a writer behind) is watched as the wait for the
    // person's window is: the session still ends on time.
    let record = async |data: &Bytes| -> Result<usize, Option<Refusal>> {
        match live.recorder() {
            Some(r) => watchdog::watched(live.watch(false), r.output(data.clone())).await,
            None => Ok(data.len()),
        }
    };
    loop {
        // Checked before anything more reaches the person: under `strict` nothing is shown
        // that the recording no longer holds.
        if let Some(text) = live.recording_stopped().await {
            live.notice(format!("\r\nsallyport: {text}\r\n")).await;
            door.send(Event::ExitStatus(255)).await;
            exit_code = Some(255);
            why = Some(Refusal::Limit(text));
            break;
        }
        let msg = tokio::select! {
            m = read.wait() => m,
            _ = tick.tick() => match live.watch(false).ended() {
                None => continue,
                Some(None) => break,
                Some(Some(end)) => {
                    // Said in the session if the person's window has room soon; the end that
                    // follows carries the reason anyway, and a person who stopped reading must
                    // not hold it up.
                    let _ = tokio::time::timeout(
                        NOTICE_WAIT,
                        live.notice(format!("\r\nsallyport: {end}\r\n")),
                    )
                    .await;
                    why = Some(end);
                    break;
                }
            }
        };
        let Some(msg) = msg else { break };
        match msg {
            ChannelMsg::Data { mut data } => {
                let received = data.len();
                bytes_out += data.len() as u64;
                watchdog::touch(&live.activity);
                // What the recording does not take is not shown; the loop's check then ends
                // the (`strict`) session.
                match record(&data).await {
                    Ok(n) => data.truncate(n),
                    Err(end) => {
                        why = end;
                        break;
                    }
                }
                let audited = match live.copy.lock() {
                    Ok(mut c) => match c.as_mut() {
                        Some(c) => c.feed(Direction::Download, &data),
                        None => Ok(vec![]),
                    },
                    Err(_) => Err("audit state lost".to_string()),
                };
                match audited {
                    Ok(list) if list.is_empty() => {}
                    Ok(list) => live.audit.events(list).await,
                    Err(e) => {
                        tracing::warn!(session = %grant.session_id, error = %e, "closing a file copy that cannot be audited");
                        live.audit_copy_aborted(&e).await;
                        live.notice(format!("sallyport: {e}; closing\r\n")).await;
                        why = Some(Refusal::Failed(e));
                        break;
                    }
                }
                if !data.is_empty() {
                    match deliver(&live, Event::Data { ext: None, data }).await {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(end) => {
                            why = end;
                            break;
                        }
                    }
                }
                credit(received);
            }
            // The agent's own report (`host_user.create`): audited, never shown or recorded.
            ChannelMsg::ExtendedData { data, ext }
                if ext == sallyport_core::api::AGENT_EVENT_EXT =>
            {
                agent_event(&live, &data, &mut agent_reported).await;
                credit(data.len());
            }
            ChannelMsg::ExtendedData { mut data, ext } => {
                let received = data.len();
                bytes_out += data.len() as u64;
                watchdog::touch(&live.activity);
                // A file copy's stderr is for its messages. It is neither recorded nor held
                // to a protocol, so it is bounded: past that, it would be a channel out of the
                // audit's sight (a login's rc files can make `scp` anything on agentless
                // nodes). What comes past the bound is dropped, said once and audited; the
                // copy itself goes on (`scp -v` over many files talks that much).
                let copying = live.copy.lock().is_ok_and(|c| c.is_some());
                let mut cut_now = false;
                if copying {
                    let room = COPY_STDERR_MAX.saturating_sub(copy_stderr);
                    copy_stderr = copy_stderr.saturating_add(received);
                    if received > room {
                        data.truncate(room);
                        cut_now = !copy_stderr_cut;
                        copy_stderr_cut = true;
                    }
                }
                match record(&data).await {
                    Ok(n) => data.truncate(n),
                    Err(end) => {
                        why = end;
                        break;
                    }
                }
                if !data.is_empty() {
                    let event = Event::Data {
                        ext: Some(ext),
                        data,
                    };
                    match deliver(&live, event).await {
                        Ok(true) => {}
                        Ok(false) => break,
                        Err(end) => {
                            why = end;
                            break;
                        }
                    }
                }
                if cut_now {
                    let e = format!("error output past {} KiB dropped", COPY_STDERR_MAX / 1024);
                    tracing::warn!(session = %grant.session_id, "file copy: {e}");
                    let ev = live
                        .copy
                        .lock()
                        .ok()
                        .and_then(|c| c.as_ref().map(|c| c.stderr_cut(&e)));
                    if let Some(ev) = ev {
                        live.audit.events(vec![ev]).await;
                    }
                    live.notice(format!("\r\nsallyport: the file copy's {e}\r\n"))
                        .await;
                }
                credit(received);
            }
            ChannelMsg::ExitStatus { exit_status } => {
                exit_code = Some(i64::from(exit_status));
                door.send(Event::ExitStatus(exit_status)).await;
            }
            ChannelMsg::ExitSignal {
                signal_name,
                core_dumped,
                error_message,
                ..
            } => {
                exit_code = Some(-1);
                door.send(Event::ExitSignal {
                    signal: signal_name,
                    core_dumped,
                    message: error_message,
                })
                .await;
            }
            // The node's answer to the oldest request still awaiting it, sent in its turn.
            ChannelMsg::Success => live.replies.node_answered(&**door, true).await,
            ChannelMsg::Failure => live.replies.node_answered(&**door, false).await,
            ChannelMsg::Eof => {
                door.send(Event::Eof).await;
            }
            ChannelMsg::Close => break,
            _ => {}
        }
    }
    if matches!(why, Some(Refusal::Expired(_))) {
        // A session the watchdog ends (idle, an expired certificate) ends now: the person is
        // told (their connection, forwards and all, goes) and the node's connection closed
        // beside the recording being completed and synced, which a writer behind a stalled
        // disk may hold up for its stall time — and neither waits for the other (a person who
        // stopped reading holds up neither the recording nor the audited end). What the person
        // was shown, the recording took before it was shown.
        let ending = async {
            let _ = tokio::join!(
                live.close(why),
                conn.disconnect(russh::Disconnect::ByApplication, "", "")
            );
        };
        let recording = async {
            let syncing = live.complete_recording().await;
            live.recording_synced(syncing).await;
        };
        tokio::join!(ending, recording);
    } else {
        // Otherwise the recording is complete (written and flushed) before the person sees
        // the session end; it syncs while the end is told, and before the end is audited.
        let syncing = live.complete_recording().await;
        tokio::join!(live.close(why), live.recording_synced(syncing));
        let _ = conn
            .disconnect(russh::Disconnect::ByApplication, "", "")
            .await;
    }
    let last = live
        .copy
        .lock()
        .ok()
        .and_then(|mut c| c.as_mut().map(|c| c.finish(exit_code)))
        .unwrap_or_default();
    live.audit.events(last).await;
    let (kind, command) = live
        .kind
        .lock()
        .ok()
        .and_then(|c| c.clone())
        .unwrap_or((SessionKind::Shell, None));
    let end = SessionEnd {
        exit_code,
        bytes_in: live.bytes_in.load(Ordering::Relaxed),
        bytes_out,
        status: if live.recording_failed.load(Ordering::Acquire) {
            SessionStatus::Incomplete
        } else {
            SessionStatus::Complete
        },
        kind: Some(kind),
        command,
    };
    live.audit.end(end).await;
}

/// An agent's report of what it did for a session (`api::AGENT_EVENT_EXT`): only from an agent
/// node (only the agent writes SSH messages there; an sshd never sends these) and only the
/// events an agent may report.
async fn agent_event<D: Door>(live: &Live<D>, data: &[u8], reported: &mut bool) {
    let grant = &live.grant;
    if grant.node.kind != NodeKind::Agent {
        return;
    }
    // Not taken on trust: one report per session, small, and only when the grant let the agent
    // create a login at all.
    if !agent_event_allowed(grant.host_user.is_some(), *reported, data.len()) {
        tracing::warn!(session = %grant.session_id, node = %grant.node.hostname, "ignored an agent event this session's grant does not allow");
        return;
    }
    *reported = true;
    let event = agent_report(data);
    match event {
        Some((t, fields)) => {
            live.audit.event(t, serde_json::Value::Object(fields)).await;
        }
        None => {
            tracing::warn!(session = %grant.session_id, node = %grant.node.hostname, "ignored an agent event that is not one an agent may report")
        }
    }
}

/// An agent's report read: only an event the catalogue says an agent reports, with only the
/// fields the catalogue documents for it, so the log says nothing an agent made up (auth sets
/// session_id, login and node from the session itself).
fn agent_report(data: &[u8]) -> Option<(EventType, serde_json::Map<String, serde_json::Value>)> {
    let e = serde_json::from_slice::<sallyport_core::api::SessionEvent>(data).ok()?;
    let t = EventType::from_name(&e.event).filter(|t| t.source() == Source::Agent)?;
    let fields = e
        .fields
        .into_iter()
        .filter(|(k, _)| t.fields().iter().any(|f| f.name == k))
        .collect();
    Some((t, fields))
}

/// The most error output a file copy may write: scp, rsync and sftp-server print a line per
/// problem, never a stream.
const COPY_STDERR_MAX: usize = 64 * 1024;

/// The largest agent report taken (a `host_user.create` is a few hundred bytes).
const AGENT_EVENT_MAX: usize = 4096;

/// Whether an agent's report may be taken: the grant carries a host-user decision, none was
/// taken yet in this session, and it is at most [`AGENT_EVENT_MAX`] bytes.
fn agent_event_allowed(grant_has_host_user: bool, already: bool, len: usize) -> bool {
    grant_has_host_user && !already && len <= AGENT_EVENT_MAX
}

#[cfg(test)]
mod tests;
