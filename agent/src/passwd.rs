//! The login a session runs as, found and judged the way sshd does: the passwd entry through
//! the system's name service (`getpwnam_r`, so LDAP/SSSD logins work as they do for sshd),
//! every group the login is in (`getgrouplist`, what `initgroups` sets), whether the account
//! may log in at all (account expiry in `/etc/shadow`, a usable shell), and the `PATH`
//! `/etc/login.defs` gives it. It never answers with another user than the one asked for.

use std::ffi::CString;
use std::path::{Path, PathBuf};

use nix::unistd::{Gid, User};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: PathBuf,
    pub shell: String,
}

/// The login called `name`, or None when the host has no such login (or its name service
/// cannot say).
pub fn lookup(name: &str) -> Option<Login> {
    let user = User::from_name(name).ok()??;
    // The name service may match case-insensitively or by alias; only the exact login counts.
    if user.name != name {
        return None;
    }
    let shell = user.shell.to_string_lossy().into_owned();
    Some(Login {
        name: user.name,
        uid: user.uid.as_raw(),
        gid: user.gid.as_raw(),
        home: user.dir,
        // An empty shell field means /bin/sh, to login(1) and sshd alike.
        shell: if shell.is_empty() {
            "/bin/sh".into()
        } else {
            shell
        },
    })
}

/// Every group `login` is in, its primary group first: what `initgroups` would set. Read
/// before the fork, since the name service (files, LDAP) is not safe to call in the child of a
/// threaded process.
pub fn groups(login: &Login) -> Result<Vec<Gid>, String> {
    let name = CString::new(login.name.as_str())
        .map_err(|_| format!("login {:?} has a NUL in its name", login.name))?;
    nix::unistd::getgrouplist(&name, Gid::from_raw(login.gid))
        .map_err(|e| format!("cannot read the groups of login {}: {e}", login.name))
}

/// Why `login` may not log in on this host, as sshd refuses it, or None when it may. The
/// reason reads after "login NAME on node NODE ".
///
/// A password locked with `!` (`passwd -l`, `usermod -L`, and every login `useradd` makes
/// without a password) is not a refusal: it locks the password, not the account, and the
/// distributions' sshd (`UsePAM yes`) lets such a login in with a key or certificate, as
/// `usermod(8)` says ("to lock the account, not only access with a password, also set
/// EXPIRE_DATE to 1"). An expired account is refused, as sshd and pam_unix refuse it.
pub fn unavailable(login: &Login) -> Option<String> {
    if expired(&login.name) {
        return Some(
            "has expired (its account expiry date in /etc/shadow has passed); ask the node's \
             administrator"
                .into(),
        );
    }
    shell_refusal(&login.shell, std::fs::metadata(&login.shell).ok().as_ref())
}

/// Whether the account `name` has expired (`usermod -e`, `chage -E`): sshd refuses it
/// everything, forwarding included.
pub fn expired(name: &str) -> bool {
    std::fs::read_to_string("/etc/shadow")
        .ok()
        .and_then(|shadow| account_expiry(&shadow, name))
        .is_some_and(|day| days_since_epoch() >= day)
}

/// sshd refuses a login whose shell does not exist or is not an executable file; a shell that
/// exists to say no (`nologin`, `false`) is refused here with a message, rather than run for
/// its own (`nologin`'s "This account is currently not available.", or nothing from `false`).
fn shell_refusal(shell: &str, meta: Option<&std::fs::Metadata>) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    let name = Path::new(shell).file_name().and_then(|n| n.to_str());
    if matches!(name, Some("nologin" | "false")) {
        return Some(format!("is not available: its shell is {shell}"));
    }
    match meta {
        None => Some(format!("cannot log in: its shell {shell} does not exist")),
        Some(m) if !m.is_file() || m.permissions().mode() & 0o111 == 0 => Some(format!(
            "cannot log in: its shell {shell} is not an executable file"
        )),
        Some(_) => None,
    }
}

/// The account expiry day (days since 1970-01-01) of `name` in shadow(5) text, if it has one.
fn account_expiry(shadow: &str, name: &str) -> Option<i64> {
    shadow.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 8 || f[0] != name {
            return None;
        }
        f[7].trim().parse::<i64>().ok().filter(|d| *d >= 0)
    })
}

fn days_since_epoch() -> i64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    i64::try_from(secs / 86_400).unwrap_or(i64::MAX)
}

/// sshd's compiled-in PATHs on Debian, used when `/etc/login.defs` sets none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin:/usr/games";
const DEFAULT_SUPATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The `PATH` a login gets: `ENV_SUPATH` (uid 0) or `ENV_PATH` from `/etc/login.defs`, as
/// login(1) and su(1) set it, else sshd's default.
pub fn path_for(login: &Login) -> String {
    let defs = std::fs::read_to_string("/etc/login.defs").unwrap_or_default();
    login_defs_path(&defs, login.uid == 0).unwrap_or_else(|| {
        if login.uid == 0 {
            DEFAULT_SUPATH
        } else {
            DEFAULT_PATH
        }
        .into()
    })
}

/// `ENV_PATH`/`ENV_SUPATH` from login.defs(5) text; the value may be written `PATH=...` or
/// bare, as login(1) accepts both.
fn login_defs_path(text: &str, superuser: bool) -> Option<String> {
    let key = if superuser { "ENV_SUPATH" } else { "ENV_PATH" };
    let value = login_defs_value(text, key)?;
    let value = value.strip_prefix("PATH=").unwrap_or(value);
    (!value.is_empty()).then(|| value.to_string())
}

/// The value of `key` in login.defs(5) text: the word after it on its line.
fn login_defs_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some(key)).then(|| words.next()).flatten()
    })
}

/// `UID_MAX` from `/etc/login.defs`, as useradd(8) reads it (60000 when unset).
pub fn uid_max() -> u32 {
    let defs = std::fs::read_to_string("/etc/login.defs").unwrap_or_default();
    login_defs_number(&defs, "UID_MAX").unwrap_or(60_000)
}

/// A numeric setting from login.defs(5) text.
fn login_defs_number(text: &str, key: &str) -> Option<u32> {
    login_defs_value(text, key)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_numbers_from_login_defs() {
        let defs = "# UID_MAX 1\nUID_MIN\t 1000\nUID_MAX 70000\nBAD_ONE x\n";
        assert_eq!(login_defs_number(defs, "UID_MAX"), Some(70_000));
        assert_eq!(login_defs_number(defs, "UID_MIN"), Some(1000));
        assert_eq!(login_defs_number(defs, "BAD_ONE"), None);
        assert_eq!(login_defs_number(defs, "GID_MAX"), None);
    }

    #[test]
    fn finds_logins_by_exact_name() {
        let root = lookup("root").map(|l| (l.uid, l.gid, l.home));
        assert_eq!(root, Some((0, 0, PathBuf::from("/root"))));
        assert!(lookup("no-such-login-here").is_none());
        assert!(lookup("ro").is_none());
    }

    #[test]
    fn reads_the_account_expiry() {
        let shadow = "root:*:20228:0:99999:7:::\n\
                      gone:!:20000:0:99999:7::1:\n\
                      later:$6$x:20000:0:99999:7::99999:\n\
                      short:x\n";
        for (name, want) in [
            ("root", None),
            ("gone", Some(1)),
            ("later", Some(99_999)),
            ("short", None),
            ("nobody-here", None),
        ] {
            assert_eq!(account_expiry(shadow, name), want, "{name}");
        }
    }

    #[test]
    fn reads_login_defs_paths() {
        let defs = "# ENV_PATH commented\nENV_SUPATH\tPATH=/sbin:/bin\nENV_PATH /usr/bin:/bin\n";
        assert_eq!(login_defs_path(defs, true).as_deref(), Some("/sbin:/bin"));
        assert_eq!(
            login_defs_path(defs, false).as_deref(),
            Some("/usr/bin:/bin")
        );
        assert_eq!(login_defs_path("ENV_PATH\n", false), None);
        assert_eq!(login_defs_path("", true), None);
    }

    #[test]
    fn refuses_shells_sshd_would_not_run() {
        let meta = |p: &str| std::fs::metadata(p).ok();
        for (shell, refused) in [
            ("/bin/sh", None),
            (
                "/usr/sbin/nologin",
                Some("is not available: its shell is /usr/sbin/nologin"),
            ),
            (
                "/bin/false",
                Some("is not available: its shell is /bin/false"),
            ),
            (
                "/no/such/shell",
                Some("its shell /no/such/shell does not exist"),
            ),
            ("/etc/passwd", Some("is not an executable file")),
            ("/tmp", Some("is not an executable file")),
        ] {
            let got = shell_refusal(shell, meta(shell).as_ref());
            match refused {
                None => assert_eq!(got, None, "{shell}"),
                Some(w) => assert!(
                    got.as_deref().is_some_and(|g| g.contains(w)),
                    "{shell}: {got:?}"
                ),
            }
        }
    }
}
