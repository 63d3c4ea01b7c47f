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
    pty && command.is_none() && !login.home.join(".hushlogin").exists()
}

/// `/etc/motd` for a session that is `shown` it (None when there is none or it is empty).
pub fn motd() -> Option<Vec<u8>> {
    std::fs::read(Path::new(MOTD))
        .ok()
        .filter(|m| !m.is_empty())
}
