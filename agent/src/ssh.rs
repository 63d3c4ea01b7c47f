//! The agent's SSH server, one per tunnel stream. It accepts only user certificates from the
//! cluster's user CA for the login asked for, and runs sessions as that login: pty or not, shell
//! or exec, env (allow-listed), window changes, signals, exit status and exit signal, as sshd.
//! Unlike sshd, a file copy (`core::scp::parse`: exact scp, rsync server, sftp-server, and the
//! `sftp` subsystem) runs its system program directly, never through the login's shell: it
//! is not recorded, so the login's rc files must not decide what it runs.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;

use bytes::Bytes;
use russh::keys::ssh_key::{Certificate, PrivateKey, PublicKey};
use russh::server::{Auth, Handle, Msg, Session};
use russh::{Channel, ChannelId, ChannelOpenFailure, ChannelWriteHalf, Sig};
use sallyport_core::flow::{self, Input};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use crate::forward;
use sallyport_core::names::{MAX_ENV_VALUE, MAX_EXEC_COMMAND};

use crate::becomes::Becomes;
use crate::host_user;
use crate::passwd::{self, Login};
use crate::session_exec::{self, PamExec};
use crate::spawn::{self, exited, pidfd};
use crate::{AgentError, AgentIdentity};
use crate::{motd, utmp};

/// Environment variables a client may set (everything else is ignored, as sshd's AcceptEnv
/// would): never LD_PRELOAD, BASH_ENV or PATH.
fn env_allowed(name: &str) -> bool {
    name == "LANG" || name == "TZ" || name == "COLORTERM" || name.starts_with("LC_")
}

/// At most this many environment variables per session (sshd has no such limit; 64 is far
/// more than the allow-list above yields in practice).
const MAX_ENV_VARS: usize = 64;

pub struct NodeServer {
    config: HostConfig,
    user_cas: Vec<PublicKey>,
    nodename: String,
    /// Sessions run through PAM (`ssh_service.pam`) in `sallyport session-exec`.
    pam: Option<PamExec>,
}

/// What every SSH server of an agent is made from (a node's sessions, a kube agent's execs):
/// the settings with the agent's host key and certificate, and the user CAs it trusts.
pub fn agent_server(
    id: &AgentIdentity,
) -> Result<(Arc<russh::server::Config>, Vec<PublicKey>), AgentError> {
    let bad = |e: &dyn std::fmt::Display| AgentError::Identity(e.to_string());
    let key = PrivateKey::from_openssh(id.ssh_host_key.as_bytes()).map_err(|e| bad(&e))?;
    let cert = Certificate::from_openssh(id.ssh_host_cert.trim()).map_err(|e| bad(&e))?;
    let user_cas = id
        .user_ca_keys
        .iter()
        .map(|k| PublicKey::from_openssh(k.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(&e))?;
    let config = sallyport_core::sshcert::server_settings(
        sallyport_core::sshcert::ServerRole::Agent,
        key,
        cert,
    );
    Ok((Arc::new(config), user_cas))
}

/// An agent's SSH server settings, replaced when its host certificate is renewed: connections
/// from then on get the new certificate, those open keep theirs.
pub struct HostConfig(std::sync::RwLock<Arc<russh::server::Config>>);

impl HostConfig {
    pub fn new(config: Arc<russh::server::Config>) -> Self {
        HostConfig(std::sync::RwLock::new(config))
    }

    pub fn get(&self) -> Arc<russh::server::Config> {
        match self.0.read() {
            Ok(c) => c.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// The settings for the identity's (renewed) host certificate.
    pub fn renew(&self, id: &AgentIdentity) -> Result<(), AgentError> {
        let (config, _) = agent_server(id)?;
        match self.0.write() {
            Ok(mut c) => *c = config,
            Err(p) => *p.into_inner() = config,
        }
        Ok(())
    }
}

impl NodeServer {
    /// Takes the renewed host certificate for new connections.
    pub fn renewed(&self, id: &AgentIdentity) -> Result<(), AgentError> {
        self.config.renew(id)
    }

    pub fn new(id: &AgentIdentity) -> Result<Self, AgentError> {
        let (config, user_cas) = agent_server(id)?;
        Ok(NodeServer {
            config: HostConfig::new(config),
            user_cas,
            nodename: id.nodename.clone(),
            pam: None,
        })
    }

    /// Runs every session through PAM's account and session stacks (see `session_exec`).
    pub fn with_pam(mut self, pam: Option<PamExec>) -> Self {
        self.pam = pam;
        self
    }

    /// Serves one SSH connection on `stream` until it ends; `local` is the node's end of the
    /// tunnel it came through (the server half of `SSH_CONNECTION`).
    pub async fn serve<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        self: Arc<Self>,
        stream: S,
        local: Option<SocketAddr>,
    ) {
        // Only the proxy reaches this server, so there is no one to cap here; a connection
        // that does not authenticate in time is still ended.
        let (pending, login) = sallyport_core::door::Pending::new(None);
        let conn = Conn {
            srv: self.clone(),
            login: None,
            user: None,
            channels: HashMap::new(),
            permits: Permits::default(),
            stop: CancellationToken::new(),
            remote: HashMap::new(),
            pending,
            client: None,
            local,
            host_user: None,
        };
        if let Err(e) = sallyport_core::door::serve_ssh(
            self.config.get(),
            stream,
            conn,
            login,
            sallyport_core::door::DEFAULT_LOGIN_GRACE,
            // The peer is the proxy, whose windows are its own.
            sallyport_core::flow::WRITE_QUEUE,
        )
        .await
        {
            tracing::debug!(error = %e, "ssh connection ended");
        }
    }
}

#[derive(Default)]
struct Chan {
    pty: Option<(String, u32, u32)>,
    env: Vec<(String, String)>,
    /// Why an `env` request was over the limits; the session refuses to start with it (an
    /// `env` request has no answer the client would show).
    env_refused: Option<String>,
    input: Option<flow::Sender>,
    /// Where the command's output goes: writes wait for the proxy's window, so a slow reader
    /// at the far end holds the command back rather than this agent buffering its output.
    output: Option<Arc<ChannelWriteHalf<Msg>>>,
    pid: PidSlot,
    /// Keeps a login created under `insecure-drop` while this session lasts (held, not read).
    _host_user: Option<host_user::Lease>,
}

struct Conn {
    srv: Arc<NodeServer>,
    login: Option<Login>,
    user: Option<String>,
    channels: HashMap<ChannelId, Chan>,
    /// What the session certificate permits (`permit-*` extensions, set by auth from roles).
    permits: Permits,
    /// Ends every listener and forwarded connection with this SSH connection.
    stop: CancellationToken,
    /// Remote forwards by the (address, port) the client asked for.
    remote: HashMap<(String, u32), CancellationToken>,
    /// Held to the login grace until authenticated.
    pending: sallyport_core::door::Pending,
    /// The user's own address, from the per-session certificate auth signed.
    client: Option<SocketAddr>,
    /// The node's end of the tunnel this connection came through.
    local: Option<SocketAddr>,
    /// Auth's host user decision for this login on this node, from the session certificate.
    host_user: Option<sallyport_core::role::HostUser>,
}

#[derive(Default, Debug, Clone, Copy)]
struct Permits {
    port_forwarding: bool,
    agent_forwarding: bool,
    x11_forwarding: bool,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.stop.cancel();
        // The connection dropped: hang up every session still running, as a terminal's hang-up
        // would (each session leads its own process group).
        for c in self.channels.values() {
            c.pid.kill(nix::sys::signal::Signal::SIGHUP);
        }
    }
}

/// The system's SFTP server, run as the login for the `sftp` subsystem.
fn sftp_server() -> Option<&'static str> {
    [
        "/usr/lib/openssh/sftp-server",
        "/usr/libexec/openssh/sftp-server",
        "/usr/libexec/sftp-server",
        "/usr/lib/ssh/sftp-server",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).is_file())
}

/// The argv a file copy runs with: its program as a system binary (an sftp-server path as
/// named; `scp` or `rsync` from the system PATH of /etc/login.defs, absolute entries only,
/// never the login's own PATH), then its words as the shell would pass them.
fn copy_argv(
    copy: &sallyport_core::scp::CopyCommand,
    login: &Login,
) -> Result<Vec<String>, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let name = copy.program();
    let system = passwd::path_for(login);
    let program = if name.starts_with('/') {
        executable(std::path::Path::new(name)).then(|| name.to_string())
    } else {
        system
            .split(':')
            .filter(|d| d.starts_with('/'))
            .map(|d| std::path::Path::new(d).join(name))
            .find(|p| executable(p))
            .map(|p| p.display().to_string())
    }
    .ok_or_else(|| {
        if name.starts_with('/') {
            format!("{name} is not installed")
        } else {
            format!("{name} is not installed in the system PATH ({system})")
        }
    })?;
    let mut argv = vec![program];
    argv.extend(copy.args(&login.home.display().to_string()));
    Ok(argv)
}

fn signal_number(sig: &Sig) -> Option<nix::sys::signal::Signal> {
    use nix::sys::signal::Signal::*;
    Some(match sig {
        Sig::HUP => SIGHUP,
        Sig::INT => SIGINT,
        Sig::QUIT => SIGQUIT,
        Sig::KILL => SIGKILL,
        Sig::TERM => SIGTERM,
        Sig::USR1 => SIGUSR1,
        Sig::ALRM => SIGALRM,
        Sig::PIPE => SIGPIPE,
        Sig::ABRT => SIGABRT,
        Sig::FPE => SIGFPE,
        Sig::ILL => SIGILL,
        Sig::SEGV => SIGSEGV,
        _ => return None,
    })
}

fn signal_name(n: i32) -> Sig {
    match n {
        1 => Sig::HUP,
        2 => Sig::INT,
        3 => Sig::QUIT,
        4 => Sig::ILL,
        6 => Sig::ABRT,
        8 => Sig::FPE,
        9 => Sig::KILL,
        11 => Sig::SEGV,
        13 => Sig::PIPE,
        14 => Sig::ALRM,
        15 => Sig::TERM,
        10 => Sig::USR1,
        n => Sig::Custom(format!("SIG{n}")),
    }
}

/// A session's process while it is not yet reaped: cleared before the agent reaps it (see
/// [`reap`]), so a signal or hang-up never reaches whatever process later gets its number.
#[derive(Default, Clone)]
struct PidSlot(Arc<std::sync::Mutex<Option<u32>>>);

/// The signal to send a session's process for `sig` from the client. Under PAM that process is
/// `session-exec`, which passes signals on to the shell; SIGKILL cannot be passed on (it would
/// end session-exec and leave the shell running with its PAM session open), so it goes as
/// [`KILL_SHELL`](crate::session_exec::KILL_SHELL), which session-exec turns into SIGKILL for
/// the shell.
fn session_signal(sig: nix::sys::signal::Signal, pam: bool) -> nix::sys::signal::Signal {
    if pam && sig == nix::sys::signal::Signal::SIGKILL {
        crate::session_exec::KILL_SHELL
    } else {
        sig
    }
}

impl PidSlot {
    fn set(&self, pid: Option<u32>) {
        if let Ok(mut p) = self.0.lock() {
            *p = pid;
        }
    }

    /// Signals the session's process group (every session leads one), else its process;
    /// under the lock, so the process cannot be reaped meanwhile.
    fn kill(&self, sig: nix::sys::signal::Signal) {
        if let Ok(p) = self.0.lock()
            && let Some(pid) = *p
        {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            if nix::sys::signal::killpg(pid, sig).is_err() {
                let _ = nix::sys::signal::kill(pid, sig);
            }
        }
    }
}

/// A command's stdin, stdout and stderr, whichever way it was started.
type Writer = Box<dyn AsyncWrite + Unpin + Send>;
type Reader = Box<dyn AsyncRead + Unpin + Send>;

/// A session's process: started by std (the PAM path, kernels before 5.3) or by
/// [`spawn`] (no copy of the agent).
enum Proc {
    Std(tokio::process::Child),
    Cloned(spawn::Spawned),
}

impl Proc {
    fn id(&self) -> Option<u32> {
        match self {
            Proc::Std(c) => c.id(),
            Proc::Cloned(c) => Some(c.id()),
        }
    }
}

/// argv[0] (when not the program's own name) and the arguments: a file copy's own argv, `-c
/// command`, or a login shell (`-bash`, when `login_shell` names it).
fn argv_of(
    direct: &Option<Vec<String>>,
    command: &Option<String>,
    login_shell: Option<&str>,
) -> (Option<String>, Vec<String>) {
    match (direct, command) {
        (Some(argv), _) => (None, argv.iter().skip(1).cloned().collect()),
        (None, Some(c)) => (None, vec!["-c".to_string(), c.clone()]),
        (None, None) => (login_shell.map(|s| format!("-{s}")), vec![]),
    }
}

/// Waits for `child` to exit and reaps it, clearing `slot` in between: once it has exited
/// (a zombie, its number still taken) and before the number is freed.
async fn reap(child: &mut Proc, slot: &PidSlot) -> std::io::Result<std::process::ExitStatus> {
    let child = match child {
        Proc::Cloned(c) => return c.wait(|| slot.set(None)).await,
        Proc::Std(c) => c,
    };
    if let Some(fd) = child.id().and_then(pidfd)
        && exited(fd).await
    {
        slot.set(None);
        return child.wait().await;
    }
    // No pidfd (Linux before 5.3): cleared just after the reap instead.
    let status = child.wait().await;
    slot.set(None);
    status
}

impl Conn {
    /// The whole environment of a session, as sshd builds it (nothing of the agent's own):
    /// the login's, where the user came from, the terminal, then the client's allow-listed
    /// variables and the forwarding sockets.
    fn environment(&self, login: &Login, chan: &Chan, tty: Option<&str>) -> Vec<(String, String)> {
        let mut env = vec![
            ("USER".to_string(), login.name.clone()),
            ("LOGNAME".to_string(), login.name.clone()),
            ("HOME".to_string(), login.home.display().to_string()),
            ("PATH".to_string(), passwd::path_for(login)),
            ("MAIL".to_string(), format!("/var/mail/{}", login.name)),
            ("SHELL".to_string(), login.shell.clone()),
        ];
        if let Some(client) = self.client {
            // As sshd writes them: bare addresses (an IPv4 client seen over IPv6 as IPv4).
            let (cip, cport) = (client.ip().to_canonical(), client.port());
            let (sip, sport) = self.local.map_or(("0.0.0.0".to_string(), 0), |a| {
                (a.ip().to_canonical().to_string(), a.port())
            });
            env.push(("SSH_CLIENT".into(), format!("{cip} {cport} {sport}")));
            env.push((
                "SSH_CONNECTION".into(),
                format!("{cip} {cport} {sip} {sport}"),
            ));
        }
        if let Some(tty) = tty {
            env.push(("SSH_TTY".into(), tty.to_string()));
        }
        if let Some((term, _, _)) = &chan.pty {
            env.push(("TERM".into(), term.clone()));
        }
        if let Some(u) = &self.user {
            env.push(("SALLYPORT_USER".into(), u.clone()));
        }
        env.extend(chan.env.iter().cloned());
        env
    }

    /// What `sallyport session-exec` needs to run this session through PAM.
    fn exec_spec(
        &self,
        pam: &PamExec,
        login: &Login,
        command: Option<String>,
        argv: Option<Vec<String>>,
        env: Vec<(String, String)>,
        tty: Option<&str>,
    ) -> session_exec::Spec {
        session_exec::Spec {
            service: pam.service.clone(),
            nodename: self.srv.nodename.clone(),
            login: login.name.clone(),
            command,
            argv,
            env,
            tty: tty.map(str::to_string),
            rhost: self.client.map(|c| c.ip().to_canonical().to_string()),
        }
    }

    /// Starts the shell (`command` None) or `sh -c command`, or the program `direct` names
    /// with its arguments (a file copy: no shell), and the tasks that relay it.
    fn start(
        &mut self,
        ch: ChannelId,
        command: Option<String>,
        direct: Option<Vec<String>>,
        session: &mut Session,
    ) -> Result<(), String> {
        let login = self.login.clone().ok_or("not authenticated")?;
        still_the_same(&login, &self.srv.nodename)?;
        let chan = self.channels.get(&ch).ok_or("no such channel")?;
        if let Some(e) = &chan.env_refused {
            return Err(e.clone());
        }
        let slot = chan.pid.clone();
        let program = direct
            .as_ref()
            .and_then(|d| d.first())
            .unwrap_or(&login.shell)
            .clone();
        let shell_name = std::path::Path::new(&login.shell)
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "sh".into());
        let output = chan.output.clone().ok_or("no such channel")?;
        let handle = session.handle();
        let (tx, rx) = flow::windowed_inbox(
            self.srv.config.get().window_size,
            flow::server_credit(handle.clone(), ch),
        );
        if let Some((_, cols, rows)) = chan.pty.clone() {
            let (pty, pts) =
                pty_process::open().map_err(|e| format!("cannot allocate a pty: {e}"))?;
            let tty = nix::unistd::ttyname(&pts)
                .map_err(|e| format!("cannot name the pty: {e}"))?
                .display()
                .to_string();
            let env = self.environment(&login, chan, Some(&tty));
            let _ = pty.resize(pty_process::Size::new(
                // 0x0 (a client without a terminal of its own) stays 0x0, "size unknown", as
                // with sshd.
                rows.min(1000) as u16,
                cols.min(1000) as u16,
            ));
            // The motd, as sshd prints it (with PAM, pam_motd's text is shown instead).
            let motd = (self.srv.pam.is_none() && motd::shown(&login, true, command.as_deref()))
                .then(motd::motd)
                .flatten();
            // The shell a session leader with the pty as its controlling terminal and its
            // stdio, as sshd's child (and pty_process) sets it up.
            let cloned = if self.srv.pam.is_none() && spawn::supported() {
                let becomes = Becomes::new(&login, false)?.with_controlling_tty();
                let (arg0, args) = argv_of(&direct, &command, Some(&shell_name));
                let p = spawn::Program::new(&program, arg0.as_deref(), &args, &env)
                    .map_err(|e| format!("cannot start {program}: {e}"))?;
                use std::os::fd::AsRawFd;
                let fd = pts.as_raw_fd();
                match spawn::spawn(&p, [fd, fd, fd], &becomes, false) {
                    Ok(c) => Some(Proc::Cloned(c)),
                    // The pty among descriptors 0-2 (an agent started without them): std's.
                    Err(e) if e.kind() == std::io::ErrorKind::Unsupported => None,
                    Err(e) => return Err(format!("cannot start {program}: {e}")),
                }
            } else {
                None
            };
            let child = if let Some(c) = cloned {
                c
            } else if let Some(pam) = &self.srv.pam {
                let spec = self.exec_spec(pam, &login, command.clone(), direct, env, Some(&tty));
                let io = || {
                    use std::os::fd::AsFd;
                    pts.as_fd()
                        .try_clone_to_owned()
                        .map(Stdio::from)
                        .map_err(|e| format!("cannot start a PAM session: {e}"))
                };
                Proc::Std(session_exec::spawn(pam, &spec, io()?, io()?, io()?)?)
            } else {
                // pty_process makes the shell a session leader with the pty as its controlling
                // terminal (setsid, TIOCSCTTY) before this runs.
                let becomes = Becomes::new(&login, false)?;
                let (arg0, args) = argv_of(&direct, &command, Some(&shell_name));
                let mut cmd = pty_process::Command::new(&program).args(args);
                if let Some(a) = arg0 {
                    cmd = cmd.arg0(a);
                }
                // SAFETY: `Becomes::apply` makes only async-signal-safe calls on data prepared
                // before the fork (see there).
                #[allow(unsafe_code)]
                let cmd = unsafe { cmd.pre_exec(move || becomes.apply()) };
                Proc::Std(
                    cmd.env_clear()
                        .envs(env)
                        .spawn(pts)
                        .map_err(|e| format!("cannot start {program}: {e}"))?,
                )
            };
            let pid = child.id();
            slot.set(pid);
            // A login the system sees (who, w, last, lastlog) while the pty session runs.
            let record = pid.map(|pid| {
                utmp::login(&tty, pid, &login.name, self.client.map(|c| c.ip()));
                (tty, pid)
            });
            let (reader, writer) = pty.into_split();
            tokio::spawn(pty_input(rx, writer));
            tokio::spawn(relay_pty(
                handle, output, ch, reader, child, motd, record, slot,
            ));
        } else {
            let env = self.environment(&login, chan, None);
            // sshd makes a command without a terminal a session (and process group) leader
            // too, so a signal or hang-up reaches everything it started.
            let cloned = if self.srv.pam.is_none() && spawn::supported() {
                let becomes = Becomes::new(&login, true)?;
                let (arg0, args) = argv_of(&direct, &command, None);
                let started =
                    spawn::Program::new(&program, arg0.as_deref(), &args, &env).and_then(|p| {
                        let pipes = spawn::pipes()?;
                        let child = spawn::spawn(&p, pipes.raw(), &becomes, true)?;
                        Ok((child, pipes))
                    });
                match started {
                    Ok((child, pipes)) => Some((child, pipes)),
                    Err(e) if e.kind() == std::io::ErrorKind::Unsupported => None,
                    Err(e) => return Err(format!("cannot start {program}: {e}")),
                }
            } else {
                None
            };
            let (child, stdin, stdout, stderr): (
                Proc,
                Option<Writer>,
                Option<Reader>,
                Option<Reader>,
            ) = if let Some((child, pipes)) = cloned {
                (
                    Proc::Cloned(child),
                    Some(Box::new(pipes.stdin)),
                    Some(Box::new(pipes.stdout)),
                    Some(Box::new(pipes.stderr)),
                )
            } else {
                let mut child = if let Some(pam) = &self.srv.pam {
                    let spec = self.exec_spec(pam, &login, command.clone(), direct, env, None);
                    session_exec::spawn(pam, &spec, Stdio::piped(), Stdio::piped(), Stdio::piped())?
                } else {
                    let becomes = Becomes::new(&login, true)?;
                    let mut cmd = tokio::process::Command::new(&program);
                    cmd.args(argv_of(&direct, &command, None).1);
                    // SAFETY: as above.
                    #[allow(unsafe_code)]
                    unsafe {
                        cmd.pre_exec(move || becomes.apply());
                    }
                    cmd.env_clear()
                        .envs(env)
                        .stdin(Stdio::piped())
                        .stdout(Stdio::piped())
                        .stderr(Stdio::piped())
                        .kill_on_drop(true);
                    cmd.spawn()
                        .map_err(|e| format!("cannot start {program}: {e}"))?
                };
                let stdin = child.stdin.take().map(|s| Box::new(s) as Writer);
                let stdout = child.stdout.take().map(|s| Box::new(s) as Reader);
                let stderr = child.stderr.take().map(|s| Box::new(s) as Reader);
                (Proc::Std(child), stdin, stdout, stderr)
            };
            slot.set(child.id());
            tokio::spawn(pipe_input(rx, stdin));
            tokio::spawn(relay_pipes(handle, output, ch, stdout, stderr, child, slot));
        }
        if let Some(c) = self.channels.get_mut(&ch) {
            c.input = Some(tx);
        }
        Ok(())
    }
}

async fn pty_input(mut rx: flow::Receiver, mut w: pty_process::OwnedWritePty) {
    while let Some(item) = rx.recv().await {
        match item {
            Input::Data(d) => {
                if w.write_all(&d).await.is_err() {
                    break;
                }
            }
            Input::Resize { cols, rows } => {
                let _ = w.resize(pty_process::Size::new(
                    rows.min(1000) as u16,
                    cols.min(1000) as u16,
                ));
            }
            // A terminal has no EOF of its own; the shell sees ^D if it wants one.
            Input::Eof => {}
        }
    }
}

async fn pipe_input<W: AsyncWrite + Unpin>(mut rx: flow::Receiver, mut stdin: Option<W>) {
    while let Some(item) = rx.recv().await {
        match item {
            Input::Data(d) => {
                if let Some(s) = stdin.as_mut()
                    && s.write_all(&d).await.is_err()
                {
                    stdin = None;
                }
            }
            // EOF from the client closes the command's stdin (`echo hi | ssh node cat`).
            Input::Eof => stdin = None,
            Input::Resize { .. } => {}
        }
    }
}

async fn pump<R: AsyncRead + Unpin>(mut r: R, out: &ChannelWriteHalf<Msg>, ext: Option<u32>) {
    let mut buf = vec![0u8; 32 * 1024];
    loop {
        let n = match r.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let data = Bytes::copy_from_slice(&buf[..n]);
        // Returns once the proxy's window took it: the command is read no faster than that.
        let sent = match ext {
            None => out.data_bytes(data).await,
            Some(e) => out.extended_data_bytes(e, data).await,
        };
        if sent.is_err() {
            break;
        }
    }
}

async fn finish(handle: &Handle, ch: ChannelId, status: std::io::Result<std::process::ExitStatus>) {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => {
                let _ = handle.exit_status_request(ch, code as u32).await;
            }
            (None, Some(sig)) => {
                let _ = handle
                    .exit_signal_request(
                        ch,
                        signal_name(sig),
                        s.core_dumped(),
                        String::new(),
                        String::new(),
                    )
                    .await;
            }
            _ => {}
        },
        Err(_) => {
            let _ = handle.exit_status_request(ch, 255).await;
        }
    }
    let _ = handle.eof(ch).await;
    let _ = handle.close(ch).await;
}

async fn relay_pipes<O: AsyncRead + Unpin, E: AsyncRead + Unpin>(
    handle: Handle,
    output: Arc<ChannelWriteHalf<Msg>>,
    ch: ChannelId,
    stdout: Option<O>,
    stderr: Option<E>,
    mut child: Proc,
    slot: PidSlot,
) {
    let out = async {
        if let Some(s) = stdout {
            pump(s, &output, None).await;
        }
    };
    let err = async {
        if let Some(s) = stderr {
            pump(s, &output, Some(1)).await;
        }
    };
    tokio::join!(out, err);
    let status = reap(&mut child, &slot).await;
    finish(&handle, ch, status).await;
}

#[allow(clippy::too_many_arguments)]
async fn relay_pty(
    handle: Handle,
    output: Arc<ChannelWriteHalf<Msg>>,
    ch: ChannelId,
    reader: pty_process::OwnedReadPty,
    mut child: Proc,
    motd: Option<Vec<u8>>,
    record: Option<(String, u32)>,
    slot: PidSlot,
) {
    if let Some(m) = motd {
        // Sent as the pty would show it: newlines become CR LF.
        let mut text = Vec::with_capacity(m.len() + m.len() / 32);
        for (i, b) in m.iter().enumerate() {
            if *b == b'\n' && (i == 0 || m[i - 1] != b'\r') {
                text.push(b'\r');
            }
            text.push(*b);
        }
        let _ = output.data_bytes(Bytes::from(text)).await;
    }
    // Reading the pty ends with EIO once the last process holding it exits.
    pump(reader, &output, None).await;
    let status = reap(&mut child, &slot).await;
    if let Some((tty, pid)) = record {
        let _ = tokio::task::spawn_blocking(move || utmp::logout(&tty, pid)).await;
    }
    finish(&handle, ch, status).await;
}

impl russh::server::Handler for Conn {
    type Error = russh::Error;

    async fn auth_succeeded(&mut self, _session: &mut Session) -> Result<(), Self::Error> {
        self.pending.authenticated();
        Ok(())
    }

    async fn auth_openssh_certificate(
        &mut self,
        login: &str,
        cert: &Certificate,
    ) -> Result<Auth, Self::Error> {
        match sallyport_core::sshcert::verify_user(
            cert,
            &self.srv.user_cas,
            login,
            sallyport_core::sshcert::now(),
        ) {
            Ok(user) => {
                self.user = Some(user);
                self.client = sallyport_core::sshcert::client_addr(cert);
                self.host_user = sallyport_core::sshcert::host_user(cert);
                let ext = cert.extensions();
                self.permits = Permits {
                    port_forwarding: ext.contains_key("permit-port-forwarding"),
                    agent_forwarding: ext.contains_key("permit-agent-forwarding"),
                    x11_forwarding: ext.contains_key("permit-X11-forwarding"),
                };
                self.login = passwd::lookup(login).or(Some(Login {
                    // Unknown logins are refused when a session opens, with a message.
                    name: login.to_string(),
                    uid: u32::MAX,
                    gid: u32::MAX,
                    home: "/".into(),
                    shell: String::new(),
                }));
                // An expired account gets nothing from sshd, forwarding included; its session
                // channels are refused with the reason.
                if passwd::expired(login) {
                    self.permits = Permits::default();
                }
                Ok(Auth::Accept)
            }
            Err(e) => {
                tracing::warn!(login, error = %e, "refused a certificate");
                Ok(Auth::reject())
            }
        }
    }

    async fn channel_open_session(
        &mut self,
        channel: Channel<Msg>,
        reply: russh::server::ChannelOpenHandle,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Host user creation (the roles' create_host_user_mode), just before the login must
        // exist; a refusal (a sudoers line visudo rejects) says why.
        let (created, lease) = match host_user::for_session(&self.login, &self.host_user).await {
            Ok((created, lease, fresh)) => {
                if fresh.is_some() {
                    self.login = fresh;
                }
                (created, lease)
            }
            Err(why) => {
                let name = self.login.as_ref().map_or("", |l| l.name.as_str());
                let reason = format!("login {name} on node {} {why}", self.srv.nodename);
                tracing::warn!(login = name, %reason, "session refused");
                reply
                    .reject(ChannelOpenFailure::Other { code: 1, reason })
                    .await;
                return Ok(());
            }
        };
        let Some(login) = &self.login else {
            reply
                .reject(ChannelOpenFailure::AdministrativelyProhibited)
                .await;
            return Ok(());
        };
        if login.uid == u32::MAX {
            let reason = format!(
                "login {} does not exist on node {}",
                login.name, self.srv.nodename
            );
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        // The uid seen at authentication must still be this login's: a login removed and made
        // again (insecure-drop, or by hand) may now be someone else's uid.
        if let Err(reason) = still_the_same(login, &self.srv.nodename) {
            tracing::warn!(login = %login.name, %reason, "session refused");
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        // An expired account or a shell that says no: refused as sshd refuses them, never run
        // as someone else.
        if let Some(why) = passwd::unavailable(login) {
            let reason = format!("login {} on node {} {why}", login.name, self.srv.nodename);
            tracing::info!(login = %login.name, %reason, "session refused");
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        self.channels.insert(
            channel.id(),
            Chan {
                _host_user: lease,
                ..Chan::default()
            },
        );
        reply.accept().await;
        // The proxy audits what the agent did, not what it was allowed to do.
        if let Some(c) = created {
            host_user::report(&channel, &c).await;
        }
        // Input arrives through `data` (the read half is not needed); output goes through the
        // write half, which waits for the proxy's window.
        let id = channel.id();
        let (_, write) = channel.split();
        if let Some(c) = self.channels.get_mut(&id) {
            c.output = Some(Arc::new(write));
        }
        Ok(())
    }

    async fn pty_request(
        &mut self,
        ch: ChannelId,
        term: &str,
        cols: u32,
        rows: u32,
        _pw: u32,
        _ph: u32,
        _modes: &[(russh::Pty, u32)],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        match self.channels.get_mut(&ch) {
            Some(c) => {
                c.pty = Some((term.to_string(), cols, rows));
                session.channel_success(ch)?;
            }
            None => session.channel_failure(ch)?,
        }
        Ok(())
    }

    async fn env_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        value: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // Every request is answered, as sshd answers it (russh sends the answer only when one
        // was asked for; one left unanswered would take the answer meant for the next).
        let mut taken = false;
        if let Some(c) = self.channels.get_mut(&ch) {
            if !env_allowed(name) {
                tracing::debug!(name, "ignored env request");
            } else if value.len() > MAX_ENV_VALUE {
                c.env_refused.get_or_insert(format!(
                    "environment variable {name} is {} bytes long; the limit is {MAX_ENV_VALUE}",
                    value.len()
                ));
            } else if c.env.len() >= MAX_ENV_VARS {
                c.env_refused
                    .get_or_insert(format!("more than {MAX_ENV_VARS} environment variables"));
            } else {
                c.env.push((name.to_string(), value.to_string()));
                taken = true;
            }
        }
        answer(ch, taken, session)
    }

    async fn shell_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        self.start_reply(ch, None, None, session)
    }

    async fn exec_request(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if data.len() > MAX_EXEC_COMMAND {
            let e = format!(
                "the command is {} bytes long; the limit is {MAX_EXEC_COMMAND}",
                data.len()
            );
            tracing::warn!(error = %e, "exec refused");
            return refuse(ch, &e, session);
        }
        let cmd = String::from_utf8_lossy(data).into_owned();
        // A file copy runs unrecorded, so it runs as the agent reads it itself, whatever the
        // proxy decided: the real program, without the login's shell (whose rc files or a
        // function named `rsync` could make it anything).
        let direct = match (sallyport_core::scp::parse(&cmd), &self.login) {
            (Some(copy), Some(login)) => match copy_argv(&copy, login) {
                Ok(argv) => Some(argv),
                Err(e) => {
                    let e = format!("{e} on node {}", self.srv.nodename);
                    tracing::warn!(error = %e, "copy refused");
                    return refuse(ch, &e, session);
                }
            },
            _ => None,
        };
        self.start_reply(ch, Some(cmd), direct, session)
    }

    async fn subsystem_request(
        &mut self,
        ch: ChannelId,
        name: &str,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if name != "sftp" {
            tracing::debug!(name, "subsystem refused");
            session.channel_failure(ch)?;
            return Ok(());
        }
        match sftp_server() {
            // Run directly, as a copy is: never through the login's shell.
            Some(path) => {
                let argv = vec![path.to_string()];
                self.start_reply(ch, Some(path.to_string()), Some(argv), session)
            }
            None => {
                let msg = format!(
                    "sallyport: node {} has no sftp-server (install openssh-sftp-server)\r\n",
                    self.srv.nodename
                );
                session.extended_data(ch, 1, Bytes::from(msg))?;
                session.channel_failure(ch)
            }
        }
    }

    async fn channel_open_direct_tcpip(
        &mut self,
        channel: Channel<Msg>,
        host: &str,
        port: u32,
        _originator: &str,
        _originator_port: u32,
        reply: russh::server::ChannelOpenHandle,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.login.is_none() || !self.permits.port_forwarding {
            let reason = "port forwarding is not permitted by the session certificate".into();
            reply
                .reject(ChannelOpenFailure::Other { code: 1, reason })
                .await;
            return Ok(());
        }
        tokio::spawn(forward::direct(
            channel,
            session.handle(),
            host.to_string(),
            port,
            reply,
            self.stop.clone(),
        ));
        Ok(())
    }

    async fn tcpip_forward(
        &mut self,
        address: &str,
        port: &mut u32,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        // (u32::MAX: a login this host does not have.)
        let Some(uid) = self
            .login
            .as_ref()
            .map(|l| l.uid)
            .filter(|u| *u != u32::MAX)
        else {
            return Ok(false);
        };
        if !self.permits.port_forwarding {
            tracing::info!(address, port = *port, "remote forward not permitted");
            return Ok(false);
        }
        let listener = match forward::bind_remote(address, *port, uid).await {
            Ok(l) => l,
            Err(e) => {
                tracing::info!(address, port = *port, error = %e, "remote forward refused");
                return Ok(false);
            }
        };
        let bound = listener
            .local_addr()
            .map(|a| u32::from(a.port()))
            .unwrap_or(*port);
        if *port == 0 {
            *port = bound;
        }
        let stop = self.stop.child_token();
        self.remote
            .insert((address.to_string(), bound), stop.clone());
        tokio::spawn(forward::listen_remote(
            listener,
            session.handle(),
            address.to_string(),
            bound,
            stop,
        ));
        Ok(true)
    }

    async fn cancel_tcpip_forward(
        &mut self,
        address: &str,
        port: u32,
        _session: &mut Session,
    ) -> Result<bool, Self::Error> {
        match self.remote.remove(&(address.to_string(), port)) {
            Some(stop) => {
                stop.cancel();
                Ok(true)
            }
            None => Ok(false),
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
        let Some(login) = self.login.clone() else {
            return session.channel_failure(ch);
        };
        if !self.permits.x11_forwarding || !self.channels.contains_key(&ch) {
            tracing::info!(login = %login.name, "X11 forwarding not permitted");
            return session.channel_failure(ch);
        }
        match forward::x11_display(&login, protocol, cookie, screen).await {
            Ok((display, listener)) => {
                if let Some(c) = self.channels.get_mut(&ch) {
                    c.env.push(("DISPLAY".into(), display));
                }
                tokio::spawn(forward::serve_x11(
                    listener,
                    session.handle(),
                    single_connection,
                    self.stop.clone(),
                ));
                session.channel_success(ch)
            }
            Err(e) => {
                tracing::warn!(error = %e, "X11 forwarding failed");
                session.extended_data(ch, 1, Bytes::from(format!("sallyport: {e}\r\n")))?;
                session.channel_failure(ch)
            }
        }
    }

    async fn agent_request(
        &mut self,
        ch: ChannelId,
        session: &mut Session,
    ) -> Result<bool, Self::Error> {
        let Some(login) = self.login.clone() else {
            return Ok(false);
        };
        if !self.permits.agent_forwarding || !self.channels.contains_key(&ch) {
            tracing::info!(login = %login.name, "agent forwarding not permitted");
            return Ok(false);
        }
        match forward::AgentSocket::create(login.uid, login.gid) {
            Ok((sock, listener)) => {
                if let Some(c) = self.channels.get_mut(&ch) {
                    c.env
                        .push(("SSH_AUTH_SOCK".into(), sock.path.display().to_string()));
                }
                tokio::spawn(sock.serve(listener, session.handle(), self.stop.clone()));
                Ok(true)
            }
            Err(e) => {
                tracing::warn!(error = %e, "agent forwarding failed");
                Ok(false)
            }
        }
    }

    async fn data(
        &mut self,
        ch: ChannelId,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        // A forwarding channel's bytes are its stream's (`flow::Credited` reports them).
        let Some(c) = self.channels.get(&ch) else {
            return Ok(());
        };
        let Some(tx) = c.input.clone() else {
            // Nothing runs yet to take it: dropped, as sshd drops it, and its window given back.
            return session.consumed(ch, data.len());
        };
        if !tx.send(Input::Data(Bytes::copy_from_slice(data))).await {
            // The command's input is gone (or the proxy ignored the window it was given).
            tracing::warn!("closing a channel whose command stopped reading its input");
            if let Some(c) = self.channels.remove(&ch) {
                c.pid.kill(nix::sys::signal::Signal::SIGHUP);
            }
            session.close(ch)?;
        }
        Ok(())
    }

    /// Nothing on a node reads what a client sends as extended data (sshd drops it too); on a
    /// session channel its window is given back at once.
    async fn extended_data(
        &mut self,
        ch: ChannelId,
        _code: u32,
        data: &[u8],
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        if self.channels.contains_key(&ch) {
            session.consumed(ch, data.len())?;
        }
        Ok(())
    }

    async fn channel_eof(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(tx) = self.channels.get(&ch).and_then(|c| c.input.clone()) {
            tx.send(Input::Eof).await;
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
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let mut taken = false;
        if let Some(tx) = self.channels.get(&ch).and_then(|c| c.input.clone()) {
            taken = tx.send(Input::Resize { cols, rows }).await;
        }
        answer(ch, taken, session)
    }

    async fn signal(
        &mut self,
        ch: ChannelId,
        sig: Sig,
        session: &mut Session,
    ) -> Result<(), Self::Error> {
        let mut taken = false;
        if let (Some(c), Some(s)) = (self.channels.get(&ch), signal_number(&sig)) {
            c.pid.kill(session_signal(s, self.srv.pam.is_some()));
            taken = true;
        }
        answer(ch, taken, session)
    }

    async fn channel_close(
        &mut self,
        ch: ChannelId,
        _session: &mut Session,
    ) -> Result<(), Self::Error> {
        if let Some(c) = self.channels.remove(&ch) {
            c.pid.kill(nix::sys::signal::Signal::SIGHUP);
        }
        Ok(())
    }
}

impl Conn {
    fn start_reply(
        &mut self,
        ch: ChannelId,
        command: Option<String>,
        direct: Option<Vec<String>>,
        session: &mut Session,
    ) -> Result<(), russh::Error> {
        let already = self.channels.get(&ch).is_some_and(|c| c.input.is_some());
        if already {
            session.channel_failure(ch)?;
            return Ok(());
        }
        match self.start(ch, command, direct, session) {
            Ok(()) => session.channel_success(ch)?,
            Err(e) => {
                tracing::warn!(error = %e, "session could not start");
                refuse(ch, &e, session)?;
            }
        }
        Ok(())
    }
}

/// Answers a channel request (russh sends it only when the client asked for a reply).
fn answer(ch: ChannelId, ok: bool, session: &mut Session) -> Result<(), russh::Error> {
    if ok {
        session.channel_success(ch)
    } else {
        session.channel_failure(ch)
    }
}

/// Ends a session request with `why` on stderr and exit status 1. Accepted first: OpenSSH
/// exits at once on a failed exec request, before printing what the channel said.
fn refuse(ch: ChannelId, why: &str, session: &mut Session) -> Result<(), russh::Error> {
    session.channel_success(ch)?;
    session.extended_data(ch, 1, Bytes::from(format!("sallyport: {why}\r\n")))?;
    session.exit_status_request(ch, 1)?;
    session.eof(ch)?;
    session.close(ch)
}

/// Refuses when `login` (as looked up at authentication) no longer has the same uid and gid:
/// a connection never runs anything as whoever holds that uid now.
fn still_the_same(login: &Login, node: &str) -> Result<(), String> {
    match passwd::lookup(&login.name) {
        Some(now) if now.uid == login.uid && now.gid == login.gid => Ok(()),
        _ => Err(format!(
            "login {} on node {node} changed since this connection authenticated; reconnect",
            login.name
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sallyport_core::sshcert::{self, Transport};
    use std::time::Duration;

    /// A client's KILL for a session under PAM reaches session-exec as the signal it turns
    /// into SIGKILL for the shell (SIGKILL itself would end session-exec and leave the shell
    /// and its PAM session behind); without PAM it is SIGKILL, and other signals pass as they
    /// are.
    #[tokio::test]
    async fn a_kill_for_a_pam_session_is_sent_as_session_execs_own_signal() {
        let run = |pam: bool, sig: nix::sys::signal::Signal| async move {
            let mut child = tokio::process::Command::new("sleep")
                .arg("100")
                .process_group(0)
                .spawn()
                .unwrap_or_else(|e| panic!("{e}"));
            let slot = PidSlot::default();
            slot.set(child.id());
            slot.kill(session_signal(sig, pam));
            let status = child.wait().await.unwrap_or_else(|e| panic!("{e}"));
            status.signal()
        };
        use nix::sys::signal::Signal::{SIGKILL, SIGTERM};
        assert_eq!(
            run(true, SIGKILL).await,
            Some(session_exec::KILL_SHELL as i32)
        );
        assert_eq!(run(false, SIGKILL).await, Some(SIGKILL as i32));
        assert_eq!(run(true, SIGTERM).await, Some(SIGTERM as i32));
    }

    /// A session's pid is forgotten once the process has exited and before it is reaped, so
    /// a later signal or hang-up cannot reach a process that reuses the number.
    #[tokio::test]
    async fn a_sessions_pid_is_forgotten_between_exit_and_reap() {
        let child = tokio::process::Command::new("true")
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id().unwrap_or_else(|| panic!("no pid"));
        let slot = PidSlot::default();
        slot.set(Some(pid));
        assert!(exited(pidfd(pid).unwrap_or_else(|| panic!("no pidfd"))).await);
        // Exited, not yet reaped: the number is still this zombie's.
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        assert!(stat.contains(") Z "), "{stat}");
        let mut child = Proc::Std(child);
        let status = reap(&mut child, &slot)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(status.success());
        assert_eq!(slot.0.lock().map(|p| *p).ok(), Some(None));
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    }

    /// Only the proxy can reach this server (through the tunnel), so `ssh-audit` cannot: what
    /// it would see is checked here instead. It is the list every SSH server here offers.
    #[test]
    fn the_agent_offers_the_shared_server_algorithms() {
        let ca = sshcert::generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let key = sshcert::generate_ed25519().unwrap_or_else(|e| panic!("{e}"));
        let cert = sshcert::issue_host(
            &ca,
            key.public_key(),
            "node-1",
            &["web1".to_string()],
            Duration::from_secs(60),
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let openssh =
            |r: Result<String, russh::keys::ssh_key::Error>| r.unwrap_or_else(|e| panic!("{e}"));
        let id = AgentIdentity {
            node_id: "node-1".into(),
            nodename: "web1".into(),
            cluster_name: "test".into(),
            proxy: String::new(),
            tunnel_addr: String::new(),
            tls_key_pem: String::new(),
            tls_cert_pem: String::new(),
            host_ca_pem: String::new(),
            ssh_host_key: openssh(
                key.to_openssh(russh::keys::ssh_key::LineEnding::LF)
                    .map(|k| k.to_string()),
            ),
            ssh_host_cert: openssh(cert.to_openssh()),
            user_ca_keys: vec![openssh(ca.public_key().to_openssh())],
        };
        let server = NodeServer::new(&id).unwrap_or_else(|e| panic!("{e}"));
        let offered = &server.config.get().preferred;
        let shared = sshcert::server_preferred(Transport::InsideTunnel);
        assert_eq!(offered.kex, shared.kex);
        assert_eq!(offered.cipher, shared.cipher);
        assert_eq!(offered.mac, shared.mac);
        assert_eq!(offered.compression, shared.compression);
        // `none` first: the tunnel already encrypts (ARCHITECTURE's invariant).
        assert_eq!(offered.cipher.first(), Some(&russh::cipher::NONE));
    }
}
