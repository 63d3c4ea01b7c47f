//! Scale-out and failure: two auth instances on one PostgreSQL, two proxies joined with
//! `proxy` tokens, three node agents that each keep a tunnel to both proxies — all processes on
//! loopback (`sallyport_tests::ha::Topology`). While sessions run through both proxies, one
//! proxy is killed (`kill -9`): its sessions end, the other proxy's go on, and new sessions
//! (`sally ssh` and OpenSSH `-J`) work through the other within seconds; one auth is killed:
//! logins and sessions go on through the other; everything restarts: no audit event is lost and
//! no node is shown online that is not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sallyport_tests::ha::Topology;
use sallyport_tests::{bin, eventually};

/// `sally ssh LOGIN@NODE -- CMD` as the user under `home`; its stdout when it succeeded.
fn sally_ssh(
    t: &Topology,
    home: &std::path::Path,
    node: &str,
    cmd: &str,
) -> Result<String, String> {
    let r = t.sally(home, &["ssh", &format!("root@{node}"), "--", cmd], "");
    if r.code == 0 {
        Ok(r.stdout)
    } else {
        Err(r.stderr)
    }
}

/// Tries `f` until it succeeds or `within` passes; how long it took.
fn within(within: Duration, mut f: impl FnMut() -> Result<String, String>) -> (Duration, String) {
    let start = Instant::now();
    let mut last = String::new();
    while start.elapsed() < within {
        match f() {
            Ok(out) => return (start.elapsed(), out),
            Err(e) => last = e,
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("still failing after {within:?}: {last}");
}

#[test]
fn sessions_logins_and_the_audit_survive_a_proxy_and_an_auth_dying() {
    // Recordings in S3 (a real S3 API: moto_server), shared by both proxies and both auths.
    let moto = sallyport_tests::s3::Moto::start();
    moto.bucket("recordings");
    let mut t = Topology::start_with(
        2,
        2,
        3,
        Some(format!(
            "{{uri: 's3://recordings/ha', endpoint: '{}', region: us-east-1}}",
            moto.endpoint
        )),
    );
    let mut sessions = 0usize;

    // Both proxies registered and online; each node has a tunnel to both.
    let ls = t.sallyctl(&["proxies", "ls", "--format", "json"]).ok();
    let proxies: serde_json::Value = serde_json::from_str(&ls.stdout).unwrap();
    let proxies = proxies.as_array().unwrap();
    assert_eq!(proxies.len(), 2, "{proxies:?}");
    assert!(proxies.iter().all(|p| p["online"] == true), "{proxies:?}");
    let proxy1_id = proxies.iter().find(|p| p["name"] == "proxy1").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(20), || {
            t.query("SELECT COUNT(*) FROM node_tunnels") == "6"
        }),
        "every node keeps a tunnel to both proxies: {}",
        t.query("SELECT node_id || ' ' || proxy_id FROM node_tunnels")
    );

    // One person, logged in through each proxy.
    let via1 = t.user("alice", "access", "root", 0);
    let via2 = t.dir.path().join("home-alice-2");
    t.login(&via2, "alice", 1).ok();
    // And one profile naming both proxies, as a client given a list (not a load balancer).
    let both = t.dir.path().join("home-alice-both");
    let list = format!("{},{}", t.proxy_addrs[0].web, t.proxy_addrs[1].web);
    t.sally(
        &both,
        &[
            "login", "--proxy", &list, "--user", "alice", "--ca-pin", &t.pin,
        ],
        "correct horse battery\n",
    )
    .ok();
    for node in ["node1", "node2", "node3"] {
        for home in [&via1, &via2] {
            let out = sally_ssh(
                &t,
                home,
                node,
                "echo hello from $(cat /proc/sys/kernel/hostname)",
            )
            .unwrap_or_else(|e| panic!("{node}: {e}"));
            assert!(out.contains("hello from"), "{out}");
            sessions += 1;
        }
    }

    // Sessions running through both proxies (OpenSSH -J), printing every 200 ms.
    let ticking = "for i in $(seq 1 150); do echo tick$i; sleep 0.2; done # ticking";
    let start_ssh = |via: usize, home: &std::path::Path, node: &str| {
        let cfg = t.ssh_config(home, "alice", via, via);
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", &format!("root@{node}"), ticking])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let why = |c: &mut std::process::Child| {
        let mut e = String::new();
        if let Some(mut s) = c.stderr.take() {
            let _ = s.read_to_string(&mut e);
        }
        e
    };
    // OpenSSH -J checks the nodes' host certificates against the CA `sally login` saved.
    let mut on1 = start_ssh(0, &via1, "node1");
    let mut on2 = start_ssh(1, &via2, "node2");
    sessions += 2;
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        on1.try_wait().unwrap().is_none(),
        "the session through proxy1 runs: {}",
        why(&mut on1)
    );
    assert!(
        on2.try_wait().unwrap().is_none(),
        "the session through proxy2 runs: {}",
        why(&mut on2)
    );

    // kill -9 proxy1: its session ends; proxy2's goes on to its end.
    t.proxies[0].kill();
    let ended = eventually(Duration::from_secs(15), || {
        on1.try_wait().unwrap().is_some()
    });
    assert!(ended, "the session through the killed proxy ended");
    let mut out1 = String::new();
    on1.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out1)
        .unwrap();
    assert!(
        out1.contains("tick1") && !out1.contains("tick150"),
        "{out1}"
    );
    let last_tick: u32 = out1
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tick")?.parse().ok())
        .max()
        .unwrap();
    assert!(
        on2.try_wait().unwrap().is_none(),
        "the session through the other proxy is not disturbed"
    );

    // A client given both proxies goes on at once: one refused connect, then the other.
    let out = sally_ssh(&t, &both, "node1", "echo listed").expect("the listed proxy that is up");
    assert!(out.contains("listed"), "{out}");
    sessions += 1;
    let r = t.sally(&both, &["ls"], "").ok();
    assert!(r.stdout.contains("node3"), "{r:?}");

    // New sessions through proxy2 within seconds: sally ssh, and OpenSSH -J.
    for node in ["node1", "node2", "node3"] {
        let (took, out) = within(Duration::from_secs(10), || {
            sally_ssh(&t, &via2, node, "echo after-kill")
        });
        assert!(out.contains("after-kill"), "{out}");
        assert!(took < Duration::from_secs(10), "{node} took {took:?}");
        sessions += 1;
    }
    let cfg2 = t.ssh_config(&via2, "alice", 1, 1);
    let r = sallyport_tests::run(
        Command::new("ssh").arg("-F").arg(&cfg2).args([
            "-J",
            "proxy",
            "root@node3",
            "echo openssh-after-kill",
        ]),
        "",
    );
    assert!(r.stdout.contains("openssh-after-kill"), "{r:?}");
    sessions += 1;
    // Agents stay reachable, and shown online (their tunnels to proxy2 hold).
    assert!(
        t.nodes_online().iter().all(|(_, up)| *up),
        "{:?}",
        t.nodes_online()
    );

    // proxy1 back: its interrupted session is marked incomplete, proxy2's running one is not;
    // the recording it left on its disk reaches S3 and replays through the other proxy, up
    // to the last second before the kill (the recorder flushes every second).
    t.proxies[0].start();
    let killed = {
        let on_node1: Vec<String> = serde_json::from_str::<serde_json::Value>(
            &t.sally(&via2, &["recordings", "ls", "--format", "json"], "")
                .ok()
                .stdout,
        )
        .unwrap()
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| {
            s["node"] == "node1" && s["command"].as_str().is_some_and(|c| c.contains("ticking"))
        })
        .filter_map(|s| s["session_id"].as_str().map(str::to_string))
        .collect();
        assert_eq!(on_node1.len(), 1, "{on_node1:?}");
        on_node1[0].clone()
    };
    let mut played = String::new();
    assert!(
        eventually(Duration::from_secs(20), || {
            let r = t.sally(&via2, &["play", &killed, "--format", "text"], "");
            played = r.stdout;
            r.code == 0
        }),
        "the killed proxy's recording never became readable: {played}"
    );
    let recorded: u32 = played
        .lines()
        .filter_map(|l| l.trim().strip_prefix("tick")?.parse().ok())
        .max()
        .unwrap_or(0);
    assert!(
        recorded + 6 >= last_tick,
        "recorded up to tick{recorded}, the client saw tick{last_tick}: more than a second lost"
    );
    assert!(
        moto.list("recordings", "ha")
            .iter()
            .any(|(k, _)| k.contains(&killed)),
        "{:?}",
        moto.list("recordings", "ha")
    );
    let statuses = t.query(&format!(
        "SELECT proxy || ':' || status FROM sessions WHERE status = 'running' OR (status = 'incomplete' AND proxy = '{proxy1_id}')"
    ));
    assert!(
        statuses.contains(&format!("{proxy1_id}:incomplete")),
        "the killed proxy's session: {statuses}"
    );
    assert!(
        !statuses.contains(&format!("{proxy1_id}:running")),
        "{statuses}"
    );
    assert!(
        statuses
            .lines()
            .any(|l| l.ends_with(":running") && !l.starts_with(&proxy1_id)),
        "proxy2's session still runs: {statuses}"
    );
    assert!(
        eventually(Duration::from_secs(20), || {
            t.query("SELECT COUNT(*) FROM node_tunnels") == "6"
        }),
        "the agents came back to proxy1"
    );

    // kill -9 auth1: logins and sessions go on through auth2.
    t.auths[0].kill();
    let (_, out) = within(Duration::from_secs(10), || {
        let r = t.login(&via1, "alice", 1);
        if r.code == 0 {
            Ok(r.stdout)
        } else {
            Err(r.stderr)
        }
    });
    assert!(!out.is_empty());
    let (_, out) = within(Duration::from_secs(10), || {
        sally_ssh(&t, &via2, "node2", "echo auth2")
    });
    assert!(out.contains("auth2"), "{out}");
    sessions += 1;

    let status = on2.wait().unwrap();
    let mut out2 = String::new();
    on2.stdout
        .take()
        .unwrap()
        .read_to_string(&mut out2)
        .unwrap();
    assert!(
        status.success() && out2.contains("tick150"),
        "{status}: {out2}"
    );

    // node3 goes away for good; then everything restarts.
    t.nodes[2].kill();
    for s in t.proxies.iter_mut() {
        s.terminate();
    }
    t.auths[1].terminate();
    t.auths[0].start();
    t.auths[1].start();
    t.proxies[0].start();
    t.proxies[1].start();
    // No node is shown online that is not: node3 at once, the others once back.
    let online = t.nodes_online();
    assert!(
        online.iter().any(|(n, up)| n == "node3" && !up),
        "node3 is down: {online:?}"
    );
    for node in ["node1", "node2"] {
        t.wait_online(node);
    }
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        t.nodes_online().iter().any(|(n, up)| n == "node3" && !up),
        "{:?}",
        t.nodes_online()
    );

    // No audit event lost: the chain is intact, and it holds every session the clients ran.
    let verify = t.sallyctl(&["audit", "verify"]);
    assert_eq!(verify.code, 0, "{verify:?}");
    assert!(verify.stdout.contains("intact"), "{verify:?}");
    let started = t
        .sallyctl(&[
            "audit",
            "search",
            "--type",
            "session.start",
            "--limit",
            "1000",
        ])
        .ok()
        .stdout
        .lines()
        .filter(|l| l.contains("session.start"))
        .count();
    assert_eq!(
        started, sessions,
        "session.start records against sessions run"
    );
}

/// A second auth instance that was not given the cluster's audit checkpoint key stops at start
/// with what to do, instead of serving and calling every checkpoint the other signed forged;
/// given the key, it starts and the chain verifies.
#[test]
fn an_auth_without_the_shared_checkpoint_key_says_so_and_stops() {
    let mut t = Topology::start(1, 0, 0);
    // Records, and a clean stop that signs a checkpoint of them.
    t.token("node");
    t.auths[0].terminate();
    t.auths[0].start();
    let (mut lone, _) = t.auth_service("auth-lone");
    let why = lone
        .try_start()
        .expect_err("an auth with a key of its own started");
    assert!(
        why.contains("anchored by another auth instance's checkpoint key")
            && why.contains("copy audit-checkpoint.key"),
        "{why}"
    );
    let key = lone.data.join("audit-checkpoint.key");
    assert!(!key.exists(), "the key it made is not left behind");
    std::fs::copy(t.auths[0].data.join("audit-checkpoint.key"), &key).unwrap();
    lone.try_start().expect("with the shared key it starts");
    t.auths[0].kill();
    let r = sallyport_tests::run(
        Command::new(bin("sallyctl"))
            .arg("--data-dir")
            .arg(&lone.data)
            .args(["audit", "verify"]),
        "",
    );
    assert!(r.code == 0 && r.stdout.contains("intact"), "{r:?}");
}

/// In a cluster of separate services, no node joins under a proxy's name or the address it is
/// reached at (its host certificate would then name the proxy): auth knows them from the proxy
/// registry, not from a proxy config it does not have.
#[test]
fn a_node_cannot_join_under_a_proxys_name() {
    let t = Topology::start(1, 1, 0);
    for name in ["proxy1", "127.0.0.1"] {
        let token = t.token("node");
        let r = sallyport_tests::run(
            Command::new(bin("sallyport"))
                .args(["start", "--roles=node", "--proxy", &t.proxy_addrs[0].web])
                .args(["--token", &token, "--ca-pin", &t.pin, "--nodename", name])
                .arg("--data-dir")
                .arg(t.dir.path().join(format!("impostor-{name}"))),
            "",
        );
        assert_ne!(r.code, 0, "{name} joined: {r:?}");
        assert!(r.stderr.contains(name), "{name}: {r:?}");
    }
    assert!(t.nodes_online().is_empty(), "{:?}", t.nodes_online());
}

/// A joined proxy renews its certificates while it runs (at two thirds of their life): past
/// the first ones' end, people still log in and reach nodes through it, its agents still
/// tunnel to it, and the renewed identity is what it keeps on disk (0600).
#[test]
fn a_proxy_renews_its_certificates_while_it_runs() {
    use std::os::unix::fs::PermissionsExt;
    let t = Topology::start_custom(1, 1, 1, None, &["host_cert_ttl: 40s"]);
    let file = t.proxies[0].data.join("proxy-identity.json");
    let not_after = || -> i64 {
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        v["joined"]["not_after"].as_i64().unwrap()
    };
    let first = not_after();
    assert!(
        eventually(Duration::from_secs(60), || not_after() > first),
        "the proxy never renewed its certificates"
    );
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    while sallyport_core::unix_now() <= first + 2 {
        std::thread::sleep(Duration::from_millis(500));
    }
    // Past the first certificates' end: a new login (TLS to the proxy, the proxy's calls to
    // auth), a new SSH session (the proxy's SSH host certificate), the node online.
    let home = t.user("pat", "access", "root", 0);
    let out = sally_ssh(&t, &home, "node1", "echo renewed-proxy").expect("a session");
    assert!(out.contains("renewed-proxy"), "{out}");
    t.wait_online("node1");
    let ls = t.sallyctl(&["proxies", "ls", "--format", "json"]).ok();
    assert!(ls.stdout.contains("\"online\": true"), "{}", ls.stdout);
}

/// The roles' `max_connections` holds across proxies, as a person behind a load balancer
/// meets them: with `max_connections: 1`, a connection open through one proxy refuses a second
/// through the other (saying why, the first unharmed), and once the first closes there is room
/// again at once, through either proxy.
#[test]
fn max_connections_counts_a_users_connections_on_every_proxy() {
    let mut t = Topology::start(1, 2, 1);
    assert!(
        eventually(Duration::from_secs(20), || {
            t.query("SELECT COUNT(*) FROM node_tunnels") == "2"
        }),
        "node1 keeps a tunnel to both proxies"
    );
    let role = t.dir.path().join("one.yaml");
    std::fs::write(
        &role,
        "kind: role\nversion: v1\nmetadata: {name: one}\nspec:\n  options: {max_connections: 1}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .unwrap();
    t.sallyctl(&["create", role.to_str().unwrap()]).ok();
    let home = t.user("olga", "one", "root", 0);
    let cfgs = [
        t.ssh_config(&home, "olga", 0, 0),
        t.ssh_config(&home, "olga", 1, 0),
    ];
    let via = |proxy: usize| cfgs[proxy].clone();
    let ssh = |proxy: usize, cmd: &str| {
        sallyport_tests::run(
            Command::new("ssh")
                .arg("-F")
                .arg(via(proxy))
                .args(["-J", "proxy", "root@node1", cmd]),
            "",
        )
    };

    // A session through proxy `proxy` running `echo up; CMD`, once it has said `up`: the
    // connection is open and counted. Its stdin and the rest of its output are the caller's.
    let open = |proxy: usize, cmd: &str| {
        let mut child = Command::new("ssh")
            .arg("-F")
            .arg(via(proxy))
            .args(["-J", "proxy", "root@node1", &format!("echo up; {cmd}")])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut up = [0u8; 3];
        out.read_exact(&mut up).unwrap();
        assert_eq!(&up, b"up\n");
        (child, out)
    };

    // The first connection, through proxy 1, stays open until told to end.
    let (mut first, mut out) = open(0, "read x; echo first done");
    assert_eq!(
        t.query("SELECT COUNT(*) FROM user_connections WHERE user_name = 'olga'"),
        "1"
    );

    // Through proxy 2: refused, naming the limit; the first goes on.
    ssh(1, "echo second").fails_with("max_connections: 1");
    {
        use std::io::Write;
        first.stdin.take().unwrap().write_all(b"\n").unwrap();
    }
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "first done\n");
    assert!(first.wait().unwrap().success());

    // Closed: room again through proxy 2 within a moment (the proxy tells auth at once).
    let (took, said) = within(Duration::from_secs(5), || {
        let r = ssh(1, "echo third");
        if r.code == 0 {
            Ok(r.stdout)
        } else {
            Err(r.stderr)
        }
    });
    assert_eq!(said, "third\n");
    assert!(
        took < Duration::from_secs(3),
        "room again only after {took:?}"
    );
    assert!(
        eventually(Duration::from_secs(5), || t.query(
            "SELECT COUNT(*) FROM user_connections WHERE user_name = 'olga'"
        ) == "0"),
        "closed connections stay registered"
    );

    // A proxy killed with olga's connection open holds it only until it starts again (or, if
    // it never does, until its heartbeats are PROXY_TTL_SECS old).
    let (mut held, _out) = open(0, "sleep 60");
    ssh(1, "true").fails_with("max_connections: 1");
    t.proxies[0].kill();
    let _ = held.wait();
    ssh(1, "true").fails_with("max_connections: 1");
    t.proxies[0].start();
    let (_, said) = within(Duration::from_secs(10), || {
        let r = ssh(1, "echo after the restart");
        if r.code == 0 {
            Ok(r.stdout)
        } else {
            Err(r.stderr)
        }
    });
    assert_eq!(said, "after the restart\n");

    // Ten at once, five through each proxy: exactly one is let in (the first auth registers;
    // the proxies' clocks do not matter), the others told why.
    let racing: Vec<_> = (0..10)
        .map(|i| {
            Command::new("ssh")
                .arg("-F")
                .arg(via(i % 2))
                .args(["-J", "proxy", "root@node1", "echo in; sleep 3"])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = racing
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    let inside = outs.iter().filter(|o| o.stdout == b"in\n").count();
    assert_eq!(inside, 1, "{outs:?}");
    for o in outs.iter().filter(|o| !o.status.success()) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("max_connections: 1"), "{err}");
    }

    // A connection that closes while auth is down is gone from auth once it is back: the
    // proxy's next list of its open connections (every 10 s) no longer has it, and olga is not
    // held over her limit.
    let (mut held, _out) = open(0, "read x");
    let olgas = "SELECT COUNT(*) FROM user_connections WHERE user_name = 'olga'";
    assert_eq!(t.query(olgas), "1");
    t.auths[0].kill();
    drop(held.stdin.take());
    let _ = held.wait();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        t.query(olgas),
        "1",
        "auth was down: nobody could take the close"
    );
    t.auths[0].start();
    assert!(
        eventually(Duration::from_secs(30), || t.query(olgas) == "0"),
        "the closed connection stays registered once auth is back"
    );
    let (_, said) = within(Duration::from_secs(10), || {
        let r = ssh(1, "echo auth is back");
        if r.code == 0 {
            Ok(r.stdout)
        } else {
            Err(r.stderr)
        }
    });
    assert_eq!(said, "auth is back\n");

    // A row auth holds for a connection its proxy no longer has (a grant auth committed after
    // the proxy stopped waiting for it, then the connection closed; id 0, which the proxy never
    // gives): the proxy's list of what is open, sent every 10 s, drops it, and olga has room.
    let proxy1 = t.query("SELECT id FROM proxies WHERE name = 'proxy1'");
    t.query(&format!(
        "INSERT INTO user_connections (proxy, id, user_name, seq, opened) VALUES ('{proxy1}', 0, 'olga', 0, 0)"
    ));
    assert!(
        eventually(Duration::from_secs(25), || t
            .query("SELECT COUNT(*) FROM user_connections WHERE id = 0")
            == "0"),
        "the stray row stays"
    );
    assert_eq!(ssh(1, "echo reconciled").ok().stdout, "reconciled\n");

    // Another user's connections are not olga's.
    let other = t.user("otto", "one", "root", 1);
    let r = sallyport_tests::run(
        Command::new("ssh")
            .arg("-F")
            .arg(t.ssh_config(&other, "otto", 0, 1))
            .args(["-J", "proxy", "root@node1", "echo otto"]),
        "",
    );
    assert_eq!(r.ok().stdout, "otto\n");
}
