//! SSH access end to end with the real OpenSSH client: agents that dial back, ProxyJump through
//! the proxy, `sally ssh`, the role checks and their messages, recording, replay and audit.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sallyport_tests::*;

const PW: &str = "correct horse battery";

fn events(c: &Cluster, kind: &str) -> Vec<serde_json::Value> {
    c.events(kind)
}

#[test]
fn openssh_through_the_proxy_runs_commands_as_the_login() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root,sallytest");
    let cfg = c.ssh_config(&home, "alice");
    // The exit code of the remote command is the client's.
    let r = c.ssh(&cfg, &["root@local1", "echo out; echo err >&2; exit 3"], "");
    assert_eq!(r.code, 3, "{r:?}");
    assert_eq!(r.stdout, "out\n");
    assert!(r.stderr.contains("err"), "{r:?}");
    // stdin EOF reaches the command.
    let r = c.ssh(&cfg, &["root@local1", "cat"], "hi\n").ok();
    assert_eq!(r.stdout, "hi\n");
    // The session runs as the login: its user, home and shell come from the system.
    let r = c
        .ssh(
            &cfg,
            &["sallytest@local1", "id -un; echo $HOME; echo $USER"],
            "",
        )
        .ok();
    assert_eq!(
        r.stdout, "sallytest\n/home/sallytest\nsallytest\n",
        "run scripts/test, which creates the sallytest user"
    );
    // A terminal when asked for one.
    let r = c
        .ssh(&cfg, &["-tt", "root@local1", "tty; echo $TERM"], "")
        .ok();
    assert!(r.stdout.contains("/dev/pts/"), "{r:?}");
    // By name.cluster too, and the host is verified through the host CA with no prompt.
    c.ssh(&cfg, &["root@local1.test", "true"], "").ok();
    // The proxy itself runs nothing.
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["proxy", "true"]),
        "",
    );
    assert_ne!(r.code, 0);
    assert!(r.stderr.contains("the proxy runs nothing itself"), "{r:?}");
}

#[test]
fn sally_ssh_ls_and_label_selectors() {
    let c = Cluster::start();
    let _a = c.agent("web1", "env=staging,team=web");
    let _b = c.agent("web2", "env=staging,team=db");
    let home = c.user("bob", "access", "root");
    let ls: serde_json::Value =
        serde_json::from_str(&c.sally(&home, &["ls", "--format", "json"], "").ok().stdout).unwrap();
    let names: Vec<&str> = ls
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["hostname"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"web1") && names.contains(&"web2") && names.contains(&"local1"),
        "{ls}"
    );
    for n in ls.as_array().unwrap() {
        assert_eq!(n["online"], true);
        assert!(n["id"].is_string() && n["labels"].is_object());
    }
    let filtered = c.sally(&home, &["ls", "team=db"], "").ok().stdout;
    assert!(
        filtered.contains("web2") && !filtered.contains("web1"),
        "{filtered}"
    );

    let r = c.sally(
        &home,
        &[
            "ssh",
            "root@web1",
            "echo",
            "hello from",
            "$(hostname)",
            ";",
            "exit",
            "5",
        ],
        "",
    );
    assert_eq!(r.code, 5, "{r:?}");
    assert!(r.stdout.starts_with("hello from"), "{r:?}");
    let r = c
        .sally(&home, &["ssh", "-l", "root", "web2", "cat"], "piped\n")
        .ok();
    assert_eq!(r.stdout, "piped\n");
    // A label selector runs on every matching node, output prefixed by node name.
    let r = c
        .sally(&home, &["ssh", "root@env=staging", "echo", "hi"], "")
        .ok();
    let mut lines: Vec<&str> = r.stdout.lines().collect();
    lines.sort();
    assert_eq!(lines, ["[web1] hi", "[web2] hi"]);
    c.sally(&home, &["ssh", "root@env=nowhere", "true"], "")
        .fails_with("no node you can reach matches env=nowhere");

    // `sally config` makes plain OpenSSH work with no other setup.
    let cfg_text = c.sally(&home, &["config"], "").ok().stdout;
    let cfg = home.join("generated_config");
    std::fs::write(&cfg, format!("{cfg_text}Host *\n  BatchMode yes\n")).unwrap();
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["root@web2.test", "echo via-config"]),
        "",
    )
    .ok();
    assert_eq!(r.stdout, "via-config\n");
}

/// A session starts with no signal ignored or blocked, as under sshd, whatever the agent's own
/// (Rust ignores SIGPIPE; a daemon started from a script may ignore SIGQUIT): a pipeline whose
/// reader quits just ends.
#[test]
fn a_session_starts_with_every_signal_at_its_default() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("sig", "access", "root");
    let cfg = c.ssh_config(&home, "sig");
    for tty in [false, true] {
        let mut args = vec![];
        if tty {
            args.push("-tt");
        }
        args.extend([
            "root@local1",
            "grep -E '^Sig(Blk|Ign)' /proc/self/status; yes | head -1",
        ]);
        let r = c.ssh(&cfg, &args, "").ok();
        let out = r.stdout.replace('\r', "");
        assert!(
            out.contains("SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\ny\n"),
            "tty {tty}: {out:?} / {}",
            r.stderr
        );
    }
}

/// The proxy starts the node's key exchange while auth decides a session (dial.rs,
/// `dials_ahead`): the roles' refusal must still be the answer, whatever the node's state,
/// and a session that is allowed still learns that the node is gone.
#[test]
fn a_refusal_wins_over_an_offline_node_and_an_allowed_session_hears_it_is_offline() {
    let c = Cluster::start();
    let mut prod = c.agent("db1", "env=prod");
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: staging-only}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {env: [dev, staging]}\n---\nkind: role\nversion: v1\nmetadata: {name: all-root}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("db1");
    let home = c.user("carol", "staging-only", "");
    let cfg = c.ssh_config(&home, "carol");
    let home2 = c.user("dan", "all-root", "");
    let cfg2 = c.ssh_config(&home2, "dan");
    c.ssh(&cfg2, &["root@db1", "echo before"], "").ok();
    prod.stop();
    for _ in 0..3 {
        let r = c.ssh(&cfg, &["root@db1", "true"], "");
        assert!(!r.stderr.contains("offline"), "{}", r.stderr);
        r.fails_with("only on nodes with other labels");
    }
    c.ssh(&cfg2, &["root@db1", "true"], "")
        .fails_with("offline");
    // Nothing else disturbed: the local node still serves both.
    c.ssh(&cfg2, &["root@local1", "echo still"], "").ok();
}

#[test]
fn refusals_say_why_and_are_audited() {
    let c = Cluster::start();
    let _prod = c.agent("db1", "env=prod");
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: staging-only}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {env: [dev, staging]}\n---\nkind: role\nversion: v1\nmetadata: {name: no-local}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n  deny:\n    node_labels: {hostname: local1}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("carol", "staging-only", "");
    let cfg = c.ssh_config(&home, "carol");
    // A login the roles do not allow.
    c.ssh(&cfg, &["bob@local1", "true"], "")
        .fails_with("no role allows login bob");
    // A node whose labels the roles do not match.
    c.ssh(&cfg, &["root@db1", "true"], "")
        .fails_with("only on nodes with other labels");
    // An unknown node.
    c.ssh(&cfg, &["root@nosuch", "true"], "")
        .fails_with("node nosuch is not registered");
    // A deny rule.
    let home2 = c.user("dan", "no-local", "");
    let cfg2 = c.ssh_config(&home2, "dan");
    c.ssh(&cfg2, &["root@local1", "true"], "")
        .fails_with("role no-local denies nodes with labels hostname=local1");
    c.ssh(&cfg2, &["root@db1", "echo allowed"], "").ok();
    // A login that does not exist on the node.
    let home3 = c.user("erin", "access", "nosuchlogin");
    let cfg3 = c.ssh_config(&home3, "erin");
    c.ssh(&cfg3, &["nosuchlogin@local1", "true"], "")
        .fails_with("login nosuchlogin does not exist on node local1");
    let rejected = events(&c, "session.reject");
    assert!(
        rejected.iter().any(|e| e["user"] == "carol"
            && e["login"] == "bob"
            && e["reason"]
                .as_str()
                .unwrap()
                .contains("no role allows login bob")),
        "{rejected:?}"
    );
    assert!(
        rejected
            .iter()
            .any(|e| e["user"] == "dan" && e["reason"].as_str().unwrap().contains("denies")),
        "{rejected:?}"
    );

    // A certificate from another cluster's CA is refused.
    let other = Cluster::start();
    let stranger = other.user("mallory", "access", "root");
    let keys = stranger.join("keys").join(other.proxy.replace(':', "_"));
    let cfg4 = home.join("stranger_config");
    std::fs::write(
        &cfg4,
        format!(
            "Host proxy\n  HostName 127.0.0.1\n  Port {}\n  User root\nHost *\n  UserKnownHostsFile {}\n  IdentityFile {}\n  CertificateFile {}-cert.pub\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n  BatchMode yes\n",
            c.ssh_port,
            home.join("known_hosts").display(),
            keys.join("mallory").display(),
            keys.join("mallory").display()
        ),
    )
    .unwrap();
    c.ssh(&cfg4, &["root@local1", "true"], "")
        .fails_with("Permission denied (publickey)");
}

#[test]
fn expired_certificates_are_refused_with_the_reason() {
    let c = Cluster::start();
    c.wait_online("local1");
    let token = c.add_user("fay", "access", "root");
    c.signup(&token, PW);
    let home = c.dir.path().join("fay");
    c.sally(
        &home,
        &[
            "login", "--proxy", &c.proxy, "--user", "fay", "--ca-pin", &c.pin, "--ttl", "1m",
        ],
        &format!("{PW}\n"),
    )
    .ok();
    let cfg = c.ssh_config(&home, "fay");
    c.ssh(&cfg, &["root@local1", "true"], "").ok();
    let generated = home.join("generated_config");
    std::fs::write(
        &generated,
        format!(
            "{}Host *\n  BatchMode yes\n",
            c.sally(&home, &["config"], "").ok().stdout
        ),
    )
    .unwrap();
    std::thread::sleep(Duration::from_secs(62));
    // Plain ProxyJump: the proxy refuses the expired certificate at the SSH layer.
    c.ssh(&cfg, &["root@local1", "true"], "")
        .fails_with("Permission denied (publickey)");
    // Through `sally config` and `sally ssh`, the person reads why and what to do.
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&generated)
            .args(["root@local1.test", "true"]),
        "",
    );
    r.fails_with("expired at").fails_with("run `sally login");
    c.sally(&home, &["ssh", "root@local1", "true"], "")
        .fails_with("expired at");
}

#[test]
fn sessions_are_recorded_replayed_and_audited() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("gus", "access", "root");
    let auditor = c.user("audrey", "auditor", "");
    let cfg = c.ssh_config(&home, "gus");
    c.ssh(
        &cfg,
        &["root@local1", "printf 'line one\\nline two\\n'; exit 4"],
        "",
    )
    .fails_with("");
    c.ssh(&cfg, &["-tt", "root@local1", "echo in-a-tty"], "")
        .ok();
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    let sessions = list.as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{list}");
    let first = sessions
        .iter()
        .find(|s| {
            s["command"]
                .as_str()
                .is_some_and(|c| c.contains("line one"))
        })
        .unwrap();
    for k in [
        "session_id",
        "user",
        "login",
        "node",
        "start",
        "end",
        "exit_code",
    ] {
        assert!(!first[k].is_null(), "{k} missing: {first}");
    }
    assert_eq!(
        (
            first["user"].as_str(),
            first["login"].as_str(),
            first["node"].as_str(),
            first["exit_code"].as_i64()
        ),
        (Some("gus"), Some("root"), Some("local1"), Some(4))
    );
    let id = first["session_id"].as_str().unwrap();
    let text = c
        .sally(&home, &["play", id, "--format", "text"], "")
        .ok()
        .stdout;
    assert_eq!(text, "line one\nline two\n");
    // The raw recording is asciicast v2 that asciinema plays.
    let cast = c
        .sally(&auditor, &["play", id, "--format", "asciicast"], "")
        .ok()
        .stdout;
    let mut lines = cast.lines();
    let header: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(header["version"], 2);
    assert!(
        header["width"].as_u64().is_some()
            && header["height"].as_u64().is_some()
            && header["timestamp"].as_i64().is_some()
    );
    assert!(header["env"]["TERM"].is_string());
    let ev: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
    assert_eq!(ev[1], "o");
    // Replay with timing prints the same output.
    let played = c
        .sally(&home, &["play", id, "--speed", "10"], "")
        .ok()
        .stdout;
    assert_eq!(played, "line one\nline two\n");
    let tty_id = sessions
        .iter()
        .find(|s| s["command"] == "echo in-a-tty")
        .unwrap()["session_id"]
        .as_str()
        .unwrap();
    let tty_cast = c
        .sally(&home, &["play", tty_id, "--format", "asciicast"], "")
        .ok()
        .stdout;
    assert!(
        tty_cast.contains("in-a-tty") && tty_cast.contains("\"xterm")
            || tty_cast.contains("in-a-tty"),
        "{tty_cast}"
    );
    // Another user cannot read gus's recordings; the auditor can.
    let other = c.user("hal", "access", "root");
    c.sally(&other, &["play", id], "")
        .fails_with("belongs to another user");
    let auditor_list = c.sally(&auditor, &["recordings", "ls"], "").ok().stdout;
    assert!(auditor_list.contains("gus"));
    // Audit: start, end (exit code, bytes, duration), exec.
    let ends = events(&c, "session.end");
    let end = ends.iter().find(|e| e["session_id"] == id).unwrap();
    assert_eq!(end["exit_code"], 4);
    assert!(
        end["bytes_out"].as_u64().unwrap() >= 18 && end["duration_secs"].is_i64(),
        "{end}"
    );
    let execs = events(&c, "exec");
    assert!(
        execs.iter().any(|e| e["session_id"] == id
            && e["command"].as_str().unwrap().contains("line one")
            && e["exit_code"] == 4),
        "{execs:?}"
    );
    assert!(
        events(&c, "session.start")
            .iter()
            .any(|e| e["session_id"] == id && e["node"] == "local1")
    );
    assert!(
        events(&c, "node.join")
            .iter()
            .any(|e| e["nodename"] == "local1" && e["success"] == true)
    );
}

#[test]
fn agents_join_once_reconnect_and_keep_their_names() {
    let mut c = Cluster::start();
    let mut a = c.agent("app1", "env=qa");
    let home = c.user("ivy", "access", "root");
    c.sally(&home, &["ssh", "root@app1", "true"], "").ok();
    // A token works once.
    let token = c.join_token();
    let dir1 = c.dir.path().join("agent-x1");
    let dir2 = c.dir.path().join("agent-x2");
    let mut first = c
        .agent_command("x1", "", Some(&token), &dir1)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    c.wait_online("x1");
    let second = run(&mut c.agent_command("x2", "", Some(&token), &dir2), "");
    second.fails_with("already used");
    let _ = first.kill();
    let _ = first.wait();
    // A name is taken once.
    let dup = run(
        &mut c.agent_command(
            "app1",
            "",
            Some(&c.join_token()),
            &c.dir.path().join("agent-dup"),
        ),
        "",
    );
    dup.fails_with("node name app1 is already taken");
    // Restarting an agent reuses its identity: no token needed, same id.
    let id_before = c
        .sallyctl(&["get", "node/app1", "--format", "json"])
        .ok()
        .stdout;
    c.restart_agent(&mut a);
    c.wait_online("app1");
    assert_eq!(
        c.sallyctl(&["get", "node/app1", "--format", "json"])
            .ok()
            .stdout,
        id_before
    );
    // A proxy restart brings the agent back by itself.
    c.stop();
    c.boot();
    c.wait_online("app1");
    let r = c.sally(&home, &["ssh", "root@app1", "echo back"], "").ok();
    assert_eq!(r.stdout, "back\n");
}

#[test]
fn a_proxy_killed_mid_session_leaves_a_readable_recording_marked_incomplete() {
    let mut c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("kim", "access", "root");
    let mut session = Command::new(bin("sally"))
        .env("SALLY_HOME", &home)
        .args(["ssh", "root@local1", "echo before-the-crash; sleep 30"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(session.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).unwrap();
    assert_eq!(line, "before-the-crash\n");
    // Give the recorder its flush interval, then kill the proxy without warning.
    std::thread::sleep(Duration::from_millis(1500));
    c.stop();
    let _ = session.kill();
    let _ = session.wait();
    c.boot();
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    let s = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| {
            s["command"]
                .as_str()
                .is_some_and(|c| c.contains("before-the-crash"))
        })
        .unwrap();
    assert_eq!(s["status"], "incomplete", "{s}");
    let text = c
        .sally(
            &home,
            &[
                "play",
                s["session_id"].as_str().unwrap(),
                "--format",
                "text",
            ],
            "",
        )
        .ok()
        .stdout;
    assert_eq!(text, "before-the-crash\n");
}

#[test]
fn strict_recording_refuses_a_session_that_cannot_be_recorded() {
    let c = Cluster::start();
    c.wait_online("local1");
    let f = c.dir.path().join("strict.yaml");
    std::fs::write(
        &f,
        "kind: role\nversion: v1\nmetadata: {name: strict}\nspec:\n  options: {record_session: {ssh: strict}}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .unwrap();
    c.sallyctl(&["create", &f.display().to_string()]).ok();
    let strict = c.user("sam", "strict", "");
    let relaxed = c.user("rex", "access", "root");
    // Recordings cannot be written: their directory is now a file.
    let rec = c.data_dir().join("recordings");
    let _ = std::fs::remove_dir_all(&rec);
    std::fs::write(&rec, "not a directory").unwrap();
    c.sally(
        &strict,
        &["ssh", "root@local1", "echo", "should not run"],
        "",
    )
    .fails_with("must be recorded (record_session: strict) and the recording failed");
    // best_effort (the default) carries on unrecorded.
    let r = c
        .sally(&relaxed, &["ssh", "root@local1", "echo", "runs"], "")
        .ok();
    assert_eq!(r.stdout, "runs\n");
}

#[test]
fn a_lock_stops_a_user_everywhere_at_once_and_lifts_cleanly() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let bob = c.user("bob", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let bob_cfg = c.ssh_config(&bob, "bob");
    // A live session, to be ended by the lock.
    let live = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-J", "proxy", "root@local1", "sleep 60; echo finished"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // Only those allowed to lock may: alice's roles do not allow it.
    c.sallyctl_as(&home, &["lock", "--user", "bob"])
        .fails_with("lacks `create` on `lock`");
    let lock: serde_json::Value = serde_json::from_str(
        &c.sallyctl(&[
            "lock",
            "--user",
            "alice",
            "--message",
            "incident 42",
            "--format",
            "json",
        ])
        .ok()
        .stdout,
    )
    .unwrap();
    let id = lock["id"].as_str().unwrap().to_string();
    // The live connection ends within the proxy's poll.
    let started = std::time::Instant::now();
    let out = live.wait_with_output().unwrap();
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(!String::from_utf8_lossy(&out.stdout).contains("finished"));
    // Nothing new gets through, and every refusal says why.
    assert!(eventually(Duration::from_secs(10), || {
        c.ssh(&cfg, &["root@local1", "true"], "")
            .stderr
            .contains("user alice is locked: incident 42")
    }));
    c.sally(&home, &["ssh", "root@local1", "true"], "")
        .fails_with("locked: incident 42");
    c.sally(&home, &["ls"], "")
        .fails_with("locked: incident 42");
    c.login(&home, "alice", PW)
        .fails_with("locked: incident 42");
    // Nobody else is disturbed.
    assert_eq!(
        c.ssh(&bob_cfg, &["root@local1", "echo bob-ok"], "")
            .ok()
            .stdout,
        "bob-ok\n"
    );
    let listed = c.sallyctl(&["get", "locks"]).ok().stdout;
    assert!(
        listed.contains(&id) && listed.contains("incident 42"),
        "{listed}"
    );
    assert!(!events(&c, "lock.create").is_empty());
    // Lifted: alice is back within the proxy's poll.
    c.sallyctl(&["rm", &format!("lock/{id}")]).ok();
    assert!(eventually(Duration::from_secs(10), || {
        c.ssh(&cfg, &["root@local1", "true"], "").code == 0
    }));
    c.login(&home, "alice", PW).ok();
    // A lock with a ttl ends by itself.
    c.sallyctl(&["lock", "--user", "bob", "--ttl", "3s"]).ok();
    assert!(eventually(Duration::from_secs(10), || {
        c.ssh(&bob_cfg, &["root@local1", "true"], "").code != 0
    }));
    assert!(eventually(Duration::from_secs(15), || {
        c.ssh(&bob_cfg, &["root@local1", "true"], "").code == 0
    }));
    c.sallyctl(&["lock", "--user", "nosuch"])
        .fails_with("user nosuch does not exist");
}

#[test]
fn idle_sessions_end_but_busy_ones_do_not() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: impatient}\nspec:\n  options: {client_idle_timeout: 3s}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("ivy", "impatient", "");
    let cfg = c.ssh_config(&home, "ivy");
    // Quiet for longer than the timeout: ended, with the reason.
    let started = std::time::Instant::now();
    let r = c.ssh(&cfg, &["root@local1", "sleep 8; echo late"], "");
    assert!(started.elapsed() < Duration::from_secs(7), "{r:?}");
    assert!(!r.stdout.contains("late"), "{r:?}");
    assert!(r.stderr.contains("client_idle_timeout"), "{r:?}");
    // Busy for longer than the timeout: output every second keeps it alive.
    let r = c
        .ssh(
            &cfg,
            &[
                "root@local1",
                "for i in 1 2 3 4 5 6; do echo tick; sleep 1; done; echo done",
            ],
            "",
        )
        .ok();
    assert!(r.stdout.ends_with("done\n"), "{r:?}");
}

#[test]
fn disconnect_expired_cert_ends_the_session_when_the_certificate_expires() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: strict-cert}\nspec:\n  options: {disconnect_expired_cert: true}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("kim", "strict-cert", "");
    // A certificate good for the shortest time a login gives: one minute.
    let r = c.sally(
        &home,
        &[
            "login", "--proxy", &c.proxy, "--user", "kim", "--ca-pin", &c.pin, "--ttl", "1m",
        ],
        &format!("{PW}\n"),
    );
    r.ok();
    let cfg = c.ssh_config(&home, "kim");
    let started = std::time::Instant::now();
    let r = c.ssh(&cfg, &["root@local1", "sleep 150; echo late"], "");
    assert!(started.elapsed() < Duration::from_secs(90), "{r:?}");
    assert!(!r.stdout.contains("late"), "{r:?}");
    assert!(r.stderr.contains("certificate expired"), "{r:?}");
}

/// The .cast text of `user`'s session that ran `command`, read by an auditor.
fn cast_of(c: &Cluster, auditor: &Path, user: &str, command: &str) -> Option<String> {
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(auditor, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .ok()?;
    let id = list
        .as_array()?
        .iter()
        .find(|s| s["user"] == user && s["command"] == command)?["session_id"]
        .as_str()?
        .to_string();
    std::fs::read_to_string(c.data_dir().join("recordings").join(format!("{id}.cast"))).ok()
}

#[test]
fn input_is_recorded_only_when_a_role_asks_for_it() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: keys}\nspec:\n  options: {record_input: true}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let auditor = c.user("audrey", "auditor", "");
    let command = "read secret; echo got-it";
    for (user, role, logins, recorded) in
        [("pat", "access", "root", false), ("kim", "keys", "", true)]
    {
        let home = c.user(user, role, logins);
        let cfg = c.ssh_config(&home, user);
        let r = c
            .ssh(&cfg, &["root@local1", command], "hunter2-piped-secret\n")
            .ok();
        assert_eq!(r.stdout, "got-it\n");
        let mut cast = None;
        assert!(eventually(Duration::from_secs(10), || {
            cast = cast_of(&c, &auditor, user, command);
            cast.as_deref().is_some_and(|t| t.contains("got-it"))
        }));
        let cast = cast.unwrap();
        let inputs = cast
            .lines()
            .skip(1)
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|e| e[1] == "i")
            .count();
        assert_eq!(
            cast.contains("hunter2-piped-secret"),
            recorded,
            "{user}: {cast}"
        );
        assert_eq!(inputs > 0, recorded, "{user}: {cast}");
    }
}

#[test]
fn a_target_name_reaches_no_other_route_of_auth() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let all_events = || c.sallyctl(&["audit", "search"]).ok().stdout.lines().count();
    let before = all_events();
    for target in [
        "../oidc/callback#",
        "../../v1/ping?x=",
        "local1/../../v1/locks",
        "..",
        "%2e%2e",
        "a b",
    ] {
        let r = run(
            Command::new("ssh")
                .arg("-F")
                .arg(&cfg)
                .arg("-W")
                .arg(format!("{target}:22"))
                .arg("proxy"),
            "",
        );
        r.fails_with(&format!("no node named {target:?}"));
    }
    // Nothing was reached: not one audit event more.
    assert_eq!(all_events(), before);
    // A real node is still reached by each of its names.
    c.ssh(&cfg, &["root@local1.test", "echo by-cluster-name"], "")
        .ok();
}

#[test]
fn max_sessions_caps_session_channels_on_one_connection() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: two}\nspec:\n  options: {max_sessions: 2}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    for (user, role, logins, cap) in [("tess", "two", "", 2), ("ulla", "access", "root", 10)] {
        let home = c.user(user, role, logins);
        let cfg = c.ssh_config(&home, user);
        let control = c.dir.path().join(format!("cm-{user}-%C"));
        let mux = |args: &[&str]| {
            let mut cmd = Command::new("ssh");
            cmd.arg("-F")
                .arg(&cfg)
                .args([
                    "-J",
                    "proxy",
                    "-o",
                    "ControlMaster=auto",
                    "-o",
                    "ControlPersist=30s",
                ])
                .arg("-o")
                .arg(format!("ControlPath={}", control.display()))
                .args(args);
            cmd
        };
        let spawn = |cmd: &str| {
            mux(&["root@local1", cmd])
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        // The first starts the master connection; the others are channels on it.
        let mut running = vec![spawn("sleep 9; echo done-0")];
        std::thread::sleep(Duration::from_secs(1));
        for i in 1..cap {
            running.push(spawn(&format!("sleep 8; echo done-{i}")));
        }
        std::thread::sleep(Duration::from_millis(1500));
        // One more session channel on the same connection is refused (OpenSSH then falls back
        // to a connection of its own, where it is the first). Asked again, it is refused again,
        // by the proxy alone: a loop of channel opens neither reaches auth nor fills the log.
        for _ in 0..3 {
            let r = run(&mut mux(&["root@local1", "echo extra"]), "");
            assert!(
                r.stderr.contains("Session open refused by peer"),
                "{user}: {r:?}"
            );
        }
        for (i, child) in running.into_iter().enumerate() {
            let out = child.wait_with_output().unwrap();
            assert_eq!(
                String::from_utf8_lossy(&out.stdout),
                format!("done-{i}\n"),
                "{user}"
            );
        }
        // Once they ended, there is room again on the same connection.
        let r = run(&mut mux(&["root@local1", "echo again"]), "").ok();
        assert_eq!(r.stdout, "again\n");
        assert!(!r.stderr.contains("refused"), "{r:?}");
        run(&mut mux(&["-O", "exit", "root@local1"]), "");
        let want = format!("max_sessions: {cap}");
        let rejected = events(&c, "session.reject")
            .into_iter()
            .filter(|e| {
                e["user"] == user && e["reason"].as_str().is_some_and(|r| r.contains(&want))
            })
            .count();
        assert_eq!(rejected, 1, "{user}: session.reject with {want:?}");
    }
}

#[test]
fn max_connections_caps_a_users_open_connections() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: one}\nspec:\n  options: {max_connections: 1}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("olga", "one", "");
    let cfg = c.ssh_config(&home, "olga");
    let first = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-J", "proxy", "root@local1", "sleep 4; echo first"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(1));
    // The second connection is refused while the first is open; the first is unharmed.
    c.ssh(&cfg, &["root@local1", "echo second"], "")
        .fails_with("max_connections: 1");
    let out = first.wait_with_output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "first\n");
    // Then there is room again.
    let r = c.ssh(&cfg, &["root@local1", "echo third"], "").ok();
    assert_eq!(r.stdout, "third\n");
    // Another user is not counted against olga.
    let other = c.user("otto", "one", "");
    let ocfg = c.ssh_config(&other, "otto");
    c.ssh(&ocfg, &["root@local1", "true"], "").ok();
}

#[test]
fn a_recording_past_max_recording_size_ends_a_strict_session_and_stops_otherwise() {
    let mut c = Cluster::start();
    // A small limit, set in the configuration and read at start.
    let config = std::fs::read_to_string(&c.config).unwrap();
    std::fs::write(
        &c.config,
        config.replace(
            "proxy_service:\n",
            "proxy_service:\n  max_recording_size: 64KiB\n",
        ),
    )
    .unwrap();
    c.stop();
    c.boot();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: strict}\nspec:\n  options: {record_session: {ssh: strict}}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let auditor = c.user("audrey", "auditor", "");
    // About 1.3 MB of output, twenty times the limit, slowly enough to be cut mid-way.
    let command = "seq 1 200000";
    let full = (1..=200000).map(|i| format!("{i}\n")).collect::<String>();

    let relaxed = c.user("rex", "access", "root");
    let cfg = c.ssh_config(&relaxed, "rex");
    let r = c.ssh(&cfg, &["root@local1", command], "").ok();
    assert_eq!(r.stdout.len(), full.len(), "best_effort sessions go on");

    let strict = c.user("sam", "strict", "");
    let cfg = c.ssh_config(&strict, "sam");
    let r = c
        .ssh(&cfg, &["root@local1", command], "")
        .fails_with("recording reached max_recording_size");
    assert!(r.stdout.len() < full.len() / 2, "{}", r.stdout.len());
    assert!(full.starts_with(&r.stdout));
    let shown_strict = r.stdout.clone();

    for (user, action) in [("rex", "recording stopped"), ("sam", "session ended")] {
        let mut cast = None;
        assert!(eventually(Duration::from_secs(10), || {
            cast = cast_of(&c, &auditor, user, command);
            cast.is_some()
        }));
        let cast = cast.unwrap();
        assert!(
            cast.len() <= 64 * 1024 && cast.len() > 32 * 1024,
            "{user}: {}",
            cast.len()
        );
        assert!(
            eventually(Duration::from_secs(10), || {
                events(&c, "session.recording_limit")
                    .iter()
                    .any(|e| e["user"] == user && e["action"] == action)
            }),
            "{user}: no session.recording_limit event"
        );
        if user == "sam" {
            // Under strict the person saw nothing the recording lacks: what reached the
            // client is a prefix of the recorded output (the writer running behind the relay
            // must not let queued output through first).
            let recorded: String = cast
                .lines()
                .skip(1)
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|e| e[1] == "o")
                .map(|e| e[2].as_str().unwrap_or_default().to_string())
                .collect();
            assert!(
                recorded.starts_with(&shown_strict),
                "shown {} bytes, recorded {}",
                shown_strict.len(),
                recorded.len()
            );
            assert!(shown_strict.len() > 32 * 1024, "{}", shown_strict.len());
        }
    }
}

#[test]
fn a_large_recording_plays_back_whole_as_it_streams() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("lea", "access", "root");
    let cfg = c.ssh_config(&home, "lea");
    // A few MB of output: many chunks of the streamed body, lines cut across them.
    let command = "seq 1 400000";
    let r = c.ssh(&cfg, &["root@local1", command], "").ok();
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    let id = list
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["command"] == command)
        .unwrap()["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let text = c
        .sally(&home, &["play", &id, "--format", "text"], "")
        .ok()
        .stdout;
    assert!(
        text == r.stdout,
        "{} bytes played, {} shown",
        text.len(),
        r.stdout.len()
    );
    let cast = c
        .sally(&home, &["play", &id, "--format", "asciicast"], "")
        .ok()
        .stdout;
    let file = std::fs::read_to_string(c.data_dir().join("recordings").join(format!("{id}.cast")))
        .unwrap();
    assert!(
        cast == file,
        "{} bytes fetched, {} on disk",
        cast.len(),
        file.len()
    );
}

#[test]
fn one_connection_to_the_proxy_carries_at_most_ten_jumps_at_once() {
    use std::io::BufRead;
    use std::process::{Child, Stdio};
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("jo", "access", "root");
    let cfg = c.ssh_config(&home, "jo");
    let control = c.dir.path().join("cm-jumps");
    let log = c.dir.path().join("master.log");
    let control_path = format!("ControlPath={}", control.display());
    // A master connection to the proxy itself; every `ssh -W` below is a direct-tcpip
    // channel on it, an inner connection to the node.
    let mut master = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-N", "-o", "ControlMaster=yes", "-o", &control_path, "-E"])
        .arg(&log)
        .arg("proxy")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let jump = || {
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-o", &control_path, "-W", "local1:22", "proxy"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // A jump is open when the node's side greets (the inner server's version line).
    let greeted = |child: &mut Child| {
        let mut line = String::new();
        let out = child.stdout.as_mut().unwrap();
        let _ = std::io::BufReader::new(out).read_line(&mut line);
        line.starts_with("SSH-2.0-")
    };
    assert!(
        eventually(Duration::from_secs(15), || control.exists()),
        "the master never listened"
    );
    let mut open: Vec<Child> = Vec::new();
    for i in 0..10 {
        let mut j = jump();
        assert!(greeted(&mut j), "jump {i} was not opened");
        open.push(j);
    }
    // The eleventh at once is refused; the master is told why (OpenSSH's mux client only says
    // the peer refused).
    let mut extra = jump();
    assert!(!greeted(&mut extra));
    let out = extra.wait_with_output().unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused by peer"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reason = "this connection to the proxy already carries 10 connections to nodes, the most allowed (proxy_service.max_jumps_per_connection: 10); open another connection to the proxy";
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains(reason)),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    // One ends: there is room for one more on the same connection.
    let mut first = open.remove(0);
    let _ = first.kill();
    let _ = first.wait();
    assert!(eventually(Duration::from_secs(10), || {
        let mut j = jump();
        let ok = greeted(&mut j);
        if ok {
            open.push(j);
        } else {
            let _ = j.kill();
            let _ = j.wait();
        }
        ok
    }));
    for mut j in open {
        let _ = j.kill();
        let _ = j.wait();
    }
    let _ = master.kill();
    let _ = master.wait();
}

/// The replies to its requests as `ssh -vv` read them ("PTY allocation request accepted"), in
/// the order it matched them to its requests.
fn openssh_replies(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter_map(|l| {
            let l = l.trim_start_matches("debug2: ");
            l.split_once(" on channel ").map(|(what, _)| what)
        })
        .filter(|what| what.ends_with(" request accepted") || what.ends_with(" request failed"))
        .collect()
}

/// RFC 4254 §5.4: replies to channel requests come in the order the requests did, and OpenSSH
/// matches them by that order. It sends a session's requests back to back without waiting:
/// here X11 (refused by the proxy at once: the roles do not permit it), a terminal (the node
/// answers it, later), an environment variable (no reply wanted) and the command (the node
/// answers). Before, russh kept one "wants a reply" flag per channel, which each request
/// overwrote: the environment's cleared it, the X11 refusal took the command's, and the node's
/// answers to the terminal and the command were dropped.
#[test]
fn replies_to_pipelined_requests_reach_openssh_in_order_one_each() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("rhea", "access", "root");
    let cfg = c.ssh_config(&home, "rhea");
    let r = run(
        Command::new("ssh")
            // A display makes OpenSSH ask for X11 (with made-up credentials, without xauth).
            .env("DISPLAY", "127.0.0.1:97")
            .arg("-F")
            .arg(&cfg)
            .args([
                "-J",
                "proxy",
                "-vv",
                "-tt",
                "-X",
                "-o",
                "SetEnv=SALLYPORT_REPLY_TEST=1",
                "root@local1",
                "echo ran",
            ]),
        "",
    );
    assert_eq!(
        openssh_replies(&r.stderr),
        [
            "X11 forwarding request failed",
            "PTY allocation request accepted",
            "exec request accepted"
        ],
        "{r:?}"
    );
    assert_eq!(r.code, 0, "{r:?}");
    assert!(r.stdout.contains("ran"), "{r:?}");
    assert!(r.stderr.contains("permit_x11_forwarding"), "{r:?}");

    // A command the proxy refuses at once (a file copy, under `ssh_file_copy: false`) after a
    // terminal the node is still answering: its answer waits for the node's, which is not
    // turned into a failure by the session's end (OpenSSH would quit on "PTY allocation
    // request failed" with `-tt`, before showing why).
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: no-copy}\nspec:\n  options: {ssh_file_copy: false}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    let home = c.user("remo", "no-copy", "");
    let cfg = c.ssh_config(&home, "remo");
    let r = c.ssh(&cfg, &["-vv", "-tt", "root@local1", "scp -t /tmp"], "");
    assert_eq!(
        openssh_replies(&r.stderr),
        ["PTY allocation request accepted", "exec request accepted"],
        "{r:?}"
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert!(
        r.stderr
            .contains("file copy (scp, sftp, rsync) is not allowed by your roles"),
        "{r:?}"
    );
}
