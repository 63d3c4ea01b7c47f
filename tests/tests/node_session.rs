//! A session on an agent node is the one sshd would give: the login's every group, sshd's
//! environment (and nothing of the agent's), no leaked descriptors, its own session with the
//! pty as controlling terminal, a hang-up for everything it started when the connection drops,
//! and a clear refusal for logins that may not log in. Real users and groups (`useradd`,
//! `groupadd`; the suite runs as root), compared with what `su -` gives the same login.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sallyport_tests::*;

/// A login (and groups) on this host for one test, removed when dropped.
struct HostLogin {
    name: String,
    groups: Vec<String>,
}

impl HostLogin {
    /// `useradd -m` with `shell`, in `extra` new groups of its own plus `system_groups`.
    fn new(tag: &str, shell: &str, extra: usize, system_groups: &[&str]) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("ns{tag}{}x{n}", std::process::id() % 100_000);
        let groups: Vec<String> = (0..extra).map(|i| format!("{name}g{i}")).collect();
        for g in &groups {
            host_admin(&["groupadd", g]);
        }
        let mut all: Vec<&str> = groups.iter().map(String::as_str).collect();
        all.extend(system_groups);
        let list = all.join(",");
        let mut args = vec!["useradd", "-m", "-s", shell];
        if !list.is_empty() {
            args.extend(["-G", &list]);
        }
        args.push(&name);
        host_admin(&args);
        HostLogin { name, groups }
    }
}

impl Drop for HostLogin {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["-r", &self.name]).output();
        for g in &self.groups {
            let _ = Command::new("groupdel").arg(g).output();
        }
    }
}

/// `env` output as a map (values are single lines here).
fn env_map(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim_end_matches('\r').split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// What `/etc/login.defs` says a non-root login's PATH is (the agent's fallback otherwise).
fn login_defs_path() -> String {
    let defs = std::fs::read_to_string("/etc/login.defs").unwrap_or_default();
    defs.lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some("ENV_PATH")).then(|| w.next()).flatten()
        })
        .map(|v| v.trim_start_matches("PATH=").to_string())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin:/usr/games".into())
}

#[test]
fn id_through_sallyport_shows_every_group_as_su_does() {
    let login = HostLogin::new("id", "/bin/bash", 2, &["adm"]);
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let through = c.ssh(&cfg, &[&target, "id"], "").ok().stdout;
    let su = run(Command::new("su").args(["-", &login.name, "-c", "id"]), "")
        .ok()
        .stdout;
    assert_eq!(through, su);
    for g in login.groups.iter().map(String::as_str).chain(["adm"]) {
        assert!(
            through.contains(&format!("({g})")),
            "{g} missing: {through}"
        );
    }
    // With a terminal too.
    let tty = c.ssh(&cfg, &["-tt", &target, "id"], "").ok().stdout;
    assert_eq!(tty.trim_end(), su.trim_end());
}

#[test]
fn the_environment_is_sshds_and_nothing_of_the_agents() {
    let login = HostLogin::new("env", "/bin/bash", 0, &[]);
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    // The client sends an allow-listed variable and one that is not.
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-o", "SendEnv=LC_PAPER NODE_SESSION_SECRET"])
            .env("LC_PAPER", "en_GB.UTF-8")
            .env("NODE_SESSION_SECRET", "leaked")
            .args([&target, "env"]),
        "",
    )
    .ok();
    let env = env_map(&r.stdout);
    let get = |k: &str| env.get(k).map(String::as_str).unwrap_or("");
    assert_eq!(get("USER"), login.name);
    assert_eq!(get("LOGNAME"), login.name);
    assert_eq!(get("HOME"), format!("/home/{}", login.name));
    assert_eq!(get("SHELL"), "/bin/bash");
    assert_eq!(get("MAIL"), format!("/var/mail/{}", login.name));
    assert_eq!(get("PATH"), login_defs_path());
    assert_eq!(get("LC_PAPER"), "en_GB.UTF-8");
    assert_eq!(get("SALLYPORT_USER"), "alice");
    // The user's address and port as the proxy saw them, then the node's end.
    let conn: Vec<&str> = get("SSH_CONNECTION").split(' ').collect();
    assert_eq!(conn.len(), 4, "{env:?}");
    assert_eq!(conn[0], "127.0.0.1");
    assert!(conn[1].parse::<u16>().is_ok_and(|p| p > 0), "{conn:?}");
    assert_eq!(conn[2], "127.0.0.1");
    assert!(conn[3].parse::<u16>().is_ok_and(|p| p > 0), "{conn:?}");
    assert_eq!(
        get("SSH_CLIENT"),
        format!("{} {} {}", conn[0], conn[1], conn[3])
    );
    // The very address the proxy audited for this session.
    let audited: Vec<String> = c
        .events("session.start")
        .iter()
        .filter_map(|e| e["remote_addr"].as_str().map(str::to_string))
        .collect();
    assert!(
        audited.contains(&format!("{}:{}", conn[0], conn[1])),
        "{audited:?} vs {conn:?}"
    );
    // No terminal, no SSH_TTY or TERM; nothing the client may not set; nothing of the agent's
    // (the harness starts the daemon with SALLYPORT_LOG, the test runner with CARGO_*).
    let expected = [
        "HOME",
        "LC_PAPER",
        "LOGNAME",
        "MAIL",
        "PATH",
        "SALLYPORT_USER",
        "SHELL",
        "SSH_CLIENT",
        "SSH_CONNECTION",
        "USER",
    ];
    let shells_own = ["PWD", "SHLVL", "_", "OLDPWD"];
    let keys: Vec<&str> = env
        .keys()
        .map(String::as_str)
        .filter(|k| !shells_own.contains(k))
        .collect();
    assert_eq!(keys, expected, "{}", r.stdout);

    // With a terminal: SSH_TTY names the pty the shell has, and TERM is the client's.
    let r = c
        .ssh(&cfg, &["-tt", &target, "env; echo tty=$(tty)"], "")
        .ok();
    let env = env_map(&r.stdout);
    let tty = env.get("tty").cloned().unwrap_or_default();
    assert!(tty.starts_with("/dev/pts/"), "{}", r.stdout);
    assert_eq!(env.get("SSH_TTY"), Some(&tty));
    assert!(env.contains_key("TERM"), "{}", r.stdout);
}

#[test]
fn no_descriptor_of_the_agents_reaches_the_session() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "sallytest");
    let cfg = c.ssh_config(&home, "alice");
    // 3 is the directory ls itself opened to read.
    for args in [
        &["sallytest@local1", "ls /proc/self/fd"][..],
        &["-tt", "sallytest@local1", "ls /proc/self/fd"][..],
    ] {
        let out = c.ssh(&cfg, args, "").ok().stdout;
        let fds: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(fds, ["0", "1", "2", "3"], "{args:?}: {out}");
    }
}

#[test]
fn a_session_leads_its_own_session_with_the_pty_as_its_terminal() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "sallytest");
    let cfg = c.ssh_config(&home, "alice");
    for tty in [true, false] {
        // (The client has no terminal of its own: the pty stays 0x0, which ps takes as
        // unknown; at 1x1 it complained on the terminal.)
        let mut args = vec!["sallytest@local1", "echo $$; ps -o sid=,pgid=,tty= -p $$"];
        if tty {
            args.insert(0, "-tt");
        }
        let out = c.ssh(&cfg, &args, "").ok().stdout;
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words.len(), 4, "{out}");
        let pid = words[0];
        assert_eq!(words[1], pid, "session id: {out}");
        assert_eq!(words[2], pid, "process group: {out}");
        if tty {
            assert!(words[3].starts_with("pts/"), "controlling terminal: {out}");
        } else {
            assert_eq!(words[3], "?", "no controlling terminal: {out}");
        }
    }
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet).
fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn everything_a_session_started_is_hung_up_when_the_connection_drops() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "sallytest");
    let cfg = c.ssh_config(&home, "alice");
    for tty in [false, true] {
        let tt = if tty { "-tt" } else { "-T" };
        let (mut ssh, pid) =
            c.ssh_running(&cfg, &[tt, "sallytest@local1", "sleep 300 & echo $!; wait"]);
        assert!(pid.parse::<u32>().is_ok(), "{pid:?}");
        assert!(!gone(&pid));
        // The connection drops (the client is killed; nothing is said to the node).
        ssh.kill().unwrap();
        let _ = ssh.wait();
        assert!(
            eventually(Duration::from_secs(10), || gone(&pid)),
            "the background sleep {pid} outlived its connection (tty: {tty})"
        );
    }
}

#[test]
fn logins_that_may_not_log_in_are_refused_with_the_reason() {
    let nologin = HostLogin::new("nl", "/usr/sbin/nologin", 0, &[]);
    let falsy = HostLogin::new("fl", "/bin/false", 0, &[]);
    let expired = HostLogin::new("ex", "/bin/bash", 0, &[]);
    host_admin(&["usermod", "-e", "1970-01-02", &expired.name]);
    // `useradd` without a password leaves it locked with `!`: that locks the password, not the
    // account, and key logins through the distributions' sshd work; so do these.
    let locked = HostLogin::new("lk", "/bin/bash", 0, &[]);
    host_admin(&["usermod", "-L", &locked.name]);
    let c = Cluster::start();
    c.wait_online("local1");
    let logins = [&nologin, &falsy, &expired, &locked]
        .map(|l| l.name.clone())
        .join(",");
    let home = c.user("alice", "access", &logins);
    let cfg = c.ssh_config(&home, "alice");
    let at = |l: &HostLogin| format!("{}@local1", l.name);
    c.ssh(&cfg, &[&at(&nologin), "id"], "").fails_with(&format!(
        "login {} on node local1 is not available: its shell is /usr/sbin/nologin",
        nologin.name
    ));
    c.ssh(&cfg, &["-tt", &at(&falsy)], "").fails_with(&format!(
        "login {} on node local1 is not available: its shell is /bin/false",
        falsy.name
    ));
    c.ssh(&cfg, &[&at(&expired), "id"], "").fails_with(&format!(
        "login {} on node local1 has expired",
        expired.name
    ));
    // An expired account forwards nothing either (the role allows it; sshd would not).
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-N", "-R"])
            .arg(format!("{}:127.0.0.1:9", free_port()))
            .arg(at(&expired)),
        "",
    );
    assert!(r.stderr.contains("remote port forwarding failed"), "{r:?}");
    let r = c.ssh(&cfg, &[&at(&locked), "id -un"], "").ok();
    assert_eq!(r.stdout.trim(), locked.name);
    // ... and the same forward works for a login that may log in.
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-R"])
            .arg(format!("{}:127.0.0.1:9", free_port()))
            .args([&at(&locked), "id -un"]),
        "",
    )
    .ok();
    assert_eq!(r.stdout.trim(), locked.name);
}
