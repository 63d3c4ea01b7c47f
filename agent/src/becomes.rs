//! Who a session's process becomes between fork and exec: the login's identity set in sshd's
//! order, its own session (with the terminal as its controlling terminal when it has one), its
//! home, and no descriptor of its parent's. Used by the agent's direct spawn and by
//! `sallyport session-exec` (the PAM path), so both switch identity the same way.

use std::ffi::CString;
use std::os::fd::RawFd;

use crate::passwd::{self, Login};

/// Who a session's process becomes, prepared before the fork: between fork and exec, the
/// child of a threaded process may only make async-signal-safe calls, so nothing there reads
/// `/etc/group` (which `initgroups` would) or allocates.
pub struct Becomes {
    new_session: bool,
    /// Make stdin (a pty's slave) the controlling terminal of the new session.
    controlling_tty: bool,
    /// False only for an agent that is not root running a session as its own user (a
    /// developer's agent): it keeps its groups, as it could not set them.
    switch: bool,
    groups: Vec<nix::libc::gid_t>,
    gid: nix::unistd::Gid,
    uid: nix::unistd::Uid,
    home: CString,
    no_home: Vec<u8>,
}

impl Becomes {
    pub fn new(login: &Login, new_session: bool) -> Result<Self, String> {
        let home = CString::new(login.home.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("login {} has a NUL in its home directory", login.name))?;
        let me = nix::unistd::geteuid();
        Ok(Becomes {
            new_session,
            controlling_tty: false,
            switch: me.is_root() || me.as_raw() != login.uid,
            groups: passwd::groups(login)?.iter().map(|g| g.as_raw()).collect(),
            gid: nix::unistd::Gid::from_raw(login.gid),
            uid: nix::unistd::Uid::from_raw(login.uid),
            home,
            no_home: format!(
                "Could not chdir to home directory {}\n",
                login.home.display()
            )
            .into_bytes(),
        })
    }

    /// A new session whose controlling terminal is stdin (a pty slave), as sshd's child sets
    /// it up; for a parent that did not spawn through pty_process (session-exec).
    pub fn with_controlling_tty(mut self) -> Self {
        self.new_session = true;
        self.controlling_tty = true;
        self
    }

    /// In the child, in sshd's order: no signal blocked, a new session, all the login's groups (what
    /// `initgroups` sets), its gid, its uid; then the home directory entered as the login (so
    /// a home only it may enter works, as with sshd), and every descriptor above stderr closed
    /// at exec. Any failure stops the exec: the session never runs as anyone else.
    pub fn apply(&self) -> std::io::Result<()> {
        // No signal blocked: session-exec blocks the ones it passes on, and a mask is
        // inherited through exec (a shell with SIGHUP blocked would outlive its hang-up).
        unblock_all_signals()?;
        if self.new_session {
            nix::unistd::setsid()?;
        }
        if self.controlling_tty {
            controlling_terminal()?;
        }
        if self.switch {
            switch_identity(&self.groups, self.gid.as_raw(), self.uid.as_raw())?;
        }
        if nix::unistd::chdir(self.home.as_c_str()).is_err() {
            let _ = nix::unistd::write(std::io::stderr(), &self.no_home);
            nix::unistd::chdir(c"/")?;
        }
        cloexec_above_stderr();
        Ok(())
    }
}

/// Starts `sallyport session-exec` as the agent must: in the child before exec, its own
/// session (and process group, so the agent's signals reach it) without a controlling terminal
/// (its shell takes the pty), and nothing of the agent's but stdio and `keep`, the pipe it
/// reads the session from.
pub fn launch(cmd: &mut tokio::process::Command, keep: RawFd) {
    // SAFETY: the closure makes only async-signal-safe calls (setsid, close_range/fcntl) on
    // data copied before the fork.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid()?;
            cloexec_above_stderr();
            clear_cloexec(keep)
        });
    }
}

/// Makes `cmd` become `becomes` between fork and exec (session-exec starting the shell).
pub fn install(cmd: &mut std::process::Command, becomes: Becomes) {
    use std::os::unix::process::CommandExt;
    // SAFETY: `Becomes::apply` makes only async-signal-safe calls on data prepared before the
    // fork.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || becomes.apply());
    }
}

/// The pipe session-exec was started with, by descriptor number (from its argv).
#[allow(unsafe_code)]
pub fn inherited_pipe(fd: RawFd) -> std::io::Result<std::fs::File> {
    use std::os::fd::FromRawFd;
    if fd <= 2 {
        return Err(std::io::Error::other("not a pipe descriptor"));
    }
    nix::fcntl::fcntl(
        // SAFETY: borrowed only for this call, to check that the descriptor is open.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) },
        nix::fcntl::FcntlArg::F_GETFD,
    )?;
    // SAFETY: the descriptor is open (checked above) and nothing else in this process owns
    // it: the agent passed it to this process for this one use, and it is taken once, at
    // start, before anything else opens descriptors.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

#[allow(unsafe_code)]
fn clear_cloexec(fd: RawFd) -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: fcntl(F_SETFD) changes one descriptor's flag; no memory is passed. It is
    // async-signal-safe.
    if unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The login's groups, gid and uid, as raw system calls: this process is a child with a single
/// thread (forked, or cloned sharing the agent's memory), where libc's wrappers would act for
/// the agent's threads (glibc's set*id broadcast walks its thread list, in the shared memory
/// of a cloned child). Checked afterwards: the session never runs as anyone else.
#[allow(unsafe_code)]
fn switch_identity(
    groups: &[nix::libc::gid_t],
    gid: nix::libc::gid_t,
    uid: nix::libc::uid_t,
) -> std::io::Result<()> {
    use nix::libc;
    let check = |r: libc::c_long| {
        if r != 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    // SAFETY: setgroups(2) reads `groups`, an array of gid_t of its length;, setresgid(2), setresuid(2) and the get*id calls pass only integers and
    // that array; all are async-signal-safe system calls.
    unsafe {
        check(libc::syscall(
            libc::SYS_setgroups,
            groups.len(),
            groups.as_ptr(),
        ))?;
        check(libc::syscall(libc::SYS_setresgid, gid, gid, gid))?;
        check(libc::syscall(libc::SYS_setresuid, uid, uid, uid))?;
        let ids = [
            libc::syscall(libc::SYS_getuid),
            libc::syscall(libc::SYS_geteuid),
            libc::syscall(libc::SYS_getgid),
            libc::syscall(libc::SYS_getegid),
        ];
        if ids
            != [
                uid as libc::c_long,
                uid as libc::c_long,
                gid as libc::c_long,
                gid as libc::c_long,
            ]
        {
            return Err(std::io::Error::from_raw_os_error(libc::EPERM));
        }
    }
    Ok(())
}

/// An empty signal mask for this thread, as the raw system call (see [`switch_identity`]).
#[allow(unsafe_code)]
fn unblock_all_signals() -> std::io::Result<()> {
    use nix::libc;
    let none: u64 = 0;
    // SAFETY: rt_sigprocmask(2) reads the kernel's 8-byte signal set from a local.
    let r = unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &none as *const u64,
            std::ptr::null_mut::<u64>(),
            std::mem::size_of::<u64>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// TIOCSCTTY on stdin: the new session's controlling terminal, so the shell gets job control
/// and the hang-up when the pty closes.
#[allow(unsafe_code)]
fn controlling_terminal() -> std::io::Result<()> {
    use nix::libc;
    // SAFETY: ioctl(TIOCSCTTY) with an integer argument; no memory is passed. It is a plain
    // system call, async-signal-safe.
    if unsafe { libc::ioctl(0, libc::TIOCSCTTY, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Marks every descriptor above 2 close-on-exec, so none of the agent's (another session's pty
/// opened while this one forked, a tunnel socket) reaches the login's shell. Marked rather
/// than closed: std reports a failed exec through a descriptor of its own.
#[allow(unsafe_code)]
fn cloexec_above_stderr() {
    use nix::libc;
    // SAFETY: close_range(2) and fcntl(2) only change this process's descriptor flags; no
    // memory is passed. Both are async-signal-safe.
    unsafe {
        if libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        ) != 0
        {
            // Kernels before 5.11 have no close_range.
            let mut lim = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            let max = if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
                // Every descriptor the agent can hold is below its limit (up to the
                // kernel's own ceiling on it, nr_open).
                lim.rlim_cur.min(1 << 20) as libc::c_int
            } else {
                1024
            };
            for fd in 3..max {
                libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            }
        }
    }
}
