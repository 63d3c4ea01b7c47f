//! Host users on demand (Teleport's host user creation): when auth's per-session certificate
//! grants it (`role::HostUser`, from the roles' `create_host_user_mode`, `host_groups` and
//! `host_sudoers`), a login that does not exist on this node is created as the session opens:
//! home from `/etc/skel`, `/bin/bash`, the granted groups (created when missing), and a sudoers
//! drop-in in `/etc/sudoers.d/` that `visudo -c` passed before it was installed. Under
//! `insecure-drop` the login is removed (`userdel -r`, and its drop-in) when its last session on
//! this node ends.
//!
//! Architecture invariant: this module never modifies or removes a login it did not create.
//! Every login it creates is a member of `sallyport-managed`, and that membership is checked
//! before any removal; a login that already exists is left exactly as it is (no groups, no
//! sudoers), whatever the roles say. A sudoers drop-in is installed whole or not at all: written
//! 0440 under a name sudo ignores (it has a `.`), checked with `visudo -c -f`, then renamed.

use std::collections::HashMap;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use sallyport_core::role::{HostUser, HostUserMode, valid_host_name};

use crate::passwd::Login;

/// The group every login this agent created is in: its mark, checked before any removal.
pub const MANAGED_GROUP: &str = "sallyport-managed";

const SUDOERS_DIR: &str = "/etc/sudoers.d";

/// Serializes creation and removal on this node: two sessions for one new login must not both
/// run `useradd`, and a removal must not race a session that is just reusing the login.
static ADMIN: Mutex<()> = Mutex::new(());

/// The highest uid this agent has created: useradd is told to start above it, so a dropped
/// login's uid is never handed to the next new login (a file, cron job or connection left with
/// that uid would become the new login's). Kept in the data dir ([`keep_state_in`]) so that a
/// restart does not forget it.
static UID_HIGH_WATER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Where [`UID_HIGH_WATER`] is kept: `<data dir>/host-users.json`.
static STATE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// The file in the agent's data dir that keeps what must outlive the process.
pub const STATE_FILE: &str = "host-users.json";

#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct State {
    uid_high_water: u32,
}

/// Reads what an earlier run of this agent left in `dir` (the uid high-water mark) and keeps it
/// there from now on. A file that cannot be read is an error: starting without it could hand
/// a dropped login's uid to a new one.
pub fn keep_state_in(dir: &std::path::Path) -> Result<(), String> {
    let path = dir.join(STATE_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => {
            let state: State = serde_json::from_slice(&bytes)
                .map_err(|e| format!("{} is unreadable: {e}", path.display()))?;
            UID_HIGH_WATER.fetch_max(state.uid_high_water, std::sync::atomic::Ordering::SeqCst);
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    }
    let _ = STATE.set(path);
    Ok(())
}

/// Writes the high-water mark (atomically, 0600) where [`keep_state_in`] said.
fn save_state() -> Result<(), String> {
    let Some(path) = STATE.get() else {
        return Ok(());
    };
    let state = State {
        uid_high_water: UID_HIGH_WATER.load(std::sync::atomic::Ordering::SeqCst),
    };
    let text = serde_json::to_vec(&state).map_err(|e| e.to_string())?;
    sallyport_core::files::replace_private(path, &text)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Live sessions of each login this agent created under `insecure-drop`.
static DROPS: Mutex<Option<HashMap<String, usize>>> = Mutex::new(None);

/// What was created, for the audit log (`host_user.create`).
#[derive(Debug, Clone)]
pub struct Created {
    pub login: String,
    pub mode: HostUserMode,
    pub groups: Vec<String>,
    pub sudoers: Vec<String>,
    pub sudoers_file: Option<String>,
}

impl Created {
    /// The `host_user.create` session event the proxy passes on to auth.
    pub fn event(&self) -> sallyport_core::api::SessionEvent {
        let fields = serde_json::json!({
            "login": self.login,
            "mode": self.mode.as_str(),
            "groups": self.groups,
            "sudoers": self.sudoers,
            "sudoers_file": self.sudoers_file,
        });
        sallyport_core::api::SessionEvent {
            event: sallyport_core::audit::EventType::HostUserCreate
                .name()
                .into(),
            fields: match fields {
                serde_json::Value::Object(m) => m,
                _ => serde_json::Map::new(),
            },
        }
    }
}

/// Held by each session of a login created under `insecure-drop`: the last one dropped
/// removes the login.
#[derive(Debug)]
pub struct Lease {
    login: String,
}

impl Lease {
    fn take(login: &str) -> Lease {
        if let Ok(mut d) = DROPS.lock() {
            *d.get_or_insert_with(HashMap::new)
                .entry(login.to_string())
                .or_default() += 1;
        }
        Lease {
            login: login.to_string(),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let last = DROPS.lock().ok().is_some_and(|mut d| {
            let Some(map) = d.as_mut() else { return false };
            let Some(n) = map.get_mut(&self.login) else {
                return false;
            };
            *n = n.saturating_sub(1);
            // The entry stays at 0 until `remove` decides, so that a session opening
            // meanwhile takes a lease on it rather than lose its login.
            *n == 0
        });
        if last {
            let login = self.login.clone();
            // userdel may wait on the password file's lock or on the session's last processes;
            // never in a russh callback.
            std::thread::spawn(move || remove(&login));
        }
    }
}

/// Makes sure `login` exists when `grant` allows creating it. Returns what was created (for
/// the audit log) and, under `insecure-drop`, the session's lease. An existing login is never
/// touched. Blocking: run it off the async threads. The error reads after "login X on node N ".
pub fn ensure(login: &str, grant: &HostUser) -> Result<(Option<Created>, Option<Lease>), String> {
    let _one_at_a_time = ADMIN
        .lock()
        .map_err(|_| "could not be created: agent state lost")?;
    if crate::passwd::lookup(login).is_some() {
        // Another session of a login this agent created to drop keeps it alive; any other
        // existing login is none of this module's business.
        let ours = DROPS
            .lock()
            .ok()
            .is_some_and(|d| d.as_ref().is_some_and(|m| m.contains_key(login)));
        return Ok((None, ours.then(|| Lease::take(login))));
    }
    if grant.mode == HostUserMode::Off {
        return Ok((None, None));
    }
    if !creatable_login(login) {
        return Err(format!(
            "could not be created: {login:?} is not a name this agent creates (a lower-case letter or `_`, then lower-case letters, digits, `_` or `-`, at most 32); nothing was created"
        ));
    }
    // Checked before anything is done, as useradd would fail only after the groups were made.
    let high = UID_HIGH_WATER.load(std::sync::atomic::Ordering::SeqCst);
    let uid_max = crate::passwd::uid_max();
    if high >= uid_max {
        return Err(format!(
            "could not be created: this agent's host users have used every uid up to {high}, and \
             UID_MAX in /etc/login.defs is {uid_max} (raise UID_MAX, or lower uid_high_water in \
             the agent's host-users.json once the uids it dropped are no longer in use, and restart the agent)"
        ));
    }
    let groups: Vec<String> = grant
        .groups
        .iter()
        .map(|g| g.as_str().to_string())
        .filter(|g| valid_host_name(g) && g != MANAGED_GROUP)
        .collect();
    let sudoers: Vec<String> = grant
        .sudoers
        .iter()
        .map(|l| l.as_str().to_string())
        .collect();
    // The sudoers lines are checked before anything else is done: a refusal leaves the node
    // as it was.
    let staged = if sudoers.is_empty() {
        None
    } else {
        Some(Staged::new(login, &sudoers)?)
    };
    ensure_group(MANAGED_GROUP, true)?;
    for g in &groups {
        ensure_group(g, false)?;
    }
    let mut member_of = vec![MANAGED_GROUP.to_string()];
    member_of.extend(groups.iter().cloned());
    let member_list = member_of.join(",");
    let uid_min = format!("UID_MIN={}", high.saturating_add(1));
    let mut useradd = vec!["useradd"];
    if high > 0 {
        useradd.extend(["-K", uid_min.as_str()]);
    }
    useradd.extend([
        "-m",
        "-k",
        "/etc/skel",
        "-s",
        "/bin/bash",
        "-G",
        &member_list,
        "--",
        login,
    ]);
    if let Err(e) = admin(&useradd) {
        // Made meanwhile by something other than this agent: it is not ours to report or drop.
        if crate::passwd::lookup(login).is_some() {
            return Ok((None, None));
        }
        return Err(format!("could not be created: {e}"));
    }
    if let Some(made) = crate::passwd::lookup(login) {
        UID_HIGH_WATER.fetch_max(made.uid, std::sync::atomic::Ordering::SeqCst);
        if let Err(e) = save_state() {
            // The login exists and works; only a restart before the next save could reuse a
            // dropped uid. Said loudly, not turned into a refused session.
            tracing::error!(error = %e, "the host-user uid high-water mark was not saved");
        }
    }
    let sudoers_file = match staged {
        Some(s) => match crate::passwd::lookup(login)
            .ok_or_else(|| format!("{login} vanished right after useradd"))
            .and_then(|l| s.install(l.uid))
        {
            Ok(path) => Some(path),
            Err(e) => {
                // Half a login (no sudo it was granted) would be a surprise later: none at all.
                let _ = admin(&["userdel", "-r", "--", login]);
                return Err(format!("could not be created: {e}"));
            }
        },
        None => None,
    };
    tracing::info!(login, mode = grant.mode.as_str(), groups = %groups.join(","), "created a host user");
    let lease = (grant.mode == HostUserMode::InsecureDrop).then(|| Lease::take(login));
    Ok((
        Some(Created {
            login: login.to_string(),
            mode: grant.mode,
            groups,
            sudoers,
            sudoers_file,
        }),
        lease,
    ))
}

/// At a session channel's open: creates the login when the certificate's grant allows it and
/// the login does not exist. Returns what was created, the session's lease (`insecure-drop`),
/// and the login as it now is when it was just created.
pub async fn for_session(
    login: &Option<Login>,
    grant: &Option<HostUser>,
) -> Result<(Option<Created>, Option<Lease>, Option<Login>), String> {
    let (Some(login), Some(grant)) = (login, grant) else {
        return Ok((None, None, None));
    };
    let (name, grant) = (login.name.clone(), grant.clone());
    let (created, lease) = tokio::task::spawn_blocking(move || ensure(&name, &grant))
        .await
        .map_err(|e| format!("could not be created: {e}"))??;
    let fresh = match &created {
        Some(_) => Some(
            crate::passwd::lookup(&login.name)
                .ok_or("was created but cannot be found through the name service")?,
        ),
        None => None,
    };
    Ok((created, lease, fresh))
}

/// Tells the proxy, on the session channel, that the login was created (`host_user.create`).
/// Through the channel itself, queued behind its confirmation (a write through the session
/// before the accept is processed would name a channel the proxy does not know yet).
pub async fn report(channel: &russh::Channel<russh::server::Msg>, created: &Created) {
    match serde_json::to_vec(&created.event()) {
        Ok(json) => {
            if let Err(e) = channel
                .extended_data_bytes(sallyport_core::api::AGENT_EVENT_EXT, json)
                .await
            {
                tracing::warn!(login = %created.login, error = ?e, "host_user.create not reported");
            }
        }
        Err(e) => {
            tracing::warn!(login = %created.login, error = %e, "host_user.create not reported")
        }
    }
}

/// Whether `login` carries this agent's mark.
fn managed(login: &str) -> bool {
    nix::unistd::Group::from_name(MANAGED_GROUP)
        .ok()
        .flatten()
        .is_some_and(|g| g.mem.iter().any(|m| m == login))
}

/// Removes a login this agent created (its home and its sudoers drop-in with it). A login
/// without the mark is left alone, whatever happened to it meanwhile.
fn remove(login: &str) {
    let Ok(_one_at_a_time) = ADMIN.lock() else {
        return;
    };
    // A session that opened meanwhile took a new lease: it keeps the login.
    {
        let Ok(mut d) = DROPS.lock() else { return };
        let map = d.get_or_insert_with(HashMap::new);
        if map.get(login).is_some_and(|n| *n > 0) {
            return;
        }
        map.remove(login);
    }
    let Some(user) = crate::passwd::lookup(login) else {
        return;
    };
    if !managed(login) {
        tracing::warn!(
            login,
            "not removing a login that is not in {MANAGED_GROUP}: this agent did not create it"
        );
        return;
    }
    // Its sudo goes first and whatever happens next: a login that outlives a failed userdel
    // must not keep root's rights.
    let _ = std::fs::remove_file(sudoers_path(login));
    // A dropped login leaves nothing running: what outlived the session (nohup, a daemon)
    // is killed before userdel, which would otherwise refuse. Bounded: the node lock is held.
    let mut result = Err(String::new());
    for _ in 0..8 {
        for _ in 0..10 {
            if kill_processes_of(user.uid) == 0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        result = admin(&["userdel", "-r", "--", login]);
        if result.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    match result {
        Ok(()) => {
            tracing::info!(login, "removed a host user (insecure-drop)");
        }
        Err(e) => tracing::warn!(login, error = %e, "could not remove a host user"),
    }
}

/// SIGKILLs every process with `uid` as its real, effective, saved or file-system uid;
/// returns how many it found.
fn kill_processes_of(uid: u32) -> usize {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0;
    };
    let mut found = 0;
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let status = std::fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let runs_as = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .is_some_and(|v| {
                v.split_whitespace()
                    .any(|u| u.parse::<u32>().ok() == Some(uid))
            });
        if runs_as {
            found += 1;
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
    found
}

/// Creates group `name` unless it exists.
fn ensure_group(name: &str, system: bool) -> Result<(), String> {
    if nix::unistd::Group::from_name(name).ok().flatten().is_some() {
        return Ok(());
    }
    let mut args = vec!["groupadd"];
    if system {
        args.push("-r");
    }
    args.extend(["--", name]);
    match admin(&args) {
        Ok(()) => Ok(()),
        // Made meanwhile by someone else: fine.
        Err(_) if nix::unistd::Group::from_name(name).ok().flatten().is_some() => Ok(()),
        Err(e) => Err(format!("could not be created: {e}")),
    }
}

/// Runs a shadow-utils command, retrying while something else holds the password files' lock
/// (exit 10) or the login is still in use (exit 8, userdel).
fn admin(args: &[&str]) -> Result<(), String> {
    let mut last = String::new();
    for _ in 0..50 {
        let out = Command::new(args[0])
            .args(&args[1..])
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", args[0]))?;
        if out.status.success() {
            return Ok(());
        }
        last = format!(
            "{} failed: {}",
            args[0],
            String::from_utf8_lossy(&out.stderr).trim()
        );
        if !matches!(out.status.code(), Some(10) | Some(8)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last)
}

/// True for a login this agent may create: `^[a-z_][a-z0-9_-]{0,31}$`. Stricter than
/// `valid_host_name` on purpose: an upper-case name such as `ALL` or a User_Alias would mean
/// something else to sudo, and a name from a user-controlled trait must never be one of those.
fn creatable_login(login: &str) -> bool {
    let mut chars = login.chars();
    login.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '_' | '-'))
}

/// The drop-in's text: every line's user is `#UID`, never the name, so no name (`ALL`, an
/// alias) can make a line mean more than this one account.
fn sudoers_text(login: &str, uid: u32, lines: &[String]) -> String {
    let mut text = format!(
        "# Created by sallyport for login {login} (create_host_user_mode); removed with it.\n"
    );
    for l in lines {
        text.push_str(&format!("#{uid} {l}\n"));
    }
    text
}

/// The drop-in for `login`: `sallyport-` and the name with every byte sudo would skip (`.`)
/// or that could collide (`_`) written as `_XX`, so two logins never share one.
fn sudoers_path(login: &str) -> PathBuf {
    let mut name = String::from("sallyport-");
    for b in login.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' {
            name.push(b as char);
        } else {
            name.push_str(&format!("_{b:02x}"));
        }
    }
    PathBuf::from(SUDOERS_DIR).join(name)
}

/// A sudoers drop-in written and checked, not yet installed.
struct Staged {
    tmp: PathBuf,
    dest: PathBuf,
    login: String,
    lines: Vec<String>,
}

/// The uid the staged drop-in is checked with before useradd assigns the real one.
const STAND_IN_UID: u32 = 65534;

impl Staged {
    fn new(login: &str, lines: &[String]) -> Result<Self, String> {
        if !std::path::Path::new(SUDOERS_DIR).is_dir() {
            return Err(format!(
                "could not be created: its roles grant host_sudoers but this node has no {SUDOERS_DIR} (install sudo on the node)"
            ));
        }
        let dest = sudoers_path(login);
        // sudo's includedir skips names with a `.`: the staged file is never read as sudoers.
        let tmp = PathBuf::from(SUDOERS_DIR).join(format!(
            ".{}.{}.tmp",
            dest.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            std::process::id()
        ));
        // Checked with a stand-in uid (not yet assigned); install writes the real one, and
        // a different number cannot change whether a line parses.
        let text = sudoers_text(login, STAND_IN_UID, lines);
        let _ = std::fs::remove_file(&tmp);
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o440)
            .open(&tmp)
            .and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.sync_all()
            });
        let staged = Staged {
            tmp,
            dest,
            login: login.to_string(),
            lines: lines.to_vec(),
        };
        if let Err(e) = written {
            return Err(format!(
                "could not be created: cannot write its sudoers file in {SUDOERS_DIR}: {e}"
            ));
        }
        let out = Command::new("visudo")
            .args(["-c", "-f"])
            .arg(&staged.tmp)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .output()
            .map_err(|e| {
                format!("could not be created: cannot run visudo to check its host_sudoers lines ({e}); install sudo on the node")
            })?;
        if !out.status.success() {
            let said = String::from_utf8_lossy(&out.stderr).to_string()
                + &String::from_utf8_lossy(&out.stdout);
            let said = said
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .collect::<Vec<_>>()
                .join("; ")
                .replace(&staged.tmp.display().to_string(), "sudoers");
            return Err(format!(
                "could not be created: its host_sudoers lines fail `visudo -c` ({said}); nothing was installed, fix the role's host_sudoers"
            ));
        }
        Ok(staged)
    }

    /// Moves the checked file into place (a rename: sudo sees all of it or none).
    fn install(self, uid: u32) -> Result<String, String> {
        let text = sudoers_text(&self.login, uid, &self.lines);
        std::fs::OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.tmp)
            .and_then(|mut f| {
                f.write_all(text.as_bytes())?;
                f.sync_all()
            })
            .map_err(|e| format!("cannot write {}: {e}", self.tmp.display()))?;
        std::fs::rename(&self.tmp, &self.dest)
            .map_err(|e| format!("cannot install {}: {e}", self.dest.display()))?;
        Ok(self.dest.display().to_string())
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        // Gone already once installed; otherwise nothing of it stays.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The high-water mark survives a restart: read back from the data dir; a damaged file
    /// stops the agent with its name rather than start without it.
    #[test]
    fn the_uid_high_water_mark_is_read_back_and_a_damaged_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("sallyport-hw-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(STATE_FILE);
        let _ = std::fs::write(&path, br#"{"uid_high_water": 64000}"#);
        assert_eq!(keep_state_in(&dir), Ok(()));
        assert!(UID_HIGH_WATER.load(std::sync::atomic::Ordering::SeqCst) >= 64000);
        let _ = std::fs::write(&path, b"not json");
        let err = keep_state_in(&dir).err().unwrap_or_default();
        assert!(err.contains("host-users.json is unreadable"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Past UID_MAX useradd would fail with its own words; the agent says which limit and what
    /// to do, and runs nothing.
    #[test]
    fn a_high_water_mark_past_uid_max_is_refused_with_the_way_out() {
        UID_HIGH_WATER.fetch_max(u32::MAX - 1, std::sync::atomic::Ordering::SeqCst);
        let grant = HostUser {
            mode: HostUserMode::Keep,
            groups: vec![],
            sudoers: vec![],
        };
        let err = ensure("sallyport-no-such-login", &grant)
            .err()
            .unwrap_or_default();
        assert!(err.contains("UID_MAX in /etc/login.defs"), "{err}");
        assert!(crate::passwd::lookup("sallyport-no-such-login").is_none());
    }

    #[test]
    fn only_lower_case_logins_are_created_and_drop_ins_name_the_uid() {
        for ok in ["alice", "_svc", "a-b_9", &"a".repeat(32)] {
            assert!(creatable_login(ok), "{ok}");
        }
        for bad in [
            "ALL",
            "Alice",
            "ADMINS",
            "a.b",
            "-x",
            "9a",
            "",
            &"a".repeat(33),
            "a b",
        ] {
            assert!(!creatable_login(bad), "{bad}");
        }
        let text = sudoers_text("alice", 1234, &["ALL=(root) NOPASSWD: /bin/true".into()]);
        let rules: Vec<&str> = text.lines().filter(|l| !l.starts_with("# ")).collect();
        assert_eq!(rules, ["#1234 ALL=(root) NOPASSWD: /bin/true"]);
    }

    #[test]
    fn every_login_gets_its_own_drop_in_that_sudo_reads() {
        let cases = [
            ("dev1", "/etc/sudoers.d/sallyport-dev1"),
            ("a.b", "/etc/sudoers.d/sallyport-a_2eb"),
            ("a_2eb", "/etc/sudoers.d/sallyport-a_5f2eb"),
            ("x-y", "/etc/sudoers.d/sallyport-x-y"),
        ];
        for (login, want) in cases {
            let p = sudoers_path(login);
            assert_eq!(p.to_str(), Some(want), "{login}");
            // sudo's includedir skips names with a `.` or ending in `~`.
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            assert!(!name.contains('.') && !name.ends_with('~'), "{name}");
        }
    }
}
