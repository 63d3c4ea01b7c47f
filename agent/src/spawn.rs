//! Starting a session's process without copying the agent: `clone(CLONE_VM | CLONE_VFORK)`,
//! as glibc's `posix_spawn` and Go's `os/exec` do, with the login's identity switch
//! ([`Becomes`]) between the clone and the exec.
//!
//! `fork` copies the page tables of the whole agent (the all-in-one daemon is hundreds of MB),
//! write-protects every page in both processes, and leaves the agent's worker threads taking a
//! copy-on-write fault for each page they touch until the child has exec'd (with a TLB
//! shoot-down to every core). In `bench/scale.sh` that was a sixth of the daemon's CPU per
//! session. Here the child runs on the agent's memory, on a stack of its own, while the
//! calling thread waits for its exec; it makes only system calls on data prepared before the
//! clone (as between a `fork` and an `exec` in a threaded process), and says why its exec
//! failed through that shared memory.
//!
//! The child is owned through a pidfd (`CLONE_PIDFD`, Linux 5.3): it is waited for without
//! tokio's SIGCHLD reaper, and only this agent ever reaps it. [`supported`] says whether the
//! kernel has what this needs; the agent falls back to std's spawn where it does not.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicI32, Ordering};

use nix::libc;

use crate::becomes::Becomes;

/// What the child execs: every candidate path (the program, or it under each directory of the
/// session's `PATH`), its argv and its whole environment, as C strings made before the clone.
pub struct Program {
    candidates: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

fn c(s: &str) -> std::io::Result<CString> {
    CString::new(s).map_err(|_| std::io::Error::other(format!("{s:?} contains a NUL byte")))
}

impl Program {
    /// `program` as `execvp` finds it with the session's own `PATH` (from `env`); `arg0`
    /// replaces argv[0] (a login shell's `-bash`).
    pub fn new(
        program: &str,
        arg0: Option<&str>,
        args: &[String],
        env: &[(String, String)],
    ) -> std::io::Result<Program> {
        let candidates = if program.contains('/') {
            vec![c(program)?]
        } else {
            let path = env
                .iter()
                .rev()
                .find(|(k, _)| k == "PATH")
                .map_or("/usr/local/bin:/usr/bin:/bin", |(_, v)| v.as_str());
            path.split(':')
                .map(|d| if d.is_empty() { "." } else { d })
                .map(|d| c(&format!("{d}/{program}")))
                .collect::<std::io::Result<Vec<_>>>()?
        };
        let mut argv = vec![c(arg0.unwrap_or(program))?];
        for a in args {
            argv.push(c(a)?);
        }
        let envp = env
            .iter()
            .map(|(k, v)| c(&format!("{k}={v}")))
            .collect::<std::io::Result<Vec<_>>>()?;
        Ok(Program {
            candidates,
            argv,
            envp,
        })
    }
}

/// Whether this kernel can spawn this way (`CLONE_PIDFD`, 5.2; pidfd_open, probed here once,
/// came with 5.3).
pub fn supported() -> bool {
    static SUPPORTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SUPPORTED.get_or_init(|| pidfd(std::process::id()).is_some())
}

/// A pidfd for process `pid`, or None where the kernel has none.
pub fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open(2) takes a pid and flags and returns a new descriptor or -1; no
    // memory is passed.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a descriptor just returned by pidfd_open, owned by nothing else.
    #[allow(unsafe_code)]
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as RawFd) })
}

/// Waits until the process of pidfd `fd` (this agent's child) has exited, without reaping
/// it: the pidfd turns readable. False if it could not wait.
pub async fn exited(fd: OwnedFd) -> bool {
    // SAFETY: the AsyncFd owns the OwnedFd, which stays open, the same descriptor, until the
    // AsyncFd is dropped.
    #[allow(unsafe_code)]
    let registered = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE)
    };
    match registered {
        Ok(fd) => fd.readable().await.is_ok(),
        Err(_) => false,
    }
}

/// A session's process started by [`spawn`]: its pid, and the pidfd it is waited through.
pub struct Spawned {
    pid: u32,
    pidfd: Option<OwnedFd>,
    reaped: bool,
    kill_on_drop: bool,
}

/// What the child reads, and where it says why it failed (an errno; 0 until then).
struct ChildArgs<'a> {
    program: &'a Program,
    argv: Vec<*const libc::c_char>,
    /// Per candidate, `/bin/sh candidate args...`: how execvp runs a file without `#!`.
    scripts: Vec<Vec<*const libc::c_char>>,
    envp: Vec<*const libc::c_char>,
    stdio: [RawFd; 3],
    becomes: &'a Becomes,
    error: AtomicI32,
}

const STACK: usize = 128 * 1024;

/// The children's stacks, kept for the next child. A fresh one each time cost a page fault and
/// a page clear for every 4 KiB the allocator touched, on every session (`clear_page_erms`
/// under this function was 2.4 % of the daemon's samples at 150 sessions/s). Left
/// uninitialized: a child writes its frames before it reads them.
struct Stacks;

static STACKS: std::sync::Mutex<Vec<Vec<u8>>> = std::sync::Mutex::new(Vec::new());

/// Stacks kept at most: as many as children start at once, in the ordinary run of things.
const STACKS_KEPT: usize = 16;

impl Stacks {
    fn take() -> Vec<u8> {
        STACKS
            .lock()
            .ok()
            .and_then(|mut kept| kept.pop())
            .unwrap_or_else(|| Vec::with_capacity(STACK))
    }

    /// `stack`'s child has exec'd or exited (`CLONE_VFORK`): nothing runs on it any more.
    fn give_back(stack: Vec<u8>) {
        if let Ok(mut kept) = STACKS.lock()
            && kept.len() < STACKS_KEPT
        {
            kept.push(stack);
        }
    }
}

/// The shell execvp runs a file without `#!` with.
const SH: &std::ffi::CStr = c"/bin/sh";

/// Starts `program` with `stdio` as its descriptors 0, 1 and 2, becoming `becomes` first.
/// Returns once the child has exec'd, or with why it could not.
pub fn spawn(
    program: &Program,
    stdio: [RawFd; 3],
    becomes: &Becomes,
    kill_on_drop: bool,
) -> std::io::Result<Spawned> {
    // The child moves each descriptor into place with dup2 in order: one already among 0-2
    // in another place could be overwritten before it is moved (std's spawn is used then).
    if stdio
        .iter()
        .enumerate()
        .any(|(i, &fd)| fd <= 2 && fd != i as RawFd)
    {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "a session descriptor is among 0-2",
        ));
    }
    let argv = pointers(&[], &program.argv);
    let envp = pointers(&[], &program.envp);
    let scripts = program
        .candidates
        .iter()
        .map(|path| pointers(&[SH.as_ptr(), path.as_ptr()], &program.argv[1..]))
        .collect();
    let args = ChildArgs {
        program,
        argv,
        scripts,
        envp,
        stdio,
        becomes,
        error: AtomicI32::new(0),
    };
    let mut stack = Stacks::take();
    let mut pidfd: libc::c_int = -1;
    // SAFETY: all signals are blocked in this thread across the clone, so no handler of the
    // agent's runs in the child on the shared memory before `child` resets them; the child
    // runs `child` on `stack` (alive until this returns: CLONE_VFORK suspends this thread
    // until the child exec'd or exited) and only reads `args` apart from its atomic.
    #[allow(unsafe_code)]
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        let top = stack.as_mut_ptr().add(STACK);
        let top = top.sub(top as usize % 16);
        let pid = libc::clone(
            child,
            top.cast(),
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (&args as *const ChildArgs<'_>).cast_mut().cast(),
            &mut pidfd as *mut libc::c_int,
        );
        let e = std::io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(e);
        }
        pid
    };
    Stacks::give_back(stack);
    // SAFETY: CLONE_PIDFD wrote a new descriptor here, owned by nothing else.
    #[allow(unsafe_code)]
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    let mut spawned = Spawned {
        pid: pid as u32,
        pidfd,
        reaped: false,
        kill_on_drop: false,
    };
    let error = args.error.load(Ordering::Acquire);
    if error != 0 {
        // The child exited without exec'ing: reap it (at once) and say why.
        let _ = spawned.reap_now(0);
        return Err(std::io::Error::from_raw_os_error(error));
    }
    spawned.kill_on_drop = kill_on_drop;
    Ok(spawned)
}

/// `first`, then `strings`, as the NULL-terminated array of C strings execve takes.
fn pointers(first: &[*const libc::c_char], strings: &[CString]) -> Vec<*const libc::c_char> {
    first
        .iter()
        .copied()
        .chain(strings.iter().map(|s| s.as_ptr()))
        .chain(std::iter::once(std::ptr::null()))
        .collect()
}

/// The child: signal handlers back to their defaults, stdio in place, the identity switched,
/// then exec. Only system calls, on what `arg` points to; any failure ends it with the errno
/// left for the parent.
#[allow(unsafe_code)]
extern "C" fn child(arg: *mut libc::c_void) -> libc::c_int {
    // SAFETY: `arg` is the parent's `ChildArgs`, alive until the parent resumes (CLONE_VFORK).
    let a = unsafe { &*(arg as *const ChildArgs<'_>) };
    let fail = |errno: i32| -> libc::c_int {
        a.error.store(errno.max(1), Ordering::Release);
        // SAFETY: _exit(2) ends this child without running anything of the parent's.
        unsafe { libc::_exit(127) }
    };
    // SAFETY (the block): sigaction, dup2, fcntl and execve are system calls on memory this
    // child owns (its stack) or only reads (`a`); all are async-signal-safe.
    unsafe {
        // The agent's handlers (tokio's) must not run here, and a session starts with every
        // signal at its default, as sshd's children do: handled ones (an exec would reset
        // them anyway) and ignored ones, which an exec keeps (Rust ignores SIGPIPE, which
        // would turn `yes | head` into "Broken pipe" errors; std's spawn resets it too).
        // The raw system call, for every signal the kernel has (libc's wrapper refuses the
        // two it keeps for itself, 32 and 33, which may still be inherited ignored).
        let dfl = KernelSigaction::default();
        for sig in 1..=64 {
            let mut old = KernelSigaction::default();
            if rt_sigaction(sig, None, Some(&mut old)) == 0 && old.handler != libc::SIG_DFL {
                rt_sigaction(sig, Some(&dfl), None);
            }
        }
        for (target, &fd) in a.stdio.iter().enumerate() {
            let target = target as RawFd;
            let r = if fd == target {
                libc::fcntl(fd, libc::F_SETFD, 0)
            } else {
                libc::dup2(fd, target)
            };
            if r < 0 {
                return fail(*libc::__errno_location());
            }
        }
    }
    // No signal blocked any more from here (`apply` clears the mask first).
    if let Err(e) = a.becomes.apply() {
        return fail(e.raw_os_error().unwrap_or(libc::EPERM));
    }
    let mut last = libc::ENOENT;
    for (path, script) in a.program.candidates.iter().zip(&a.scripts) {
        // SAFETY: NUL-terminated strings and NULL-terminated arrays of them, made before the
        // clone.
        unsafe {
            libc::execve(path.as_ptr(), a.argv.as_ptr(), a.envp.as_ptr());
            let mut e = *libc::__errno_location();
            if e == libc::ENOEXEC {
                // As execvp: a file the kernel cannot run (a script without `#!`) is run by
                // the shell.
                libc::execve(SH.as_ptr(), script.as_ptr(), a.envp.as_ptr());
                e = *libc::__errno_location();
            }
            // As execvp: a candidate that is not there (or not a directory) lets the next
            // one try; a permission problem is remembered over "not found".
            if e != libc::ENOENT && e != libc::ENOTDIR {
                last = e;
                if e != libc::EACCES {
                    break;
                }
            }
        }
    }
    fail(last)
}

/// The kernel's `struct sigaction` on x86-64 and aarch64 (handler, flags, restorer, mask).
#[repr(C)]
#[derive(Default)]
struct KernelSigaction {
    handler: libc::sighandler_t,
    flags: libc::c_ulong,
    restorer: usize,
    mask: u64,
}

/// rt_sigaction(2) as the raw system call: 0, or -1.
#[allow(unsafe_code)]
fn rt_sigaction(
    sig: libc::c_int,
    new: Option<&KernelSigaction>,
    old: Option<&mut KernelSigaction>,
) -> libc::c_long {
    let new = new.map_or(std::ptr::null(), |n| n as *const KernelSigaction);
    let old = old.map_or(std::ptr::null_mut(), |o| o as *mut KernelSigaction);
    // SAFETY: the kernel reads `new` and writes `old`, each null or a live KernelSigaction of
    // the layout it expects, with an 8-byte signal set.
    unsafe { libc::syscall(libc::SYS_rt_sigaction, sig, new, old, 8usize) }
}

impl Spawned {
    pub fn id(&self) -> u32 {
        self.pid
    }

    /// Waits until the process exits, calls `on_exit` (it is then a zombie: its pid is still
    /// taken), and reaps it.
    pub async fn wait(
        &mut self,
        on_exit: impl FnOnce(),
    ) -> std::io::Result<std::process::ExitStatus> {
        if let Some(fd) = self.pidfd.as_ref().and_then(|f| f.try_clone().ok()) {
            exited(fd).await;
        }
        on_exit();
        let status = match self.reap_now(libc::WNOHANG)? {
            Some(s) => s,
            // No pidfd to wait on (or a wake-up before the exit): wait off the runtime.
            None => {
                let pid = self.pid;
                let s = tokio::task::spawn_blocking(move || waitpid(pid, 0))
                    .await
                    .map_err(std::io::Error::other)??;
                self.reaped = true;
                s
            }
        };
        Ok(status)
    }

    /// Reaps the process if it has exited (`flags` 0: waits for it).
    fn reap_now(
        &mut self,
        flags: libc::c_int,
    ) -> std::io::Result<Option<std::process::ExitStatus>> {
        let status = waitpid_flags(self.pid, flags)?;
        if status.is_some() {
            self.reaped = true;
        }
        Ok(status)
    }
}

fn waitpid(pid: u32, flags: libc::c_int) -> std::io::Result<std::process::ExitStatus> {
    waitpid_flags(pid, flags)?.ok_or_else(|| std::io::Error::other("the process has not exited"))
}

fn waitpid_flags(
    pid: u32,
    flags: libc::c_int,
) -> std::io::Result<Option<std::process::ExitStatus>> {
    loop {
        let mut status: libc::c_int = 0;
        // SAFETY: waitpid(2) writes the status into a local.
        #[allow(unsafe_code)]
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, flags) };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        return Ok((r != 0).then(|| std::process::ExitStatus::from_raw(status)));
    }
}

impl Drop for Spawned {
    /// A process nobody waited for is killed if asked (a command's, as `kill_on_drop`), and
    /// reaped whenever it exits, never left a zombie.
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        if self.kill_on_drop {
            // SAFETY: kill(2) on our own, not yet reaped, child: its pid cannot be reused.
            #[allow(unsafe_code)]
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
            }
        }
        if let Ok(Some(_)) = self.reap_now(libc::WNOHANG) {
            return;
        }
        let pid = self.pid;
        let pidfd = self.pidfd.take();
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Some(fd) = pidfd {
                    exited(fd).await;
                }
                let _ = tokio::task::spawn_blocking(move || waitpid_flags(pid, 0)).await;
            });
        }
    }
}

/// Pipes for a command's stdin, stdout and stderr: the child's ends (blocking, for its
/// descriptors 0 to 2) and the agent's (non-blocking, for tokio).
pub struct Pipes {
    pub child: [OwnedFd; 3],
    pub stdin: tokio::net::unix::pipe::Sender,
    pub stdout: tokio::net::unix::pipe::Receiver,
    pub stderr: tokio::net::unix::pipe::Receiver,
}

pub fn pipes() -> std::io::Result<Pipes> {
    let pipe = || -> std::io::Result<(OwnedFd, OwnedFd)> {
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)
    };
    let (in_r, in_w) = pipe()?;
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    Ok(Pipes {
        child: [in_r, out_w, err_w],
        stdin: tokio::net::unix::pipe::Sender::from_owned_fd(in_w)?,
        stdout: tokio::net::unix::pipe::Receiver::from_owned_fd(out_r)?,
        stderr: tokio::net::unix::pipe::Receiver::from_owned_fd(err_r)?,
    })
}

impl Pipes {
    pub fn raw(&self) -> [RawFd; 3] {
        [
            self.child[0].as_raw_fd(),
            self.child[1].as_raw_fd(),
            self.child[2].as_raw_fd(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn login(name: &str) -> crate::passwd::Login {
        crate::passwd::lookup(name).unwrap_or_else(|| panic!("no login {name}"))
    }

    async fn run(
        name: &str,
        program: &str,
        args: &[&str],
        input: &[u8],
    ) -> (std::process::ExitStatus, String, String) {
        let l = login(name);
        let becomes = Becomes::new(&l, true).unwrap_or_else(|e| panic!("{e}"));
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        let p = Program::new(program, None, &args, &env).unwrap_or_else(|e| panic!("{e}"));
        let pipes = pipes().unwrap_or_else(|e| panic!("{e}"));
        let mut child = spawn(&p, pipes.raw(), &becomes, true).unwrap_or_else(|e| panic!("{e}"));
        let Pipes {
            child: ends,
            mut stdin,
            mut stdout,
            mut stderr,
        } = pipes;
        drop(ends);
        stdin
            .write_all(input)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        drop(stdin);
        let (mut out, mut err) = (String::new(), String::new());
        let _ = stdout.read_to_string(&mut out).await;
        let _ = stderr.read_to_string(&mut err).await;
        let mut seen = false;
        let status = child
            .wait(|| seen = true)
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(seen, "told of the exit before the reap");
        (status, out, err)
    }

    #[tokio::test]
    async fn a_command_runs_as_the_login_with_its_groups_stdio_and_exit_status() {
        if !supported() || !nix::unistd::geteuid().is_root() {
            return;
        }
        let (status, out, _) = run("nobody", "sh", &["-c", "id -u; id -G; pwd; exit 3"], b"").await;
        assert_eq!(status.code(), Some(3));
        let l = login("nobody");
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some(l.uid.to_string().as_str()));
        let groups: Vec<String> = crate::passwd::groups(&l)
            .unwrap_or_else(|e| panic!("{e}"))
            .iter()
            .map(|g| g.to_string())
            .collect();
        let mut got: Vec<&str> = lines.next().unwrap_or("").split(' ').collect();
        got.sort();
        let mut want: Vec<&str> = groups.iter().map(String::as_str).collect();
        want.sort();
        want.dedup();
        got.dedup();
        assert_eq!(got, want, "exactly the login's groups, none of the agent's");
        // Its home, or / when it cannot enter it (as sshd).
        let home = l.home.display().to_string();
        let pwd = lines.next().unwrap_or("");
        assert!(pwd == home || pwd == "/", "{pwd}");
        // stdin reaches it, stdout and stderr come back apart.
        let (status, out, err) = run("root", "sh", &["-c", "cat; echo oops >&2"], b"typed").await;
        assert!(status.success());
        assert_eq!(out, "typed");
        assert_eq!(err, "oops\n");
        // A signal is its status.
        let (status, _, _) = run("root", "sh", &["-c", "kill -TERM $$"], b"").await;
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        // Nothing blocked or ignored (the agent ignores SIGPIPE): `yes | head` just ends.
        let (status, out, _) = run(
            "root",
            "sh",
            &[
                "-c",
                "grep -E '^Sig(Blk|Ign)' /proc/self/status; yes | head -1",
            ],
            b"",
        )
        .await;
        assert!(status.success());
        assert_eq!(
            out,
            "SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\ny\n"
        );
    }

    #[tokio::test]
    async fn a_script_without_a_shebang_runs_through_the_shell_as_execvp_has_it() {
        if !supported() {
            return;
        }
        let dir = std::env::temp_dir().join(format!("spawn-script-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let script = dir.join("plain-script");
        std::fs::write(&script, "echo from-sh \"$1\"\n").unwrap_or_else(|e| panic!("{e}"));
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755))
            .unwrap_or_else(|e| panic!("{e}"));
        let path = script.display().to_string();
        let (status, out, _) = run("root", &path, &["arg1"], b"").await;
        assert!(status.success());
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(out, "from-sh arg1\n");
    }

    #[tokio::test]
    async fn a_program_that_cannot_run_is_an_error_and_no_process_is_left() {
        if !supported() {
            return;
        }
        let l = crate::passwd::lookup(
            &nix::unistd::User::from_uid(nix::unistd::geteuid())
                .ok()
                .flatten()
                .map(|u| u.name)
                .unwrap_or_else(|| "root".into()),
        )
        .unwrap_or_else(|| panic!("no login for this user"));
        let becomes = Becomes::new(&l, true).unwrap_or_else(|e| panic!("{e}"));
        let env = vec![("PATH".to_string(), "/nonexistent:/also-not".to_string())];
        for (program, kind) in [
            ("no-such-program-anywhere", std::io::ErrorKind::NotFound),
            ("/no/such/program", std::io::ErrorKind::NotFound),
        ] {
            let p = Program::new(program, None, &[], &env).unwrap_or_else(|e| panic!("{e}"));
            let pipes = pipes().unwrap_or_else(|e| panic!("{e}"));
            let r = spawn(&p, pipes.raw(), &becomes, true);
            assert_eq!(r.err().map(|e| e.kind()), Some(kind), "{program}");
        }
        // The failed children were reaped: none is left as our zombie.
        let me = std::process::id().to_string();
        let zombies: Vec<String> = std::fs::read_dir("/proc")
            .map(|d| d.flatten().collect::<Vec<_>>())
            .unwrap_or_default()
            .iter()
            .filter_map(|e| std::fs::read_to_string(e.path().join("stat")).ok())
            .filter(|stat| {
                let f: Vec<&str> = stat
                    .rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .collect();
                f.first() == Some(&"Z") && f.get(1) == Some(&me.as_str())
            })
            .collect();
        assert!(zombies.is_empty(), "zombies of ours: {zombies:?}");
        // A NUL in an argument is refused before anything starts.
        assert!(Program::new("sh", None, &["a\0b".to_string()], &env).is_err());
    }

    #[tokio::test]
    async fn a_command_dropped_unwaited_is_killed_and_reaped() {
        if !supported() {
            return;
        }
        let l = login("root");
        let becomes = Becomes::new(&l, true).unwrap_or_else(|e| panic!("{e}"));
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        let p = Program::new("sleep", None, &["30".to_string()], &env)
            .unwrap_or_else(|e| panic!("{e}"));
        let pipes = pipes().unwrap_or_else(|e| panic!("{e}"));
        let child = spawn(&p, pipes.raw(), &becomes, true).unwrap_or_else(|e| panic!("{e}"));
        let pid = child.id();
        drop(child);
        let gone = async {
            while std::path::Path::new(&format!("/proc/{pid}")).exists() {
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(10), gone)
            .await
            .unwrap_or_else(|_| panic!("process {pid} still there"));
    }
}
