//! Nodes as a hostile agent would try them: names that belong to the proxy (`localhost`, IP
//! addresses, the cluster name and anything under it), built-in labels set at join or in a
//! heartbeat, a bogus token probing which names exist, oversized labels, commands and
//! environment values, and `ssh -R` on a privileged port as a login that could not bind it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::*;

/// Runs `cmd` until it exits; one still running after 20 s is stopped and counts as a success
/// (a refused join or start exits at once; an agent that joined keeps running).
fn exits(c: &Cluster, cmd: &mut Command) -> Run {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log = c.dir.path().join(format!("exits-{n}.log"));
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let exited = eventually(Duration::from_secs(20), || {
        child.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = child.kill();
    }
    let code = child.wait().unwrap().code().unwrap_or(-1);
    Run {
        code: if exited { code } else { 0 },
        stdout: String::new(),
        stderr: std::fs::read_to_string(&log).unwrap(),
    }
}

/// An agent's first start with `token`.
fn join(c: &Cluster, name: &str, labels: &str, token: &str) -> Run {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = c.dir.path().join(format!("agent-try-{n}"));
    exits(c, &mut c.agent_command(name, labels, Some(token), &dir))
}

#[test]
fn agents_cannot_take_the_proxys_names() {
    let c = Cluster::start();
    let token = c.join_token();
    for (name, says) in [
        (
            "localhost",
            "node name \"localhost\" is reserved: it names the local machine",
        ),
        (
            "127.0.0.1",
            "node name \"127.0.0.1\" reads as an IP address",
        ),
        ("127.1", "node name \"127.1\" reads as an IP address"),
        ("test", "node name \"test\" is the cluster's name"),
        ("x.test", "node name \"x.test\" ends in .test"),
        ("Web.TEST", "node name \"Web.TEST\" ends in .test"),
    ] {
        join(&c, name, "", &token).fails_with(&format!("joining failed: {says}"));
    }
    // A refused name does not spend the token: the operator fixes the name and joins.
    let mut good = c
        .agent_command("web1", "", Some(&token), &c.dir.path().join("agent-web1"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    c.wait_online("web1");
    let _ = good.kill();
    let _ = good.wait();
    // Refused joins are audited with the reason.
    assert!(c.events("node.join").iter().any(|e| e["success"] == false
        && e["nodename"] == "localhost"
        && e["error"].as_str().unwrap().contains("is reserved")));
    // An agentless node follows the same rules.
    for (name, says) in [
        ("localhost", "is reserved"),
        ("10.0.0.5", "reads as an IP address"),
        ("db.test", "ends in .test"),
    ] {
        c.sallyctl(&["nodes", "add", "--name", name, "--addr", "127.0.0.1:22"])
            .fails_with(says);
    }
    c.sallyctl(&[
        "nodes",
        "add",
        "--name",
        "db1",
        "--addr",
        "127.0.0.1:22",
        "--labels",
        "hostname=web1",
    ])
    .fails_with("label \"hostname\" is built in");
}

#[test]
fn a_bogus_token_learns_nothing_about_names() {
    let c = Cluster::start();
    c.wait_online("local1");
    let answer = "joining failed: invalid join token: it is unknown, expired or already used";
    let taken = join(&c, "local1", "", "0123456789abcdef0123456789abcdef").fails_with(answer);
    let fresh = join(&c, "fresh1", "", "0123456789abcdef0123456789abcdef").fails_with(answer);
    let reserved = join(&c, "localhost", "", "0123456789abcdef0123456789abcdef").fails_with(answer);
    let bad_labels =
        join(&c, "fresh2", "id=x", "0123456789abcdef0123456789abcdef").fails_with(answer);
    for r in [&taken, &fresh, &reserved, &bad_labels] {
        assert!(
            !r.stderr.contains("taken")
                && !r.stderr.contains("reserved")
                && !r.stderr.contains("built in"),
            "{r:?}"
        );
    }
    // A flood of bogus joins is one audit record per address and reason a minute.
    for i in 0..30 {
        let body = format!(
            r#"{{"token":"bogus{i}","nodename":"flood{i}","tls_spki":"","ssh_host_key":""}}"#
        );
        let r = run(
            Command::new("curl")
                .args([
                    "-sk",
                    "-H",
                    "content-type: application/json",
                    "--data",
                    &body,
                ])
                .arg(format!("https://{}/v1/webapi/join", c.proxy)),
            "",
        );
        assert!(r.stdout.contains("invalid join token"), "{r:?}");
    }
    let refused: Vec<_> = c
        .events("node.join")
        .into_iter()
        .filter(|e| e["success"] == false)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:#?}");
    assert_eq!(refused[0]["door"], "join");
    assert_eq!(refused[0]["count"], 1);
    // With a valid token the name is what is wrong, and the answer says so.
    join(&c, "local1", "", &c.join_token()).fails_with("node name local1 is already taken");
}

#[test]
fn built_in_labels_are_refused_at_join_and_in_heartbeats() {
    let c = Cluster::start();
    let token = c.join_token();
    join(&c, "lab1", "hostname=evil,id=x", &token)
        .fails_with("joining failed: label \"hostname\" is built in");
    join(&c, "lab1", "id=local1", &token).fails_with("joining failed: label \"id\" is built in");
    // Sizes: clear errors, not a truncated or dropped label.
    join(&c, "lab1", &format!("big={}", "v".repeat(300)), &token)
        .fails_with("label big is 300 bytes long; a label value has at most 256");
    let many: Vec<String> = (0..65).map(|i| format!("k{i}=v")).collect();
    join(&c, "lab1", &many.join(","), &token).fails_with("a node has at most 64 labels, not 65");

    let mut agent = c.agent("lab1", "env=qa");
    let before = c
        .sallyctl(&["get", "node/lab1", "--format", "json"])
        .ok()
        .stdout;
    // The joined agent restarts with a built-in label: its heartbeat is refused and it says why.
    agent.stop();
    let log = c.dir.path().join("lab1-restart.log");
    let mut restarted = c
        .agent_command("lab1", "env=qa,hostname=local1", None, &agent.dir)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(30), || std::fs::read_to_string(&log)
            .unwrap()
            .contains(
                "the proxy refused this node's heartbeat: label \"hostname\" is built in"
            )),
        "{}",
        std::fs::read_to_string(&log).unwrap()
    );
    let _ = restarted.kill();
    let _ = restarted.wait();
    let after = c
        .sallyctl(&["get", "node/lab1", "--format", "json"])
        .ok()
        .stdout;
    let labels =
        |json: &str| serde_json::from_str::<serde_json::Value>(json).unwrap()["labels"].clone();
    assert_eq!(labels(&after), labels(&before));
    assert_eq!(labels(&after), serde_json::json!({"env": "qa"}));
}

#[test]
fn oversized_commands_and_environment_are_clear_errors() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("olga", "access", "root");
    let cfg = c.ssh_config(&home, "olga");
    let long = format!("echo {}", "x".repeat(70_000));
    c.ssh(&cfg, &["root@local1", &long], "")
        .fails_with("the command is 70005 bytes long; the limit is 65536");
    // Just under the limit runs.
    let fits = format!("echo {} | wc -c", "x".repeat(65_000));
    let r = c.ssh(&cfg, &["root@local1", &fits], "").ok();
    assert_eq!(r.stdout.trim(), "65001");
    let r = run(
        Command::new("ssh")
            .env("LC_HUGE", "y".repeat(5000))
            .arg("-F")
            .arg(&cfg)
            .args([
                "-J",
                "proxy",
                "-o",
                "SendEnv=LC_HUGE",
                "root@local1",
                "true",
            ]),
        "",
    );
    r.fails_with("environment variable LC_HUGE is 5000 bytes long; the limit is 4096");
    let r = run(
        Command::new("ssh")
            .env("LC_FINE", "z".repeat(100))
            .arg("-F")
            .arg(&cfg)
            .args([
                "-J",
                "proxy",
                "-o",
                "SendEnv=LC_FINE",
                "root@local1",
                "echo ${#LC_FINE}",
            ]),
        "",
    )
    .ok();
    assert_eq!(r.stdout, "100\n");
}

/// A port below 1024 nothing listens on, for root to bind.
fn free_privileged_port() -> u16 {
    (600..1000)
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok())
        .expect("a free port below 1000 (the tests run as root)")
}

#[test]
fn remote_forwards_bind_as_the_login_would() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("rita", "access", "root,sallytest");
    let cfg = c.ssh_config(&home, "rita");
    let forward = |login: &str, port: u16| {
        run(
            Command::new("ssh")
                .arg("-F")
                .arg(&cfg)
                .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-R"])
                .arg(format!("127.0.0.1:{port}:127.0.0.1:9"))
                .arg(format!("{login}@local1"))
                .arg("echo bound"),
            "",
        )
    };
    let low = free_privileged_port();
    // sallytest cannot bind a privileged port itself, so it cannot through the agent either.
    let r = forward("sallytest", low);
    assert_ne!(r.code, 0, "{r:?}");
    assert!(
        r.stderr.contains(&format!(
            "remote port forwarding failed for listen port {low}"
        )),
        "{r:?}"
    );
    assert!(std::net::TcpListener::bind(("127.0.0.1", low)).is_ok());
    // An unprivileged port works for sallytest, and the privileged one for root.
    assert_eq!(forward("sallytest", free_port()).ok().stdout, "bound\n");
    assert_eq!(forward("root", low).ok().stdout, "bound\n");
}

#[test]
fn an_all_in_one_start_refuses_a_local_node_named_like_the_proxy() {
    let mut c = Cluster::start();
    c.stop();
    let r = exits(
        &c,
        Command::new(bin("sallyport"))
            .args(["start", "--config"])
            .arg(&c.config)
            .args(["--nodename", "localhost"])
            .env("SALLYPORT_LOG", "warn"),
    );
    r.fails_with("node name \"localhost\" is reserved: it names the local machine everywhere; use the node's own host name; pick one with --nodename");
}

#[test]
fn a_node_registered_under_a_reserved_name_before_is_not_served() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("vera", "access", "root");
    let cfg = c.ssh_config(&home, "vera");
    c.ssh(&cfg, &["root@local1", "true"], "").ok();
    // As a database from before names were checked could hold it.
    c.sqlite("UPDATE nodes SET hostname = 'localhost' WHERE hostname = 'local1';");
    c.ssh(&cfg, &["root@localhost", "true"], "")
        .fails_with("node name \"localhost\" is reserved");
}

/// An agent renews its certificates through its tunnel at two thirds of their life, keeps the
/// renewed ones in its identity file (0600), and stays reachable past the first ones' expiry;
/// a removed node's tunnel is refused at its next heartbeat, renewal or not.
#[test]
fn agents_renew_their_certificates_and_a_removed_node_is_cut_off() {
    use std::os::unix::fs::PermissionsExt;
    let c = Cluster::start_with(sallyport_tests::Options {
        auth_service: vec!["host_cert_ttl: 40s".into()],
        diag_addr: Some("127.0.0.1:0".into()),
        ..Default::default()
    });
    let home = c.user("rena", "access", "root");
    let agent = c.agent("renewed1", "");
    let file = agent.dir.join("agent-identity.json");
    let cert = |f: &std::path::Path| -> (String, i64) {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
        let pem = v["tls_cert_pem"].as_str().unwrap().to_string();
        let der = sallyport_core::x509::pem_to_ders(&pem).unwrap().remove(0);
        let (_, not_after) = sallyport_core::x509::spki_and_expiry(&der).unwrap();
        (pem, not_after)
    };
    let (first, first_end) = cert(&file);
    assert!(
        sallyport_tests::eventually(std::time::Duration::from_secs(60), || cert(&file).0
            != first),
        "the agent's certificate was never renewed"
    );
    assert!(cert(&file).1 > first_end, "the renewal lasts longer");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the identity file keeps its mode");
    // Past the first certificate's end: still online, sessions still open (the host
    // certificate the node's SSH server presents was renewed too).
    while sallyport_core::unix_now() <= first_end + 2 {
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    c.wait_online("renewed1");
    let r = c
        .sally(
            &home,
            &["ssh", "root@renewed1", "--", "echo still-here"],
            "",
        )
        .ok();
    assert!(r.stdout.contains("still-here"), "{r:?}");

    // Removed: no session reaches it from that moment, and its tunnel ends at the next
    // presence report (at most 25 s apart, then a 10 s beat): the proxy's tunnel count drops.
    let tunnels = || {
        let (_, text) = http_get(c.diag.as_deref().unwrap(), "/metrics");
        text.lines()
            .find_map(|l| l.strip_prefix("sallyport_tunnels_connected{kind=\"node\"} "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(tunnels(), 2.0, "the local agent's tunnel and renewed1's");
    c.sallyctl(&["nodes", "rm", "renewed1"]).ok();
    c.sally(&home, &["ssh", "root@renewed1", "--", "true"], "")
        .fails_with("is not registered");
    assert!(!c.node_online("renewed1"));
    assert!(
        sallyport_tests::eventually(std::time::Duration::from_secs(45), || tunnels() == 1.0),
        "the removed node's tunnel is still up: {}",
        tunnels()
    );
}
