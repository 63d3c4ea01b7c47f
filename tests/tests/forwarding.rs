//! Forwarding through the proxy with the real OpenSSH client: `ssh -L` to an HTTP server on the
//! node, `ssh -D` with `curl --socks5`, `ssh -R` back to the person's side, `ssh -A` with a real
//! `ssh-agent`, ControlMaster/ControlPersist with many independent channels; each refused
//! when the roles say so, and audited.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sallyport_tests::*;

fn events(c: &Cluster, kind: &str) -> Vec<serde_json::Value> {
    c.events(kind)
}

/// A process killed when the test ends.
struct Bg(Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `python3 -m http.server` on 127.0.0.1 serving `dir`; waits until it answers.
fn http_server(dir: &Path) -> (Bg, u16) {
    let port = free_port();
    let child = Command::new("python3")
        .args(["-m", "http.server", "--bind", "127.0.0.1"])
        .arg(port.to_string())
        .arg("--directory")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));
    (Bg(child), port)
}

fn curl(args: &[&str]) -> Run {
    run(
        Command::new("curl")
            .args(["-s", "--max-time", "10"])
            .args(args),
        "",
    )
}

/// `ssh -N` with forwarding flags in the background; waits until `port` listens locally.
fn forward(c: &Cluster, cfg: &Path, flags: &[&str], port: u16) -> Bg {
    let child = Command::new("ssh")
        .arg("-F")
        .arg(cfg)
        .args(["-J", "proxy", "-N", "-o", "ExitOnForwardFailure=yes"])
        .args(flags)
        .arg("root@local1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _ = c;
    assert!(
        eventually(Duration::from_secs(15), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }),
        "forward on {port} never listened"
    );
    Bg(child)
}

#[test]
fn local_dynamic_and_remote_forwards_work_and_are_audited() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello through the tunnel\n").unwrap();
    let (_web, web) = http_server(&site);

    // -L: a local port reaches a server on the node.
    let lport = free_port();
    let _l = forward(
        &c,
        &cfg,
        &["-L", &format!("127.0.0.1:{lport}:127.0.0.1:{web}")],
        lport,
    );
    let r = curl(&[&format!("http://127.0.0.1:{lport}/hello.txt")]).ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");
    // Several at once over the same connection.
    let handles: Vec<_> = (0..8)
        .map(|_| {
            std::thread::spawn(move || {
                curl(&[&format!("http://127.0.0.1:{lport}/hello.txt")])
                    .ok()
                    .stdout
            })
        })
        .collect();
    for h in handles {
        assert_eq!(h.join().unwrap(), "hello through the tunnel\n");
    }

    // -D: SOCKS, with the name resolved on the node's side.
    let dport = free_port();
    let _d = forward(&c, &cfg, &["-D", &format!("127.0.0.1:{dport}")], dport);
    let r = curl(&[
        "--socks5-hostname",
        &format!("127.0.0.1:{dport}"),
        &format!("http://localhost:{web}/hello.txt"),
    ])
    .ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");

    // -R: a port on the node's loopback reaches back to the person's side.
    let rport = free_port();
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-R"])
            .arg(format!("{rport}:127.0.0.1:{web}"))
            .arg("root@local1")
            .arg(format!(
                "curl -s --max-time 10 http://127.0.0.1:{rport}/hello.txt"
            )),
        "",
    )
    .ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");
    // The remote listener is gone with the session.
    assert!(eventually(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", rport)).is_err()
    }));

    // A target nothing listens on is an error the client sees, not a hang.
    let dead = free_port();
    let r = curl(&[
        "--socks5-hostname",
        &format!("127.0.0.1:{dport}"),
        &format!("http://127.0.0.1:{dead}/"),
    ]);
    assert_ne!(r.code, 0);

    let mut port = vec![];
    assert!(
        eventually(Duration::from_secs(10), || {
            port = events(&c, "port");
            port.iter().any(|e| e["kind"] == "remote")
                && port.iter().filter(|e| e["kind"] == "local").count() >= 10
        }),
        "{port:#?}"
    );
    // (The probes that waited for the listener are audited too, with no bytes.)
    let local = port
        .iter()
        .filter(|e| e["kind"] == "local" && e["addr"] == format!("127.0.0.1:{web}"))
        .max_by_key(|e| e["bytes_out"].as_u64())
        .unwrap();
    assert_eq!(local["user"], "alice");
    assert!(local["bytes_out"].as_u64().unwrap() > 25, "{local}");
    assert!(local["bytes_in"].as_u64().unwrap() > 10, "{local}");
}

/// A real `ssh-agent` holding one key commented `forwarded-key`; returns it and its socket.
fn ssh_agent(dir: &Path) -> (Bg, std::path::PathBuf) {
    let sock = dir.join("agent.sock");
    let agent = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&sock)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(5), || sock.exists()));
    let key = dir.join("id_test");
    run(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "forwarded-key", "-f"])
            .arg(&key),
        "",
    )
    .ok();
    run(
        Command::new("ssh-add")
            .env("SSH_AUTH_SOCK", &sock)
            .arg(&key),
        "",
    )
    .ok();
    (Bg(agent), sock)
}

#[test]
fn agent_forwarding_reaches_a_real_ssh_agent() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let (agent, sock) = ssh_agent(c.dir.path());
    let r = run(
        Command::new("ssh")
            .env("SSH_AUTH_SOCK", &sock)
            .arg("-F")
            .arg(&cfg)
            .args([
                "-J",
                "proxy",
                "-A",
                "root@local1",
                "ssh-add -l; stat -c %a $(dirname $SSH_AUTH_SOCK)",
            ]),
        "",
    );
    drop(agent);
    let r = r.ok();
    assert!(r.stdout.contains("forwarded-key"), "{r:?}");
    assert!(
        r.stdout.contains("\n700\n"),
        "the socket's directory is the login's alone: {r:?}"
    );
    assert!(eventually(Duration::from_secs(10), || !events(
        &c,
        "agent-forward"
    )
    .is_empty()));
}

#[test]
fn roles_refuse_forwarding_and_say_so() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: plain}\nspec:\n  options: {port_forwarding: false, forward_agent: false}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("frank", "plain", "");
    let cfg = c.ssh_config(&home, "frank");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("secret.txt"), "nope\n").unwrap();
    let (_web, web) = http_server(&site);

    // -L: the listener comes up on the client, but every connection is refused with the reason.
    let lport = free_port();
    let mut child = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-J", "proxy", "-N", "-L"])
        .arg(format!("127.0.0.1:{lport}:127.0.0.1:{web}"))
        .arg("root@local1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(15), || {
        std::net::TcpStream::connect(("127.0.0.1", lport)).is_ok()
    }));
    let r = curl(&[&format!("http://127.0.0.1:{lport}/secret.txt")]);
    assert_ne!(r.stdout, "nope\n");
    std::thread::sleep(Duration::from_millis(300));
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("port_forwarding"), "{stderr}");

    // -R: refused outright.
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-R"])
            .arg(format!("{}:127.0.0.1:{web}", free_port()))
            .arg("root@local1")
            .arg("true"),
        "",
    );
    assert!(r.stderr.contains("remote port forwarding failed"), "{r:?}");

    // -A: no agent on the node, and a message saying why; the shell still works.
    let (_agent, sock) = ssh_agent(c.dir.path());
    let r = run(
        Command::new("ssh")
            .env("SSH_AUTH_SOCK", &sock)
            .arg("-F")
            .arg(&cfg)
            .args([
                "-J",
                "proxy",
                "-A",
                "root@local1",
                "echo shell-ok; echo ${SSH_AUTH_SOCK:-none}",
            ]),
        "",
    )
    .ok();
    assert_eq!(r.stdout, "shell-ok\nnone\n");
    assert!(r.stderr.contains("forward_agent"), "{r:?}");

    // The session certificate agrees with the roles: no permit-port-forwarding.
    let cert = home
        .join("keys")
        .read_dir()
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path()
        .join("frank-cert.pub");
    let r = run(
        Command::new("ssh-keygen").arg("-L").arg("-f").arg(&cert),
        "",
    )
    .ok();
    assert!(!r.stdout.contains("permit-port-forwarding"), "{}", r.stdout);
    assert!(
        !r.stdout.contains("permit-agent-forwarding"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("permit-pty"), "{}", r.stdout);
}

#[test]
fn control_master_keeps_channels_independent() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let control = c.dir.path().join("cm-%C");
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
                "ControlPersist=60s",
            ])
            .arg("-o")
            .arg(format!("ControlPath={}", control.display()))
            .args(args);
        cmd
    };
    // A long-running channel, started first.
    let slow = mux(&["root@local1", "sleep 3; echo slow-done; exit 7"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // Twenty more over the same connection, each with its own exit status.
    for i in 0..20 {
        let r = run(
            &mut mux(&["root@local1", &format!("echo run-{i}; exit {}", i % 4)]),
            "",
        );
        assert_eq!(r.code, i % 4, "{r:?}");
        assert_eq!(r.stdout, format!("run-{i}\n"));
    }
    // Their closing touched nothing else: the first channel finishes with its own status.
    let out = slow.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(7));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "slow-done\n");
    // One connection carried them all: the master is still there.
    run(&mut mux(&["-O", "check", "root@local1"]), "").ok();
    run(&mut mux(&["-O", "exit", "root@local1"]), "");
}

#[test]
fn sally_ssh_forwards_and_sally_scp_copies() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello through the tunnel\n").unwrap();
    let (_web, web) = http_server(&site);

    // sally ssh -N -L ... -D ...: both listen here and reach the node's side.
    let (lport, dport) = (free_port(), free_port());
    let child = Command::new(bin("sally"))
        .env("SALLY_HOME", &home)
        .env("HOME", &home)
        .args(["ssh", "-N", "-L"])
        .arg(format!("{lport}:127.0.0.1:{web}"))
        .arg("-D")
        .arg(dport.to_string())
        .arg("root@local1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _bg = Bg(child);
    assert!(eventually(Duration::from_secs(15), || {
        std::net::TcpStream::connect(("127.0.0.1", dport)).is_ok()
    }));
    let r = curl(&[&format!("http://127.0.0.1:{lport}/hello.txt")]).ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");
    let r = curl(&[
        "--socks5-hostname",
        &format!("127.0.0.1:{dport}"),
        &format!("http://localhost:{web}/hello.txt"),
    ])
    .ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");
    // SOCKS4a too.
    let r = curl(&[
        "--socks4a",
        &format!("127.0.0.1:{dport}"),
        &format!("http://localhost:{web}/hello.txt"),
    ])
    .ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");

    // sally ssh -R: the node reaches back here.
    let rport = free_port();
    let r = c
        .sally(
            &home,
            &[
                "ssh",
                "-R",
                &format!("{rport}:127.0.0.1:{web}"),
                "root@local1",
                &format!("curl -s --max-time 10 http://127.0.0.1:{rport}/hello.txt"),
            ],
            "",
        )
        .ok();
    assert_eq!(r.stdout, "hello through the tunnel\n");

    // sally ssh -A with a real agent.
    let (_agent, sock) = ssh_agent(c.dir.path());
    let r = run(
        Command::new(bin("sally"))
            .env("SALLY_HOME", &home)
            .env("HOME", &home)
            .env("SSH_AUTH_SOCK", &sock)
            .args(["ssh", "-A", "root@local1", "ssh-add -l"]),
        "",
    )
    .ok();
    assert!(r.stdout.contains("forwarded-key"), "{r:?}");

    // sally scp, both ways and recursive; quiet without a terminal.
    let remote = format!("/tmp/sallyport-sallyscp-{}", std::process::id());
    let r = c
        .sally(
            &home,
            &[
                "scp",
                "-r",
                &site.display().to_string(),
                &format!("root@local1:{remote}"),
            ],
            "",
        )
        .ok();
    assert_eq!(r.stdout, "", "no progress output without a terminal");
    let back = c.dir.path().join("back.txt");
    c.sally(
        &home,
        &[
            "scp",
            &format!("root@local1:{remote}/hello.txt"),
            &back.display().to_string(),
        ],
        "",
    )
    .ok();
    assert_eq!(
        std::fs::read_to_string(&back).unwrap(),
        "hello through the tunnel\n"
    );
    c.sally(&home, &["scp", "a", "b"], "")
        .fails_with("neither side is remote");
    let _ = std::fs::remove_dir_all(&remote);
}

#[test]
fn x11_forwarding_reaches_a_real_x_server_when_the_roles_allow_it() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: x11}\nspec:\n  options: {permit_x11_forwarding: true}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    // A real X server for the person's side.
    let display = 100 + (std::process::id() % 500);
    let xvfb = Command::new("Xvfb")
        .arg(format!(":{display}"))
        .args(["-screen", "0", "640x480x24", "-nolisten", "tcp", "-ac"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("Xvfb (Debian: xvfb) is installed by scripts/test");
    let _xvfb = Bg(xvfb);
    assert!(eventually(Duration::from_secs(10), || {
        Path::new(&format!("/tmp/.X11-unix/X{display}")).exists()
    }));
    let xhome = c.dir.path().join("xhome");
    std::fs::create_dir_all(&xhome).unwrap();
    let ssh_x = |cfg: &Path, cmd: &str| {
        run(
            Command::new("ssh")
                .env("DISPLAY", format!(":{display}"))
                .env("XAUTHORITY", xhome.join(".Xauthority"))
                .arg("-F")
                .arg(cfg)
                .args(["-J", "proxy", "-X", "root@local1", cmd]),
            "",
        )
    };
    let home = c.user("xena", "x11", "");
    let cfg = c.ssh_config(&home, "xena");
    let r = ssh_x(
        &cfg,
        "echo $DISPLAY; xdpyinfo | grep -c 'dimensions: *640x480'",
    )
    .ok();
    assert!(r.stdout.starts_with("localhost:"), "{r:?}");
    assert!(
        r.stdout.ends_with("1\n"),
        "the node's X client reached the X server here: {r:?}"
    );
    assert!(eventually(Duration::from_secs(10), || !events(
        &c,
        "x11-forward"
    )
    .is_empty()));

    // Roles without permit_x11_forwarding: no DISPLAY, and the reason on stderr.
    let home = c.user("yann", "access", "root");
    let cfg = c.ssh_config(&home, "yann");
    let r = ssh_x(&cfg, "echo ${DISPLAY:-none}").ok();
    assert_eq!(r.stdout, "none\n");
    assert!(r.stderr.contains("permit_x11_forwarding"), "{r:?}");
}

#[test]
fn a_connection_that_only_forwards_is_ended_when_idle_but_not_while_used() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: impatient}\nspec:\n  options: {client_idle_timeout: 3s, port_forwarding: true}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("ivy", "impatient", "");
    let cfg = c.ssh_config(&home, "ivy");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hi\n").unwrap();
    let (_web, web) = http_server(&site);
    let lport = free_port();
    let mut fwd = forward(
        &c,
        &cfg,
        &["-L", &format!("127.0.0.1:{lport}:127.0.0.1:{web}")],
        lport,
    );
    // Used every second for longer than the timeout: still up.
    for _ in 0..6 {
        assert_eq!(
            curl(&[&format!("http://127.0.0.1:{lport}/hello.txt")])
                .ok()
                .stdout,
            "hi\n"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(fwd.0.try_wait().unwrap().is_none(), "ended while in use");
    // Then left alone: the proxy ends the connection, and `ssh -N` exits.
    assert!(
        eventually(Duration::from_secs(15), || fwd
            .0
            .try_wait()
            .unwrap()
            .is_some()),
        "an idle forwarding connection stayed up"
    );
}

/// Whether a new connection through the local forward on `lport` reaches the site.
fn reaches(lport: u16) -> bool {
    curl(&[&format!("http://127.0.0.1:{lport}/hello.txt")]).stdout == "hello through the tunnel\n"
}

#[test]
fn a_forward_checks_its_grant_again_for_every_new_connection() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: fwd}\nspec:\n  options: {port_forwarding: true}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello through the tunnel\n").unwrap();
    let (_web, web) = http_server(&site);
    let open = |user: &str| {
        let home = c.user(user, "fwd", "");
        let cfg = c.ssh_config(&home, user);
        let lport = free_port();
        let bg = forward(
            &c,
            &cfg,
            &["-L", &format!("127.0.0.1:{lport}:127.0.0.1:{web}")],
            lport,
        );
        assert!(reaches(lport));
        (bg, lport)
    };

    // A removed user's forward carries no new connection within a few seconds.
    let (_alice, alice) = open("alice");
    c.sallyctl(&["users", "rm", "alice"]).ok();
    assert!(
        eventually(Duration::from_secs(6), || !reaches(alice)),
        "the forward still works after `sallyctl users rm`"
    );
    std::thread::sleep(Duration::from_secs(3));
    assert!(!reaches(alice));

    // A role that no longer allows port forwarding: the same, saying why in the audit log.
    let (_bob, bob) = open("bob");
    let f = c.dir.path().join("fwd-off.yaml");
    std::fs::write(
        &f,
        "kind: role\nversion: v1\nmetadata: {name: fwd}\nspec:\n  options: {port_forwarding: false}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    assert!(
        eventually(Duration::from_secs(6), || !reaches(bob)),
        "the forward still works after the role lost port_forwarding"
    );
    assert!(eventually(Duration::from_secs(10), || {
        events(&c, "port").iter().any(|e| {
            e["user"] == "bob"
                && e["result"]
                    .as_str()
                    .is_some_and(|r| r.contains("port forwarding is not allowed"))
        })
    }));

    // A locked user: the lock ends the connection itself.
    std::fs::write(
        &f,
        "kind: role\nversion: v1\nmetadata: {name: fwd}\nspec:\n  options: {port_forwarding: true}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    let (_carol, carol) = open("carol");
    c.sallyctl(&["lock", "--user", "carol", "--message", "incident"])
        .ok();
    assert!(
        eventually(Duration::from_secs(6), || !reaches(carol)),
        "the forward still works after a lock"
    );
}

#[test]
fn a_new_remote_forward_checks_the_grant_again() {
    let c = Cluster::start();
    let role = |on: bool| {
        format!(
            "kind: role\nversion: v1\nmetadata: {{name: fwd}}\nspec:\n  options: {{port_forwarding: {on}}}\n  allow:\n    logins: [root]\n    node_labels: {{'*': '*'}}\n"
        )
    };
    let f = c.dir.path().join("fwd.yaml");
    std::fs::write(&f, role(true)).unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    c.wait_online("local1");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    std::fs::write(site.join("hello.txt"), "hello through the tunnel\n").unwrap();
    let (_web, web) = http_server(&site);
    let home = c.user("dave", "fwd", "");
    let cfg = c.ssh_config(&home, "dave");
    let control = c.dir.path().join("cm-%C");
    let control_path = format!("ControlPath={}", control.display());
    // A master whose first -R is allowed: the forwarding connection's grant says yes.
    let first = free_port();
    let _master = forward(
        &c,
        &cfg,
        &[
            "-o",
            "ControlMaster=yes",
            "-o",
            &control_path,
            "-R",
            &format!("127.0.0.1:{first}:127.0.0.1:{web}"),
        ],
        first,
    );
    assert!(reaches(first));
    let add = |port: u16| {
        run(
            Command::new("ssh")
                .arg("-F")
                .arg(&cfg)
                .args(["-J", "proxy", "-o", &control_path, "-O", "forward", "-R"])
                .arg(format!("127.0.0.1:{port}:127.0.0.1:{web}"))
                .arg("root@local1"),
            "",
        )
    };
    // While the roles allow it, a new bind over the master works.
    let second = free_port();
    add(second).ok();
    assert!(reaches(second));

    // The role loses port_forwarding: a new -R over the same master is refused (the grant
    // given at the first forward is not trusted past GRANT_RECHECK), audited with why.
    std::fs::write(&f, role(false)).unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    std::thread::sleep(Duration::from_secs(3));
    let third = free_port();
    add(third).fails_with("remote port forwarding failed");
    assert!(std::net::TcpStream::connect(("127.0.0.1", third)).is_err());
    assert!(eventually(Duration::from_secs(10), || {
        events(&c, "port").iter().any(|e| {
            e["user"] == "dave"
                && e["addr"] == format!("127.0.0.1:{third}")
                && e["result"] == "port forwarding is not allowed by your roles (port_forwarding)"
        })
    }));
}

#[test]
fn an_agent_channel_checks_the_grant_again() {
    let c = Cluster::start();
    let role = |on: bool| {
        format!(
            "kind: role\nversion: v1\nmetadata: {{name: agent}}\nspec:\n  options: {{forward_agent: {on}}}\n  allow:\n    logins: [root]\n    node_labels: {{'*': '*'}}\n"
        )
    };
    let f = c.dir.path().join("agent.yaml");
    std::fs::write(&f, role(true)).unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    c.wait_online("local1");
    let home = c.user("erin", "agent", "");
    let cfg = c.ssh_config(&home, "erin");
    let (_agent, sock) = ssh_agent(c.dir.path());
    // The agent works at first; the role loses forward_agent while the session runs; the
    // node's next agent channel is refused, audited with why.
    let child = Command::new("ssh")
        .env("SSH_AUTH_SOCK", &sock)
        .arg("-F")
        .arg(&cfg)
        .args([
            "-J",
            "proxy",
            "-A",
            "root@local1",
            "ssh-add -l; sleep 8; ssh-add -l; echo end",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(8), || {
        events(&c, "agent-forward")
            .iter()
            .any(|e| e["user"] == "erin" && e["result"] == "ok")
    }));
    std::thread::sleep(Duration::from_secs(2));
    std::fs::write(&f, role(false)).unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(stdout.matches("forwarded-key").count(), 1, "{stdout}");
    assert!(stdout.ends_with("end\n"), "{stdout}");
    assert!(eventually(Duration::from_secs(10), || {
        events(&c, "agent-forward").iter().any(|e| {
            e["user"] == "erin"
                && e["result"] == "agent forwarding is not allowed by your roles (forward_agent)"
        })
    }));
}

/// Every SSH connection on the path runs consumer-driven windows (`vendor/russh/PATCHES.md`):
/// a forward whose bytes were never given back as window would stall once one window (2 MiB to
/// the person, 8 MiB to an agent) had passed. 40 MB through `-L` and back through `-R`, whole.
#[test]
fn forwards_carry_many_windows_each_way() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let site = c.dir.path().join("site");
    std::fs::create_dir_all(&site).unwrap();
    let blob: Vec<u8> = (0..40_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(site.join("blob"), &blob).unwrap();
    let (_web, web) = http_server(&site);
    let got = c.dir.path().join("got");

    let lport = free_port();
    let _l = forward(
        &c,
        &cfg,
        &["-L", &format!("127.0.0.1:{lport}:127.0.0.1:{web}")],
        lport,
    );
    let url = format!("http://127.0.0.1:{lport}/blob");
    curl(&["--max-time", "60", "-o", got.to_str().unwrap(), &url]).ok();
    assert!(
        std::fs::read(&got).unwrap() == blob,
        "-L: the file changed on the way"
    );

    let rport = free_port();
    let r = run(
        Command::new("ssh")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-R"])
            .arg(format!("{rport}:127.0.0.1:{web}"))
            .arg("root@local1")
            .arg(format!(
                "curl -s --max-time 60 http://127.0.0.1:{rport}/blob | cksum"
            )),
        "",
    )
    .ok();
    let want = run(Command::new("cksum").arg(site.join("blob")), "").ok();
    assert_eq!(
        r.stdout.split_whitespace().take(2).collect::<Vec<_>>(),
        want.stdout.split_whitespace().take(2).collect::<Vec<_>>(),
        "-R: the file changed on the way"
    );
}
