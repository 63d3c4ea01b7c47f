//! A session on an agent node is a login the system knows, as through sshd: with
//! `ssh_service.pam` PAM's account and session stacks run (pam_limits' limits and pam_env's
//! variables reach the shell; an account denial refuses with PAM's words; pam_motd's text is
//! shown once), a pty session is in utmp while it runs (`who`), in wtmp after (`last`) and in
//! lastlog, and an interactive shell gets /etc/motd unless ~/.hushlogin. Real PAM (service
//! files written here, removed after), real logins, real `who`/`last`/`lastlog`; as root.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sallyport_tests::*;

fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("{tag}{}x{n}", std::process::id() % 100_000)
}

/// A login with a home and bash, removed when dropped.
struct HostLogin {
    name: String,
}

impl HostLogin {
    fn new(tag: &str) -> Self {
        let name = unique(&format!("ps{tag}"));
        host_admin(&["useradd", "-m", "-s", "/bin/bash", &name]);
        HostLogin { name }
    }

    fn home(&self) -> PathBuf {
        PathBuf::from(format!("/home/{}", self.name))
    }
}

impl Drop for HostLogin {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["-r", &self.name]).output();
    }
}

/// `/etc/pam.d/<name>` written for one test, removed when dropped.
struct PamService {
    name: String,
}

impl PamService {
    fn new(text: &str) -> Self {
        let name = unique("sallyport-test-");
        std::fs::write(Path::new("/etc/pam.d").join(&name), text).unwrap();
        PamService { name }
    }
}

impl Drop for PamService {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(Path::new("/etc/pam.d").join(&self.name));
    }
}

fn with_pam(service: &PamService) -> Cluster {
    let c = Cluster::start_with(Options {
        ssh_service: vec![format!(
            "pam: {{enabled: true, service_name: {}}}",
            service.name
        )],
        ..Options::default()
    });
    c.wait_online("local1");
    c
}

#[test]
fn pam_limits_and_pam_env_apply_to_the_session() {
    let login = HostLogin::new("lim");
    let dir = tempfile::tempdir().unwrap();
    let limits = dir.path().join("limits.conf");
    std::fs::write(
        &limits,
        format!("{n} soft nofile 777\n{n} hard nofile 888\n", n = login.name),
    )
    .unwrap();
    let envfile = dir.path().join("environment");
    let marker = unique("from-pam-");
    std::fs::write(&envfile, format!("PAMTEST_VAR={marker}\n")).unwrap();
    let service = PamService::new(&format!(
        "account required pam_permit.so\n\
         session required pam_limits.so conf={}\n\
         session required pam_env.so readenv=1 envfile={}\n",
        limits.display(),
        envfile.display()
    ));
    let c = with_pam(&service);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let script = "echo soft=$(ulimit -n) hard=$(ulimit -Hn) var=$PAMTEST_VAR user=$(id -un)";
    let want = format!("soft=777 hard=888 var={marker} user={}", login.name);
    // Without a pty and with one.
    let out = c.ssh(&cfg, &[&target, script], "").ok().stdout;
    assert_eq!(out.trim(), want);
    let out = c.ssh(&cfg, &["-tt", &target, script], "").ok().stdout;
    assert_eq!(out.trim(), want);
    // The login's every group, as without PAM.
    let through = c.ssh(&cfg, &[&target, "id"], "").ok().stdout;
    let su = run(Command::new("su").args(["-", &login.name, "-c", "id"]), "")
        .ok()
        .stdout;
    assert_eq!(through, su);
    // The exit status comes through session-exec.
    let r = c.ssh(&cfg, &[&target, "exit 7"], "");
    assert_eq!(r.code, 7, "{}", r.stderr);
}

#[test]
fn the_shipped_example_pam_service_runs_sessions() {
    let login = HostLogin::new("ex");
    let example = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/pam.d/sallyport"),
    )
    .unwrap();
    let service = PamService::new(&example);
    let c = with_pam(&service);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let out = c.ssh(&cfg, &[&target, "id -un"], "").ok().stdout;
    assert_eq!(out.trim(), login.name);
    let out = c.ssh(&cfg, &["-tt", &target, "tty"], "").ok().stdout;
    assert!(out.trim().starts_with("/dev/pts/"), "{out}");
}

#[test]
fn without_pam_sessions_are_unchanged() {
    let login = HostLogin::new("off");
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let agent_limit = String::from_utf8(
        Command::new("sh")
            .args(["-c", "ulimit -n"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let out = c
        .ssh(&cfg, &[&target, "echo $(ulimit -n) var=$PAMTEST_VAR"], "")
        .ok()
        .stdout;
    assert_eq!(out.trim(), format!("{} var=", agent_limit.trim()));
}

#[test]
fn a_pam_account_denial_refuses_the_session_with_pams_message() {
    let login = HostLogin::new("deny");
    let deny = PamService::new("account requisite pam_deny.so\nsession required pam_permit.so\n");
    let c = with_pam(&deny);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    // pam_deny's answer to the account check is PAM_AUTH_ERR, in pam_strerror's words.
    let want = format!(
        "sallyport: login {} on node local1 was refused by PAM's account check (service {}): Authentication failure",
        login.name, deny.name
    );
    let r = c
        .ssh(&cfg, &[&target, "echo ran > /tmp/never"], "")
        .fails_with(&want);
    assert!(!r.stdout.contains("ran"));
    c.ssh(&cfg, &["-tt", &target], "exit\n").fails_with(&want);
    drop(c);

    // A module's own words reach the user: pam_nologin's file.
    let dir = tempfile::tempdir().unwrap();
    let nologin = dir.path().join("nologin");
    let text = unique("closed for maintenance ");
    std::fs::write(&nologin, format!("{text}\n")).unwrap();
    let closed = PamService::new(&format!(
        "account required pam_nologin.so file={}\nsession required pam_permit.so\n",
        nologin.display()
    ));
    let c = with_pam(&closed);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let r = c.ssh(&cfg, &[&target, "true"], "").fails_with(&text);
    assert!(
        r.stderr.contains("was refused by PAM's account check"),
        "{}",
        r.stderr
    );
}

#[test]
fn pam_enabled_without_its_service_file_stops_the_start_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sallyport.yaml");
    let service = unique("sallyport-missing-");
    std::fs::write(
        &config,
        format!(
            "version: v1\nsallyport:\n  data_dir: {}\nssh_service:\n  pam: {{enabled: true, service_name: {service}}}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    run(
        Command::new(bin("sallyport"))
            .args(["start", "--config"])
            .arg(&config),
        "",
    )
    .fails_with(&format!("/etc/pam.d/{service} does not exist"));
}

/// Serializes the tests that change /etc/motd (nextest runs each test in its own process).
fn motd_lock() -> std::fs::File {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open("/tmp/sallyport-test-motd.lock")
        .unwrap();
    f.lock().unwrap();
    f
}

/// /etc/motd set for one test, put back when dropped.
struct Motd {
    before: Option<Vec<u8>>,
}

impl Motd {
    fn set(text: &str) -> Self {
        let before = std::fs::read("/etc/motd").ok();
        std::fs::write("/etc/motd", text).unwrap();
        Motd { before }
    }
}

impl Drop for Motd {
    fn drop(&mut self) {
        match &self.before {
            Some(b) => std::fs::write("/etc/motd", b).unwrap(),
            None => {
                let _ = std::fs::remove_file("/etc/motd");
            }
        }
    }
}

#[test]
fn the_motd_greets_interactive_shells_unless_hushed_as_sshd_does() {
    let login = HostLogin::new("motd");
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let _lock = motd_lock();
    let marker = unique("welcome-to-the-node-");
    let _motd = Motd::set(&format!("{marker}\nsecond line\n"));
    // An interactive shell: the motd, once, in the terminal's line endings.
    let out = c.ssh(&cfg, &["-tt", &target], "exit\n").ok().stdout;
    assert_eq!(out.matches(&marker).count(), 1, "{out}");
    assert!(
        out.contains(&format!("{marker}\r\nsecond line\r\n")),
        "{out:?}"
    );
    // A command, with a pty or not: none.
    let out = c.ssh(&cfg, &["-tt", &target, "echo hi"], "").ok().stdout;
    assert!(!out.contains(&marker), "{out}");
    let out = c.ssh(&cfg, &[&target, "echo hi"], "").ok().stdout;
    assert!(!out.contains(&marker), "{out}");
    // ~/.hushlogin: none.
    host_admin(&[
        "su",
        &login.name,
        "-c",
        &format!("touch {}/.hushlogin", login.home().display()),
    ]);
    let out = c.ssh(&cfg, &["-tt", &target], "exit\n").ok().stdout;
    assert!(!out.contains(&marker), "{out}");
}

#[test]
fn with_pam_the_motd_is_pam_motds_and_shown_once() {
    let login = HostLogin::new("pmotd");
    let dir = tempfile::tempdir().unwrap();
    let pam_motd = dir.path().join("motd");
    let pam_marker = unique("motd-through-pam-");
    std::fs::write(&pam_motd, format!("{pam_marker}\n")).unwrap();
    let service = PamService::new(&format!(
        "account required pam_permit.so\nsession required pam_permit.so\n\
         session optional pam_motd.so motd={} noupdate\n",
        pam_motd.display()
    ));
    let c = with_pam(&service);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let _lock = motd_lock();
    let etc_marker = unique("etc-motd-");
    let _motd = Motd::set(&format!("{etc_marker}\n"));
    let out = c.ssh(&cfg, &["-tt", &target], "exit\n").ok().stdout;
    assert_eq!(out.matches(&pam_marker).count(), 1, "{out}");
    // The PAM stack owns the motd (as Debian's sshd with pam_motd and PrintMotd no).
    assert!(!out.contains(&etc_marker), "{out}");
    // Not for a command.
    let out = c.ssh(&cfg, &["-tt", &target, "echo hi"], "").ok().stdout;
    assert!(!out.contains(&pam_marker), "{out}");
}

/// The system's utmp, made if this machine has none (containers boot without one; systemd
/// makes it at boot elsewhere).
fn ensure_utmp() {
    if !Path::new("/run/utmp").exists() {
        std::fs::write("/run/utmp", b"").unwrap();
        let _ = Command::new("chgrp").args(["utmp", "/run/utmp"]).output();
        let _ = Command::new("chmod").args(["664", "/run/utmp"]).output();
    }
}

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_pty_session_is_in_utmp_while_it_runs_then_in_wtmp_and_lastlog() {
    ensure_utmp();
    let login = HostLogin::new("utmp");
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);

    // Without a pty: no utmp entry (sshd's rule), seen from inside the session.
    let out = c.ssh(&cfg, &[&target, "who"], "").ok().stdout;
    assert!(!out.contains(&login.name), "{out}");

    let mut ssh = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-J", "proxy", "-tt", &target, "tty; sleep 5"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut who_line = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            let who = output(&mut Command::new("who"));
            match who
                .lines()
                .find(|l| l.starts_with(&format!("{} ", login.name)))
            {
                Some(l) => {
                    who_line = l.to_string();
                    true
                }
                None => false,
            }
        }),
        "{} never appeared in who",
        login.name
    );
    let fields: Vec<&str> = who_line.split_whitespace().collect();
    assert!(fields[1].starts_with("pts/"), "{who_line}");
    assert!(who_line.ends_with("(127.0.0.1)"), "{who_line}");
    let line = fields[1].to_string();
    // w sees it too.
    let w = output(Command::new("w").args(["-h", "-s"]));
    assert!(
        w.lines()
            .any(|l| l.contains(&login.name[..8.min(login.name.len())]) && l.contains(&line)),
        "{w}"
    );

    let mut stdin = ssh.stdin.take().unwrap();
    let _ = stdin.flush();
    let out = ssh.wait_with_output().unwrap();
    let tty = String::from_utf8_lossy(&out.stdout);
    assert_eq!(tty.trim(), format!("/dev/{line}"));
    drop(stdin);

    // Gone from utmp once it ended; in wtmp with its end.
    assert!(
        eventually(Duration::from_secs(10), || {
            !output(&mut Command::new("who")).contains(&format!("{} ", login.name))
        }),
        "still in who after the session"
    );
    let last = output(Command::new("last").args(["-w", "-i", &login.name]));
    let rec = last
        .lines()
        .find(|l| l.starts_with(&login.name))
        .unwrap_or_else(|| panic!("not in last: {last}"));
    assert!(rec.contains(&line), "{rec}");
    assert!(rec.contains("127.0.0.1"), "{rec}");
    assert!(
        !rec.contains("still logged in") && !rec.contains("gone - no logout"),
        "{rec}"
    );
    if Path::new("/var/log/lastlog").exists() {
        let ll = output(Command::new("lastlog").args(["-u", &login.name]));
        let rec = ll.lines().last().unwrap_or_default();
        assert!(rec.contains(&line) && rec.contains("127.0.0.1"), "{ll}");
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
fn through_pam_a_session_is_the_same_process_tree_without_pam() {
    let login = HostLogin::new("tree");
    let service =
        PamService::new("account required pam_permit.so\nsession required pam_permit.so\n");
    let c = with_pam(&service);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    for tty in [false, true] {
        let with = |cmd: &str| {
            let mut args = vec![target.as_str(), cmd];
            if tty {
                args.insert(0, "-tt");
            }
            c.ssh(&cfg, &args, "").ok().stdout
        };
        // Nothing of the agent's or session-exec's descriptors (3: ls's own directory).
        let out = with("ls /proc/self/fd");
        let fds: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(fds, ["0", "1", "2", "3"], "tty {tty}: {out}");
        // Its own session, the pty as its controlling terminal.
        let out = with("echo $$; ps -o sid=,pgid=,tty= -p $$");
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(words.len(), 4, "{out}");
        assert_eq!((words[1], words[2]), (words[0], words[0]), "{out}");
        if tty {
            assert!(words[3].starts_with("pts/"), "{out}");
        } else {
            assert_eq!(words[3], "?", "{out}");
        }
        // sshd's environment still.
        let out = with("echo $SSH_CONNECTION; echo tty=$SSH_TTY");
        let mut lines = out.lines();
        let conn = lines.next().unwrap_or_default();
        assert_eq!(conn.split_whitespace().count(), 4, "{out}");
        assert!(conn.starts_with("127.0.0.1 "), "{out}");
        assert_eq!(
            lines
                .next()
                .unwrap_or_default()
                .trim()
                .starts_with("tty=/dev/pts/"),
            tty,
            "{out}"
        );
        // A dropped connection hangs up everything the session started.
        let tt = if tty { "-tt" } else { "-T" };
        let (mut ssh, pid) = c.ssh_running(&cfg, &[tt, &target, "sleep 300 & echo $!; wait"]);
        assert!(pid.parse::<u32>().is_ok(), "{pid:?}");
        ssh.kill().unwrap();
        let _ = ssh.wait();
        assert!(
            eventually(Duration::from_secs(10), || gone(&pid)),
            "the background sleep {pid} outlived its connection (tty: {tty})"
        );
    }
    // A shell killed by a signal is reported as such (through session-exec).
    let r = c.ssh(&cfg, &[&target, "kill -TERM $$"], "");
    assert_eq!(r.code, 255, "{}", r.stderr);
}

/// A client's `KILL` under PAM ends the shell and the PAM session is closed. SIGKILL cannot be
/// passed on, so the agent sends session-exec its own signal for it (`session_exec::KILL_SHELL`,
/// which `ssh.rs`'s `PidSlot` sends for a `KILL` request: unit-tested there); here, that
/// signal as the agent sends it, against the real session-exec, real PAM and a real shell.
#[test]
fn through_pam_a_kill_ends_the_shell_and_closes_the_pam_session() {
    let login = HostLogin::new("kill");
    let log = std::env::temp_dir().join(unique("sallyport-pamlog-"));
    let script = std::env::temp_dir().join(format!("{}.sh", unique("sallyport-pamexec-")));
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$PAM_TYPE\" >> {}\n", log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let service = PamService::new(&format!(
        "account required pam_permit.so\nsession required pam_permit.so\nsession optional pam_exec.so {}\n",
        script.display()
    ));
    let c = with_pam(&service);
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@local1", login.name);
    let (mut ssh, shell) = c.ssh_running(&cfg, &["-tt", &target, "echo $$; exec sleep 300"]);
    assert!(shell.parse::<u32>().is_ok(), "{shell:?}");
    let stat = std::fs::read_to_string(format!("/proc/{shell}/stat")).unwrap();
    let parent = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(1))
        .unwrap()
        .to_string();
    let cmdline = std::fs::read(format!("/proc/{parent}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("session-exec"),
        "the shell's parent is not session-exec: {cmdline:?}"
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap_or_default().trim(),
        "open_session"
    );
    let sent = Command::new("kill")
        .args(["-VTALRM", &parent])
        .status()
        .unwrap();
    assert!(sent.success());
    assert!(
        eventually(Duration::from_secs(10), || gone(&shell)),
        "the shell {shell} outlived the KILL"
    );
    let status = ssh.wait().unwrap();
    // The client is told its command was killed (OpenSSH exits 255 on an exit signal).
    assert_eq!(status.code(), Some(255));
    assert!(
        eventually(Duration::from_secs(10), || {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .lines()
                .any(|l| l == "close_session")
        }),
        "the PAM session was not closed: {:?}",
        std::fs::read_to_string(&log)
    );
    assert!(gone(&parent), "session-exec {parent} is still there");
    let _ = std::fs::remove_file(&log);
    let _ = std::fs::remove_file(&script);
}

/// Kills a process when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn an_agent_on_its_own_reads_pam_from_its_config_file() {
    let login = HostLogin::new("agt");
    let dir = tempfile::tempdir().unwrap();
    let envfile = dir.path().join("environment");
    let marker = unique("standalone-");
    std::fs::write(&envfile, format!("PAMTEST_VAR={marker}\n")).unwrap();
    let service = PamService::new(&format!(
        "account required pam_permit.so\nsession required pam_env.so envfile={}\n",
        envfile.display()
    ));
    let config = dir.path().join("agent.yaml");
    std::fs::write(
        &config,
        format!(
            "version: v1\nssh_service:\n  pam:\n    enabled: true\n    service_name: {}\n",
            service.name
        ),
    )
    .unwrap();
    let c = Cluster::start();
    let token = c.join_token();
    let _agent = Killed(
        c.agent_command(
            "pamnode",
            "",
            Some(&token),
            &c.dir.path().join("agent-pamnode"),
        )
        .arg("--config")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap(),
    );
    c.wait_online("pamnode");
    let home = c.user("alice", "access", &login.name);
    let cfg = c.ssh_config(&home, "alice");
    let target = format!("{}@pamnode", login.name);
    let out = c
        .ssh(&cfg, &[&target, "echo var=$PAMTEST_VAR"], "")
        .ok()
        .stdout;
    assert_eq!(out.trim(), format!("var={marker}"));
}
