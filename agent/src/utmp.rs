//! The login records a session leaves for the system, as sshd writes them for an interactive
//! (pty) session: a utmp entry while it runs (`who`, `w`), wtmp records at its start and end
//! (`last`), and the login's lastlog record (`lastlog`), each with the pty's line and the
//! user's address as the host. Sessions without a pty leave none, as with sshd.
//!
//! glibc's utmpx calls are not thread-safe (one static file position): every use here holds
//! one lock. wtmp is appended with `updwtmpx`, which locks the file against other writers.
//! `/var/log/lastlog` is written only where it exists (Debian 12 and older; newer systems
//! keep lastlog2, which PAM's pam_lastlog2 writes).
#![allow(unsafe_code)]

use std::net::IpAddr;
use std::sync::Mutex;

static UTMP: Mutex<()> = Mutex::new(());

const WTMP: &str = "/var/log/wtmp";
const LASTLOG: &str = "/var/log/lastlog";

/// A pty session began: `tty` is its path (`/dev/pts/3`), `pid` the session's leader.
pub fn login(tty: &str, pid: u32, user: &str, host: Option<IpAddr>) {
    let line = line_of(tty);
    write_record(line, pid, Some((user, host)));
    if let Err(e) = lastlog(line, user, host) {
        tracing::debug!(error = %e, "lastlog not updated");
    }
}

/// The pty session on `tty` ended.
pub fn logout(tty: &str, pid: u32) {
    write_record(line_of(tty), pid, None);
}

/// The line as utmp names it: the path without `/dev/`.
fn line_of(tty: &str) -> &str {
    tty.strip_prefix("/dev/").unwrap_or(tty)
}

/// Copies `s` into a C char array, truncated, NUL-padded (utmp strings need no NUL when full).
fn fill(dst: &mut [std::ffi::c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::repeat(0))) {
        *d = b as std::ffi::c_char;
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
unsafe extern "C" {
    /// glibc's: appends one record to a wtmp file under its lock.
    fn updwtmpx(file: *const std::ffi::c_char, ut: *const nix::libc::utmpx);
}

/// USER_PROCESS with `who` (the user and address) at the start, DEAD_PROCESS at the end, to
/// utmp and wtmp alike, as login(3)/logout(3) and sshd write them.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn write_record(line: &str, pid: u32, who: Option<(&str, Option<IpAddr>)>) {
    use nix::libc;
    // SAFETY: utmpx is plain old data; all-zero is its empty value.
    let mut ut: libc::utmpx = unsafe { std::mem::zeroed() };
    ut.ut_type = if who.is_some() {
        libc::USER_PROCESS
    } else {
        libc::DEAD_PROCESS
    };
    ut.ut_pid = pid as libc::pid_t;
    fill(&mut ut.ut_line, line);
    // The id is the line's last four characters (`ts/3`), as sshd and login(1) make it.
    let id = &line[line.len().saturating_sub(4)..];
    fill(&mut ut.ut_id, id);
    if let Some((user, host)) = who {
        fill(&mut ut.ut_user, user);
        if let Some(ip) = host {
            let ip = ip.to_canonical();
            fill(&mut ut.ut_host, &ip.to_string());
            match ip {
                IpAddr::V4(v4) => ut.ut_addr_v6[0] = i32::from_ne_bytes(v4.octets()),
                IpAddr::V6(v6) => {
                    for (i, c) in v6.octets().chunks_exact(4).enumerate() {
                        ut.ut_addr_v6[i] = i32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                    }
                }
            }
        }
        ut.ut_session = pid as _;
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    ut.ut_tv.tv_sec = now.as_secs() as _;
    ut.ut_tv.tv_usec = now.subsec_micros() as _;
    let _held = UTMP.lock();
    // SAFETY: the utmpx calls are made under UTMP's lock (they share glibc's static state);
    // `ut` is a valid record for each call, and the path a NUL-terminated string.
    unsafe {
        libc::setutxent();
        if libc::pututxline(&ut).is_null() {
            tracing::debug!(error = %std::io::Error::last_os_error(), "utmp not updated");
        }
        libc::endutxent();
        let wtmp = c"/var/log/wtmp";
        debug_assert_eq!(wtmp.to_bytes(), WTMP.as_bytes());
        updwtmpx(wtmp.as_ptr(), &ut);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn write_record(_line: &str, _pid: u32, _who: Option<(&str, Option<IpAddr>)>) {}

/// Writes the login's `struct lastlog` (time, line, host) at offset uid × its size, as
/// login(1) and sshd do; only where the file exists and the layout is known (x86_64 glibc:
/// a 32-bit time, 32 bytes of line, 256 of host).
fn lastlog(line: &str, user: &str, host: Option<IpAddr>) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    if !cfg!(all(target_arch = "x86_64", target_env = "gnu")) {
        return Ok(());
    }
    let Some(login) = crate::passwd::lookup(user) else {
        return Ok(());
    };
    let file = match std::fs::OpenOptions::new().write(true).open(LASTLOG) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    const SIZE: u64 = 4 + 32 + 256;
    let mut rec = [0u8; SIZE as usize];
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    rec[..4].copy_from_slice(&(now as u32).to_ne_bytes());
    for (d, b) in rec[4..36].iter_mut().zip(line.bytes()) {
        *d = b;
    }
    let host = host
        .map(|h| h.to_canonical().to_string())
        .unwrap_or_default();
    for (d, b) in rec[36..].iter_mut().zip(host.bytes()) {
        *d = b;
    }
    file.write_all_at(&rec, u64::from(login.uid) * SIZE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_and_fields_are_as_utmp_writes_them() {
        assert_eq!(line_of("/dev/pts/12"), "pts/12");
        assert_eq!(line_of("pts/1"), "pts/1");
        let c = |b: u8| b as std::ffi::c_char;
        let mut a = [c(1); 4];
        fill(&mut a, "ab");
        assert_eq!(a, [c(b'a'), c(b'b'), 0, 0]);
        fill(&mut a, "abcdef");
        assert_eq!(a, [c(b'a'), c(b'b'), c(b'c'), c(b'd')]);
    }
}
