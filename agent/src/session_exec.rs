//! `sallyport session-exec`: the process a PAM session runs in, as Teleport's `teleport exec`.
//! pam_limits sets the limits of the process that opens the session, and pam_systemd and
//! others tie the session to it, so PAM cannot run in the multi-threaded agent: the agent
//! starts this (its own executable, hidden subcommand) as root for each session with PAM
//! enabled, with the session's terminal or pipes as stdin, stdout and stderr, and the rest of
//! what it needs as JSON on an inherited pipe (never in argv, which every user can read).
//!
//! Here, single-threaded: `pam_start(service, login)`, the account stack (a denial ends the
//! session with PAM's words), `pam_setcred`, `pam_open_session`, the environment PAM set;
//! then the shell is started as the login (`Becomes`, as the agent does without PAM: its own
//! session, the pty as its controlling terminal), every signal the agent sends is passed on
//! to it, and once it exits the PAM session is closed and this process exits as it did.
//! Without PAM the agent starts the shell itself; nothing here runs.

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};

use crate::becomes::{self, Becomes};
use crate::{motd, pam, passwd};

/// The PAM settings the agent runs sessions with (`ssh_service.pam`).
#[derive(Debug, Clone)]
pub struct PamExec {
    /// The PAM service: `/etc/pam.d/<service>`.
    pub service: String,
    /// This executable, started as `session-exec`.
    pub exe: PathBuf,
}

impl PamExec {
    /// Checks that PAM can run here (see `pam::check`) and finds this executable.
    pub fn new(service: &str) -> Result<PamExec, String> {
        pam::check(service)?;
        let exe = std::env::current_exe()
            .map_err(|e| format!("cannot find the sallyport executable for PAM sessions: {e}"))?;
        check_exe(&exe)?;
        Ok(PamExec {
            service: service.to_string(),
            exe,
        })
    }
}

/// The executable every PAM session starts as root, by path: it must be root's and writable by
/// no one else, in a directory others cannot write (or swap it in), and still be there.
fn check_exe(exe: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let shown = exe.display();
    if exe.to_string_lossy().ends_with(" (deleted)") {
        return Err(format!(
            "ssh_service.pam: the sallyport executable {shown} was replaced or removed since the agent started; restart the agent"
        ));
    }
    let m = std::fs::metadata(exe).map_err(|e| format!("ssh_service.pam: {shown}: {e}"))?;
    if m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(format!(
            "ssh_service.pam: {shown} runs PAM sessions as root, so it must be owned by root and writable by no one else"
        ));
    }
    if let Some(dir) = exe.parent() {
        let d = std::fs::metadata(dir)
            .map_err(|e| format!("ssh_service.pam: {}: {e}", dir.display()))?;
        if d.mode() & 0o002 != 0 {
            return Err(format!(
                "ssh_service.pam: {shown} runs PAM sessions as root, but its directory {} is writable by others",
                dir.display()
            ));
        }
    }
    Ok(())
}

/// What the agent tells session-exec.
#[derive(Debug, Serialize, Deserialize)]
pub struct Spec {
    pub service: String,
    pub nodename: String,
    pub login: String,
    /// `sh -c command`, or the login shell when None.
    pub command: Option<String>,
    /// A file copy's program and arguments, run instead of the shell (never through it).
    #[serde(default)]
    pub argv: Option<Vec<String>>,
    /// The environment the agent built (sshd's); PAM's is added over it, as sshd does.
    pub env: Vec<(String, String)>,
    /// The pty's path when the session has one (stdin is then its slave).
    pub tty: Option<String>,
    /// The user's address (PAM_RHOST).
    pub rhost: Option<String>,
}

/// The most a spec can be: the agent's own limits (a 64 KiB command, 64 variables of 4 KiB)
/// with room to spare.
const MAX_SPEC: u64 = 1 << 20;

/// Starts session-exec for `spec` with `stdin`/`stdout`/`stderr`, from the agent.
pub fn spawn(
    pam: &PamExec,
    spec: &Spec,
    stdin: Stdio,
    stdout: Stdio,
    stderr: Stdio,
) -> Result<tokio::process::Child, String> {
    let json = serde_json::to_vec(spec).map_err(|e| format!("cannot encode the session: {e}"))?;
    let (reader, mut writer) =
        std::io::pipe().map_err(|e| format!("cannot start a PAM session: {e}"))?;
    let fd = reader.as_fd().as_raw_fd();
    let mut cmd = tokio::process::Command::new(&pam.exe);
    cmd.arg("session-exec")
        .arg("--spec-fd")
        .arg(fd.to_string())
        .env_clear()
        .stdin(stdin)
        .stdout(stdout)
        .stderr(stderr);
    becomes::launch(&mut cmd, fd);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", pam.exe.display()))?;
    drop(reader);
    // Written from a thread: a spec larger than the pipe's buffer waits for the reader.
    std::thread::spawn(move || {
        let _ = writer.write_all(&json);
    });
    Ok(child)
}

/// How the agent asks for a client's `KILL` to reach the shell: SIGKILL itself cannot be caught,
/// so sent here it would end this process and leave the shell running with its PAM session
/// never closed. No client request maps to this signal and nothing else sends it here (this
/// process sets no virtual timer).
pub const KILL_SHELL: Signal = Signal::SIGVTALRM;

/// The signals passed on to the shell (and SIGCHLD, to know it ended); blocked here and read
/// with sigwait, so no handler runs. Every signal the agent maps from a client's request is
/// here (ssh.rs `signal_number`), so none of them ends this root process instead of the shell;
/// a client's `KILL` arrives as [`KILL_SHELL`].
fn signals() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGCHLD,
        Signal::SIGABRT,
        Signal::SIGFPE,
        Signal::SIGILL,
        Signal::SIGSEGV,
        Signal::SIGPIPE,
        Signal::SIGHUP,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGTERM,
        Signal::SIGUSR1,
        Signal::SIGUSR2,
        Signal::SIGALRM,
        KILL_SHELL,
    ] {
        set.add(s);
    }
    set
}

/// `sallyport session-exec --spec-fd N`: never returns.
pub fn main(spec_fd: RawFd) -> ! {
    // Before anything else, so a hang-up during PAM's setup is passed on, not lost.
    let _ = signals().thread_block();
    // A root process must never dump core: a client's ABRT/SEGV request would otherwise write
    // a root core file each time (a disk filler). Also keeps other users from ptrace/proc peeks.
    let _ = nix::sys::prctl::set_dumpable(false);
    let outcome = becomes::inherited_pipe(spec_fd)
        .map_err(|e| format!("session-exec: no session on descriptor {spec_fd}: {e}"))
        .and_then(|f| {
            let mut text = Vec::new();
            f.take(MAX_SPEC)
                .read_to_end(&mut text)
                .map_err(|e| format!("session-exec: {e}"))?;
            serde_json::from_slice::<Spec>(&text).map_err(|e| format!("session-exec: {e}"))
        })
        .and_then(|spec| session(&spec));
    match outcome {
        Ok(Ended::Code(c)) => std::process::exit(c),
        Ok(Ended::Signal(sig)) => die_by(sig),
        Err(why) => {
            let _ = std::io::stderr().write_all(format!("sallyport: {why}\n").as_bytes());
            std::process::exit(1)
        }
    }
}

enum Ended {
    Code(i32),
    Signal(Signal),
}

fn session(spec: &Spec) -> Result<Ended, String> {
    let login = passwd::lookup(&spec.login).ok_or_else(|| {
        format!(
            "login {} does not exist on node {}",
            spec.login, spec.nodename
        )
    })?;
    let mut pam = pam::Session::start(
        &spec.service,
        &login.name,
        spec.tty.as_deref(),
        spec.rhost.as_deref(),
    )
    .map_err(|e| format!("PAM (service {}): {e}", spec.service))?;
    let shown = motd::shown(&login, spec.tty.is_some(), spec.command.as_deref());
    if let Err(e) = pam.account() {
        // PAM's own words first (pam_nologin's file, pam_access's reason), then ours.
        let said = pam.messages();
        let mut why = format!(
            "login {} on node {} was refused by PAM's account check (service {}): {e}",
            login.name, spec.nodename, spec.service
        );
        if !said.is_empty() {
            why = format!("{}\nsallyport: {why}", said.join("\n"));
        }
        return Err(why);
    }
    // As sshd after a key login: a failure here is not fatal (nothing was authenticated by PAM).
    let _ = pam.establish_credentials();
    if let Err(e) = pam.open() {
        let said = pam.messages();
        let mut why = format!(
            "cannot open a PAM session for login {} on node {} (service {}): {e}",
            login.name, spec.nodename, spec.service
        );
        if !said.is_empty() {
            why = format!("{}\nsallyport: {why}", said.join("\n"));
        }
        return Err(why);
    }
    let mut env = spec.env.clone();
    for (k, v) in pam.environment() {
        match env.iter_mut().find(|(name, _)| *name == k) {
            Some(e) => e.1 = v,
            None => env.push((k, v)),
        }
    }
    // pam_motd's text and any other module's messages: shown as sshd shows its login
    // messages (an interactive shell, no ~/.hushlogin).
    let said = pam.messages();
    if shown && !said.is_empty() {
        let mut out = std::io::stdout();
        for m in said {
            let _ = out.write_all(m.as_bytes());
            if !m.ends_with('\n') {
                let _ = out.write_all(b"\n");
            }
        }
        let _ = out.flush();
    }
    let mut becomes = Becomes::new(&login, true)?;
    if spec.tty.is_some() {
        becomes = becomes.with_controlling_tty();
    }
    let shell_name = Path::new(&login.shell)
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sh".into());
    let program = spec
        .argv
        .as_ref()
        .and_then(|a| a.first())
        .unwrap_or(&login.shell);
    let mut cmd = std::process::Command::new(program);
    match (&spec.argv, &spec.command) {
        (Some(argv), _) => {
            cmd.args(argv.iter().skip(1));
        }
        (None, Some(c)) => {
            cmd.arg("-c").arg(c);
        }
        (None, None) => {
            use std::os::unix::process::CommandExt;
            cmd.arg0(format!("-{shell_name}"));
        }
    }
    cmd.env_clear().envs(env);
    becomes::install(&mut cmd, becomes);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {program}: {e}"))?;
    let pid = Pid::from_raw(child.id() as i32);
    let set = signals();
    let ended = loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => match nix::sys::wait::waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => break Ended::Code(code),
                Ok(WaitStatus::Signaled(_, sig, _)) => break Ended::Signal(sig),
                Ok(_) => {}
                Err(_) => break Ended::Code(255),
            },
            // The agent's signal (the client's, or a hang-up): to the shell's process group,
            // as the agent would send it without PAM.
            Ok(sig) => {
                let sig = if sig == KILL_SHELL {
                    Signal::SIGKILL
                } else {
                    sig
                };
                if nix::sys::signal::killpg(pid, sig).is_err() {
                    let _ = nix::sys::signal::kill(pid, sig);
                }
            }
            Err(_) => {}
        }
    };
    // Closes the PAM session (pam_close_session, pam_setcred(DELETE), pam_end).
    drop(pam);
    Ok(ended)
}

/// Ends this process by `sig`, as the shell ended, so the agent reports the same exit signal
/// (no core file: this process did nothing wrong).
fn die_by(sig: Signal) -> ! {
    let _ = nix::sys::prctl::set_dumpable(false);
    let mut one = SigSet::empty();
    one.add(sig);
    let _ = one.thread_unblock();
    let _ = nix::sys::signal::raise(sig);
    // A signal whose default is to be ignored (or that Rust ignores, SIGPIPE): as a shell
    // reports it.
    std::process::exit(128 + sig as i32)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Every catchable signal a client may request (ssh.rs `signal_number`) reaches the shell:
    /// none of them may end (or dump the core of) this root process instead.
    #[test]
    fn every_catchable_client_signal_is_forwarded_to_the_shell() {
        let set = signals();
        for s in [
            Signal::SIGHUP,
            Signal::SIGINT,
            Signal::SIGQUIT,
            Signal::SIGTERM,
            Signal::SIGUSR1,
            Signal::SIGALRM,
            Signal::SIGPIPE,
            Signal::SIGABRT,
            Signal::SIGFPE,
            Signal::SIGILL,
            Signal::SIGSEGV,
        ] {
            assert!(set.contains(s), "{s} is not forwarded");
        }
        // KILL cannot be caught: it arrives as another signal, one no client request maps to.
        assert!(set.contains(KILL_SHELL));
        assert!(
            [
                Signal::SIGHUP,
                Signal::SIGINT,
                Signal::SIGQUIT,
                Signal::SIGTERM,
                Signal::SIGUSR1,
                Signal::SIGUSR2,
                Signal::SIGALRM,
                Signal::SIGPIPE,
                Signal::SIGABRT,
                Signal::SIGFPE,
                Signal::SIGILL,
                Signal::SIGSEGV,
                Signal::SIGCHLD,
            ]
            .iter()
            .all(|s| *s != KILL_SHELL)
        );
    }

    #[test]
    fn the_session_exec_binary_must_be_roots_and_unwritable_by_others() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("sallyport-exe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let exe = dir.join("sallyport");
        std::fs::write(&exe, b"").unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let root = nix::unistd::Uid::effective().is_root();
        assert_eq!(check_exe(&exe).is_ok(), root);
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o757)).unwrap();
        let e = check_exe(&exe).unwrap_err();
        assert!(
            e.ends_with("must be owned by root and writable by no one else"),
            "{e}"
        );
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        if root {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
            let e = check_exe(&exe).unwrap_err();
            assert!(e.contains("is writable by others"), "{e}");
        }
        let gone = dir.join("sallyport (deleted)");
        let e = check_exe(&gone).unwrap_err();
        assert!(
            e.ends_with("since the agent started; restart the agent"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
