//! What an interactive login is shown before its shell, as sshd shows it: `/etc/motd`
//! (sshd's `PrintMotd`) for a shell with a pty, nothing for a command (even with `-t`) or
//! without a pty, and nothing at all when the login has `~/.hushlogin`. With PAM enabled the
//! PAM stack owns the motd (Debian's `pam_motd`, with sshd's `PrintMotd no`): then only what
//! PAM's modules said is shown, under the same rules, so the motd is never printed twice.

use std::path::Path;

use crate::passwd::Login;

const MOTD: &str = "/etc/motd";

/// Whether a session gets login messages at all: a shell (no command) on a pty, for a login
/// without `~/.hushlogin` (sshd's `check_quietlogin`).
pub fn shown(login: &Login, pty: bool, command: Option<&str>) -> bool {
    pty && command.is_none() && !hushed(login)
}

/// Whether `~/.hushlogin` is a file (not a link) owned by the login. The agent checks as root:
/// following a symlink would tell the login whether a root-only path exists.
fn hushed(login: &Login) -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(login.home.join(".hushlogin"))
        .is_ok_and(|m| m.file_type().is_file() && m.uid() == login.uid)
}

/// `/etc/motd` for a session that is `shown` it (None when there is none or it is empty).
pub fn motd() -> Option<Vec<u8>> {
    std::fs::read(Path::new(MOTD))
        .ok()
        .filter(|m| !m.is_empty())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn login(home: &Path, uid: u32) -> Login {
        Login {
            name: "x".into(),
            uid,
            gid: uid,
            home: home.to_path_buf(),
            shell: "/bin/sh".into(),
        }
    }

    #[test]
    fn hushlogin_counts_only_as_the_logins_own_file_never_through_a_link() {
        use std::os::unix::fs::MetadataExt;
        let dir = std::env::temp_dir().join(format!("sallyport-hush-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::fs::metadata(&dir).unwrap().uid();
        let hush = &dir.join(".hushlogin");
        assert!(shown(&login(&dir, me), true, None));
        std::fs::write(hush, b"").unwrap();
        assert!(!shown(&login(&dir, me), true, None));
        // Someone else's file does not hush this login.
        assert!(shown(&login(&dir, me + 1), true, None));
        // A link to an existing file is no hushlogin: no existence test through it.
        std::fs::remove_file(hush).unwrap();
        let target = &dir.join("target");
        std::fs::write(target, b"").unwrap();
        std::os::unix::fs::symlink(target, hush).unwrap();
        assert!(shown(&login(&dir, me), true, None));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
