//! Host users on demand (roles' `create_host_user_mode`, `host_groups`, `host_sudoers`): a login
//! that does not exist on an agent node is created for the session with its groups and a
//! sudoers drop-in `visudo -c` passed, audited as `host_user.create`, kept or dropped after the
//! session as the roles say; a login that already exists is never touched; a sudoers line visudo
//! rejects refuses the session with nothing installed; off unless every role allowing the login
//! there asks. Real `useradd`, `groupadd`, `visudo` and `sudo`; the suite runs as root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sallyport_tests::*;

/// A login name no one has on this host, unique to this test; whatever an agent created under
/// it (login, home, groups, sudoers drop-in) is removed when dropped.
struct NewLogin {
    name: String,
    groups: Vec<String>,
}

impl NewLogin {
    fn new(tag: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("hu{tag}{}x{n}", std::process::id() % 100_000);
        assert!(!exists(&name));
        let groups = vec![format!("{name}g")];
        NewLogin { name, groups }
    }
}

impl Drop for NewLogin {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["-r", &self.name]).output();
        for g in &self.groups {
            let _ = Command::new("groupdel").arg(g).output();
        }
        let _ = std::fs::remove_file(sudoers_file(&self.name));
    }
}

fn exists(login: &str) -> bool {
    Command::new("id")
        .arg(login)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn uid(login: &str) -> String {
    let out = Command::new("id").args(["-u", login]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The agent's drop-in for a login (names here have only letters and digits).
fn sudoers_file(login: &str) -> String {
    format!("/etc/sudoers.d/sallyport-{login}")
}

/// Files in /etc/sudoers.d that mention `login`, staged ones included.
fn sudoers_mentioning(login: &str) -> Vec<String> {
    std::fs::read_dir("/etc/sudoers.d")
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(login))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// A role allowing `login` on every node, with `options` and extra allow-side lines.
fn create_role(c: &Cluster, name: &str, options: &str, login: &str, allow_extra: &str) {
    let f = c.dir.path().join(format!("{name}.yaml"));
    std::fs::write(
        &f,
        format!(
            "kind: role\nversion: v1\nmetadata: {{name: {name}}}\nspec:\n  options: {{{options}}}\n  allow:\n    logins: [{login}]\n    node_labels: {{'*': '*'}}\n{allow_extra}"
        ),
    )
    .unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
}

fn host_user_events(c: &Cluster) -> Vec<serde_json::Value> {
    c.sallyctl(&["audit", "search", "--type", "host_user.create"])
        .ok()
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

fn groups_allow(login: &NewLogin) -> String {
    format!(
        "    host_groups: [adm, {}]\n    host_sudoers: ['ALL=(ALL) NOPASSWD: /usr/bin/true']\n",
        login.groups[0]
    )
}

#[test]
fn keep_creates_the_login_with_its_groups_and_sudo_and_keeps_it() {
    let login = NewLogin::new("keep");
    let c = Cluster::start();
    c.wait_online("local1");
    create_role(
        &c,
        "hostusers",
        "create_host_user_mode: keep",
        &login.name,
        &groups_allow(&login),
    );
    let home = c.user("alice", "hostusers", "");
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);

    let id = c.ssh(&cfg, &[&target, "id"], "").ok().stdout;
    assert!(id.contains(&format!("({})", login.name)), "{id}");
    for g in ["adm", "sallyport-managed", login.groups[0].as_str()] {
        assert!(id.contains(&format!("({g})")), "{g} missing: {id}");
    }
    // The home came from /etc/skel and belongs to the login.
    let pwd = c
        .ssh(&cfg, &[&target, "pwd; ls -A ~; stat -c %U ~"], "")
        .ok()
        .stdout;
    assert!(pwd.starts_with(&format!("/home/{}\n", login.name)), "{pwd}");
    assert!(pwd.contains(".bashrc"), "{pwd}");
    assert!(pwd.trim_end().ends_with(&login.name), "{pwd}");

    // sudo exactly as host_sudoers says: /usr/bin/true, and nothing else.
    c.ssh(
        &cfg,
        &[&target, "sudo -n /usr/bin/true && echo sudo-ok"],
        "",
    )
    .ok();
    let ok = c
        .ssh(&cfg, &[&target, "sudo -n true && echo sudo-ok"], "")
        .ok()
        .stdout;
    assert!(ok.contains("sudo-ok"), "{ok}");
    c.ssh(&cfg, &[&target, "sudo -n id"], "")
        .fails_with("a password is required");
    let installed = std::fs::read_to_string(sudoers_file(&login.name)).unwrap();
    assert!(
        installed.contains(&format!(
            "\n#{} ALL=(ALL) NOPASSWD: /usr/bin/true\n",
            uid(&login.name)
        )),
        "{installed}"
    );
    // The drop-in names the uid, never the login: no name can widen a line.
    assert!(
        !installed.contains(&format!("{} ALL", login.name)),
        "{installed}"
    );
    let mode = std::fs::metadata(sudoers_file(&login.name)).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o440
    );

    // Audited once, by the session that created it, with what it got.
    assert!(eventually(Duration::from_secs(10), || {
        !host_user_events(&c).is_empty()
    }));
    let events = host_user_events(&c);
    assert_eq!(events.len(), 1, "{events:?}");
    let e = &events[0];
    assert_eq!(e["user"], "alice");
    assert_eq!(e["login"], login.name.as_str());
    assert_eq!(e["node"], "local1");
    assert_eq!(e["mode"], "keep");
    assert_eq!(
        e["groups"],
        serde_json::json!(["adm", login.groups[0].as_str()])
    );
    assert_eq!(
        e["sudoers"],
        serde_json::json!(["ALL=(ALL) NOPASSWD: /usr/bin/true"])
    );
    assert!(e["session_id"].as_str().is_some_and(|s| !s.is_empty()));

    // keep: still there after the sessions ended.
    std::thread::sleep(Duration::from_secs(2));
    assert!(exists(&login.name));
    assert!(Path::new(&sudoers_file(&login.name)).exists());
}

#[test]
fn insecure_drop_removes_the_login_when_its_last_session_ends() {
    let login = NewLogin::new("drop");
    let mut c = Cluster::start();
    c.wait_online("local1");
    create_role(
        &c,
        "dropusers",
        "create_host_user_mode: insecure-drop",
        &login.name,
        &groups_allow(&login),
    );
    let home = c.user("alice", "dropusers", "");
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);

    let out = c
        .ssh(
            &cfg,
            &[&target, "id -un; id -u; sudo -n true && echo sudo-ok"],
            "",
        )
        .ok()
        .stdout;
    assert!(out.starts_with(&login.name), "{out}");
    let first_uid: u32 = out.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(out.contains("sudo-ok"), "{out}");
    assert!(
        eventually(Duration::from_secs(10), || !exists(&login.name)
            && !Path::new(&format!("/home/{}", login.name)).exists()
            && !Path::new(&sudoers_file(&login.name)).exists()),
        "{} is still there after its only session",
        login.name
    );
    assert!(
        eventually(Duration::from_secs(10), || {
            host_user_events(&c)
                .iter()
                .any(|e| e["login"] == login.name.as_str() && e["mode"] == "insecure-drop")
        }),
        "{:?}",
        host_user_events(&c)
    );

    // The agent keeps the highest uid it made across a restart (0600 in its data dir): a
    // restarted agent must not hand the dropped login's uid out again either.
    let state = c.data_dir().join("host-users.json");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&state).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "{}", state.display());
    c.stop();
    c.boot();
    c.wait_online("local1");

    // A second session gets a fresh login. While it runs, a third one comes and goes: the
    // login stays until the last of them ends.
    let mut long = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-J", "proxy", &target, "id -un; sleep 4"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || exists(&login.name)));
    let out = c.ssh(&cfg, &[&target, "id -un; id -u"], "").ok().stdout;
    assert_eq!(out.lines().next().unwrap_or(""), login.name);
    // The dropped login's uid is never handed out again, not even after the agent restarted:
    // what it left would be the new one's.
    let second_uid: u32 = out.lines().nth(1).unwrap().trim().parse().unwrap();
    assert!(
        second_uid > first_uid,
        "{first_uid} reissued as {second_uid}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(exists(&login.name), "removed while a session still ran");
    assert!(long.wait().unwrap().success());
    assert!(eventually(Duration::from_secs(10), || !exists(&login.name)));
}

#[test]
fn a_login_that_exists_is_never_touched() {
    let login = NewLogin::new("pre");
    let status = Command::new("useradd")
        .args(["-m", "-s", "/bin/bash", &login.name])
        .status()
        .unwrap();
    assert!(status.success());
    let before = Command::new("id").arg(&login.name).output().unwrap().stdout;
    let c = Cluster::start();
    c.wait_online("local1");
    create_role(
        &c,
        "dropusers",
        "create_host_user_mode: insecure-drop",
        &login.name,
        &groups_allow(&login),
    );
    let home = c.user("alice", "dropusers", "");
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let id = c.ssh(&cfg, &[&target, "id"], "").ok().stdout;
    assert!(
        !id.contains("(adm)") && !id.contains("sallyport-managed"),
        "{id}"
    );
    c.ssh(&cfg, &[&target, "sudo -n true"], "")
        .fails_with("a password is required");
    std::thread::sleep(Duration::from_secs(3));
    // Same groups, no drop-in, not removed under insecure-drop, nothing audited.
    assert_eq!(
        Command::new("id").arg(&login.name).output().unwrap().stdout,
        before
    );
    assert!(sudoers_mentioning(&login.name).is_empty());
    assert!(host_user_events(&c).is_empty());
}

#[test]
fn a_sudoers_line_visudo_rejects_refuses_the_session_and_installs_nothing() {
    let login = NewLogin::new("bad");
    let c = Cluster::start();
    c.wait_online("local1");
    create_role(
        &c,
        "badsudo",
        "create_host_user_mode: keep",
        &login.name,
        &format!(
            "    host_groups: [{}]\n    host_sudoers: ['ALL=(ALL NOPASSWD /usr/bin/true']\n",
            login.groups[0]
        ),
    );
    let home = c.user("alice", "badsudo", "");
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    c.ssh(&cfg, &[&target, "true"], "").fails_with(&format!(
        "login {} on node local1 could not be created: its host_sudoers lines fail `visudo -c`",
        login.name
    ));
    assert!(!exists(&login.name));
    assert!(
        sudoers_mentioning(&login.name).is_empty(),
        "{:?}",
        sudoers_mentioning(&login.name)
    );
    assert!(host_user_events(&c).is_empty());
}

#[test]
fn an_upper_case_login_such_as_all_is_never_created() {
    // `ALL` (or any upper-case name sudo could read as a User_Alias) from a trait the user
    // controls must never become a login, let alone a sudoers line for every account. A unique
    // upper-case name stands in for `ALL` so parallel tests never share it.
    let name = format!("HUALL{}", std::process::id() % 100_000);
    assert!(!exists(&name));
    let c = Cluster::start();
    c.wait_online("local1");
    create_role(
        &c,
        "caps",
        "create_host_user_mode: keep",
        &name,
        "    host_sudoers: ['ALL=(root) NOPASSWD: /usr/bin/true']\n",
    );
    let home = c.user("alice", "caps", "");
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{name}@local1");
    let refused = c.ssh(&cfg, &[&target, "true"], "");
    let made = exists(&name);
    if made {
        let _ = Command::new("userdel").args(["-r", &name]).output();
    }
    let files = sudoers_mentioning(&name);
    for f in &files {
        let _ = std::fs::remove_file(Path::new("/etc/sudoers.d").join(f));
    }
    refused.fails_with(&format!(
        "login {name} on node local1 could not be created: \"{name}\" is not a name this agent creates (a lower-case letter or `_`, then lower-case letters, digits, `_` or `-`, at most 32); nothing was created"
    ));
    assert!(!made);
    assert!(files.is_empty(), "{files:?}");
    assert!(host_user_events(&c).is_empty());
}

#[test]
fn off_unless_every_role_allowing_the_login_asks() {
    let login = NewLogin::new("off");
    let c = Cluster::start();
    c.wait_online("local1");
    let not_there = format!("login {} does not exist on node local1", login.name);
    // No role says: off, as today.
    create_role(&c, "plain", "", &login.name, "");
    let home = c.user("alice", "plain", "");
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    c.ssh(&cfg, &[&target, "true"], "").fails_with(&not_there);

    // One role keeps, another allowing the same login says off: off (Teleport's rule).
    create_role(
        &c,
        "keeper",
        "create_host_user_mode: keep",
        &login.name,
        &groups_allow(&login),
    );
    create_role(&c, "refuser", "create_host_user_mode: off", &login.name, "");
    let home = c.user("bob", "keeper,refuser", "");
    let cfg = c.ssh_config(&home, "bob");
    c.ssh(&cfg, &[&target, "true"], "").fails_with(&not_there);
    // A role that allows the login without a word about host users counts as off too.
    let home = c.user("carol", "keeper,plain", "");
    let cfg = c.ssh_config(&home, "carol");
    c.ssh(&cfg, &[&target, "true"], "").fails_with(&not_there);
    assert!(!exists(&login.name));
    assert!(sudoers_mentioning(&login.name).is_empty());

    // The keeping role alone creates it.
    let home = c.user("dave", "keeper", "");
    let cfg = c.ssh_config(&home, "dave");
    let out = c.ssh(&cfg, &[&target, "id -un"], "").ok().stdout;
    assert_eq!(out.trim(), login.name);
}
