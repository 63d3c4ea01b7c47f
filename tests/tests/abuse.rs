//! Bounded under abuse: connections that do not log in are closed after the login grace, capped
//! per address and in all at every door (with the reason said: an SSH disconnect, or 429), HTTP
//! headers must arrive in time, and every SSH server offers only what `ssh-audit` passes
//! (post-quantum notes aside), with the per-source throttle that keeps DHEat out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sallyport_tests::*;

fn cluster(proxy_service: &[&str]) -> Cluster {
    Cluster::start_with(Options {
        proxy_service: proxy_service.iter().map(|l| l.to_string()).collect(),
        ..Options::default()
    })
}

/// Reads until the peer closes (or `limit` passes: then panics), returning what it sent and
/// how long it took.
fn read_to_close(s: &mut TcpStream, limit: Duration) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    s.set_read_timeout(Some(limit)).unwrap();
    let mut all = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => all.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "still open after {:?} ({e}); it sent {:?}",
                start.elapsed(),
                String::from_utf8_lossy(&all)
            ),
        }
    }
    (all, start.elapsed())
}

/// A TCP connection to `port` that has read the server's SSH version line and says nothing.
fn idle_ssh(port: u16) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut first = [0u8; 4];
    s.read_exact(&mut first).unwrap();
    assert_eq!(
        &first, b"SSH-",
        "an admitted connection gets the version first"
    );
    s
}

fn port_in_config(c: &Cluster, key: &str) -> u16 {
    let text = std::fs::read_to_string(&c.config).unwrap();
    text.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}: 127.0.0.1:")))
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in the test config"))
}

#[test]
fn ssh_connections_that_do_not_log_in_are_closed_after_the_grace() {
    let c = cluster(&["ssh_login_grace: 2s"]);
    // Says nothing at all.
    let mut silent = TcpStream::connect(("127.0.0.1", c.ssh_port)).unwrap();
    // Sends its version and stops there, in the middle of the key exchange.
    let mut banner_only = TcpStream::connect(("127.0.0.1", c.ssh_port)).unwrap();
    banner_only.write_all(b"SSH-2.0-OpenSSH_9.6\r\n").unwrap();
    let (sent, took) = read_to_close(&mut silent, Duration::from_secs(15));
    assert!(sent.starts_with(b"SSH-2.0-"), "{sent:?}");
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(8),
        "closed after {took:?}"
    );
    let (_, took) = read_to_close(&mut banner_only, Duration::from_secs(15));
    assert!(took < Duration::from_secs(8), "closed after {took:?}");

    // A real login takes far less than the grace, and its session may last as long as it likes.
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let r = c
        .ssh(&cfg, &["root@local1", "sleep 3; echo still-here"], "")
        .ok();
    assert_eq!(r.stdout, "still-here\n");
}

#[test]
fn beyond_the_per_address_cap_ssh_is_told_why_and_logins_work_once_the_idle_ones_close() {
    let c = cluster(&["ssh_login_grace: 3s", "max_unauthenticated_per_address: 3"]);
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");

    let held: Vec<TcpStream> = (0..3).map(|_| idle_ssh(c.ssh_port)).collect();
    // The next is refused before key exchange, with the reason as a line and a disconnect.
    let mut next = TcpStream::connect(("127.0.0.1", c.ssh_port)).unwrap();
    let (sent, took) = read_to_close(&mut next, Duration::from_secs(5));
    let text = String::from_utf8_lossy(&sent);
    let why = "too many unauthenticated connections from 127.0.0.1 (max_unauthenticated_per_address: 3); try again later";
    assert!(text.starts_with(&format!("{why}\r\nSSH-2.0-")), "{text:?}");
    assert!(took < Duration::from_secs(4), "refused after {took:?}");
    // OpenSSH's ssh prints it.
    c.ssh(&cfg, &["root@local1", "true"], "")
        .fails_with(&format!(
            "Received disconnect from 127.0.0.1 port {}:12: {why}",
            c.ssh_port
        ));

    // So does sally.
    c.sally(&home, &["ssh", "root@local1", "true"], "")
        .fails_with(&format!("proxy 127.0.0.1:{}: {why}", c.ssh_port));

    // The idle ones are closed after the grace; then the same address logs in again.
    drop(held);
    assert!(
        eventually(Duration::from_secs(15), || c
            .ssh(&cfg, &["root@local1", "echo back"], "")
            .code
            == 0),
        "no login after the idle connections closed"
    );
}

#[test]
fn a_flood_from_one_address_is_throttled_but_logins_are_not() {
    // A burst of 4, refilled at 1 a second: what never logs in runs dry.
    let c = cluster(&[
        "max_unauthenticated_per_address: 4",
        "max_connection_rate_per_address: 1",
    ]);
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    // Logins give their token back: many in a row stay welcome.
    for i in 0..8 {
        let r = c.ssh(&cfg, &["root@local1", &format!("echo {i}")], "").ok();
        assert_eq!(r.stdout, format!("{i}\n"));
    }
    // Connections that close without logging in (a DHEat flood) spend the bucket.
    let mut refused = None;
    for _ in 0..10 {
        let mut s = TcpStream::connect(("127.0.0.1", c.ssh_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut first = [0u8; 8];
        s.read_exact(&mut first).unwrap();
        // Leave, and wait for the server to see it, so only the rate can refuse the next.
        s.shutdown(std::net::Shutdown::Write).unwrap();
        if &first == b"SSH-2.0-" {
            read_to_close(&mut s, Duration::from_secs(5));
        } else {
            let (rest, _) = read_to_close(&mut s, Duration::from_secs(5));
            refused = Some(format!(
                "{}{}",
                String::from_utf8_lossy(&first),
                String::from_utf8_lossy(&rest)
            ));
            break;
        }
    }
    let refused = refused.expect("a flood of connections that never log in is throttled");
    assert!(
        refused.starts_with(
            "too many new connections from 127.0.0.1 (more than 1 a second that do not log in)"
        ),
        "{refused:?}"
    );
}

#[test]
fn https_requests_must_send_their_headers_in_time_and_idle_keep_alives_close() {
    let c = Cluster::start();
    // One connection begins its headers and never finishes them; another sends a whole
    // request, reads the answer and then keeps the connection open doing nothing. hyper's 30 s
    // header timeout (which runs while a connection waits for its next request) ends both.
    let script = format!(
        r#"
import socket, ssl, threading, time
def connect():
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    ctx.set_alpn_protocols(["http/1.1"])
    s = ctx.wrap_socket(socket.create_connection(("127.0.0.1", {port})))
    s.settimeout(90)
    return s
def wait_for_close(s, name, start):
    try:
        while s.recv(4096):
            pass
        print(name, round(time.time() - start))
    except Exception as e:
        print(name, "error", repr(e))
partial = connect()
partial.sendall(b"GET /v1/webapi/ping HTTP/1.1\r\nHost: proxy\r\n")
idle = connect()
idle.sendall(b"GET /v1/webapi/ping HTTP/1.1\r\nHost: proxy\r\n\r\n")
answer = idle.recv(4096)
print("answered", answer.split(b"\r\n")[0].decode())
start = time.time()
threads = [threading.Thread(target=wait_for_close, args=(s, n, start)) for s, n in [(partial, "partial"), (idle, "idle")]]
for t in threads: t.start()
for t in threads: t.join()
"#,
        port = c.proxy.rsplit(':').next().unwrap()
    );
    let r = run(Command::new("python3").args(["-c", &script]), "").ok();
    assert!(r.stdout.contains("answered HTTP/1.1 200"), "{r:?}");
    for name in ["partial", "idle"] {
        let secs: u64 = r
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|s| s.parse().ok())
            .unwrap_or(u64::MAX);
        assert!(
            (25..=45).contains(&secs),
            "{name} closed after {secs} s: {r:?}"
        );
    }
}

#[test]
fn the_global_cap_counts_every_address() {
    let c = cluster(&[
        "max_unauthenticated_connections: 4",
        "max_unauthenticated_per_address: 3",
    ]);
    // Three from 127.0.0.1 and one from 127.0.0.2 fill the door; 127.0.0.3 is refused with
    // the global reason (loopback answers from any 127.x address).
    let script = format!(
        r#"
import socket
def conn(source):
    s = socket.create_connection(("127.0.0.1", {port}), source_address=(source, 0))
    s.settimeout(10)
    return s
held = [conn("127.0.0.1") for _ in range(3)] + [conn("127.0.0.2")]
for s in held:
    assert s.recv(4) == b"SSH-"
refused = conn("127.0.0.3")
data = b""
while True:
    d = refused.recv(4096)
    if not d:
        break
    data += d
print(data.split(b"\r\n")[0].decode())
"#,
        port = c.ssh_port
    );
    let r = run(Command::new("python3").args(["-c", &script]), "").ok();
    assert_eq!(
        r.stdout.trim(),
        "too many unauthenticated connections to this server (max_unauthenticated_connections: 4); try again later",
        "{r:?}"
    );
}

#[test]
fn https_beyond_the_per_address_cap_is_answered_429_with_the_reason() {
    let c = cluster(&["max_unauthenticated_per_address: 3"]);
    // Three connections that never start TLS hold the address's share.
    let port: u16 = c.proxy.rsplit(':').next().unwrap().parse().unwrap();
    let held: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let why = "too many unauthenticated connections from 127.0.0.1 (max_unauthenticated_per_address: 3); try again later";
    let r = run(
        Command::new("curl").args([
            "-sk",
            "-w",
            "\n%{http_code}",
            &format!("https://{}/v1/webapi/ping", c.proxy),
        ]),
        "",
    );
    assert!(r.stdout.ends_with("\n429"), "{r:?}");
    assert!(r.stdout.contains(why), "{r:?}");
    // sally says it too.
    let home = c.dir.path().join("home-alice");
    c.login(&home, "alice", "correct horse battery")
        .fails_with(why);
    drop(held);
    // Once they are gone, the same address is served.
    assert!(eventually(Duration::from_secs(5), || {
        run(
            Command::new("curl").args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("https://{}/v1/webapi/ping", c.proxy),
            ]),
            "",
        )
        .stdout
            == "200"
    }));
}

#[test]
fn tunnels_beyond_the_per_address_cap_are_closed_before_the_handshake() {
    let c = cluster(&["max_unauthenticated_per_address: 3"]);
    c.wait_online("local1");
    let port = port_in_config(&c, "tunnel_listen_addr");
    let _held: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let mut next = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let (_, took) = read_to_close(&mut next, Duration::from_secs(5));
    assert!(took < Duration::from_secs(2), "closed after {took:?}");
    // The agent's own tunnel, authenticated long ago, is untouched.
    assert!(c.node_online("local1"));
}

/// `ssh-audit -j` findings that are neither a fail nor a warning other than the post-quantum
/// note, as (section, algorithm, level, text).
fn audit_findings(json: &serde_json::Value) -> Vec<String> {
    let mut bad = Vec::new();
    for section in ["kex", "key", "enc", "mac"] {
        for alg in json[section].as_array().cloned().unwrap_or_default() {
            let name = alg["algorithm"].as_str().unwrap_or("?").to_string();
            for level in ["fail", "warn"] {
                for note in alg["notes"][level].as_array().cloned().unwrap_or_default() {
                    let note = note.as_str().unwrap_or_default();
                    if note != "does not provide protection against post-quantum attacks" {
                        bad.push(format!("{section} {name}: {level}: {note}"));
                    }
                }
            }
        }
    }
    bad
}

fn ssh_audit(args: &[&str]) -> serde_json::Value {
    let out = Command::new("ssh-audit")
        .arg("-j")
        .args(args)
        .output()
        .expect("ssh-audit is installed by scripts/test (pip install ssh-audit)");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ssh-audit {args:?} gave no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

#[test]
fn ssh_audit_passes_the_proxy_and_the_server_it_runs_for_each_node() {
    let c = Cluster::start();
    c.wait_online("local1");

    // The door on 3023, with ssh-audit's own DHEat connection-rate test.
    let door = ssh_audit(&["-p", &c.ssh_port.to_string(), "127.0.0.1"]);
    assert_eq!(audit_findings(&door), Vec::<String>::new(), "{door:#}");
    let notes = door["additional_notes"].to_string();
    assert!(
        !notes.contains("DHEat"),
        "no connection throttling: {notes}"
    );
    let compression = door["compression"].to_string();
    assert!(
        compression.contains("zlib@openssh.com") && !compression.contains("\"zlib\""),
        "compression before authentication: {compression}"
    );
    assert!(
        door["kex"]
            .to_string()
            .contains("kex-strict-s-v00@openssh.com")
    );

    // The server the proxy terminates for a node, reached as `ssh -J` reaches it: a
    // direct-tcpip channel of an authenticated connection (here a SOCKS forward).
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let socks = free_port();
    let mut forward = Command::new("ssh")
        .arg("-F")
        .arg(&cfg)
        .args(["-N", "-D", &format!("127.0.0.1:{socks}"), "proxy"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    assert!(eventually(Duration::from_secs(15), || {
        TcpStream::connect(("127.0.0.1", socks)).is_ok()
    }));
    let inner = ssh_audit(&[
        "--skip-rate-test",
        "--socks5",
        &format!("127.0.0.1:{socks}"),
        "-p",
        "22",
        "local1",
    ]);
    let _ = forward.kill();
    let _ = forward.wait();
    assert_eq!(audit_findings(&inner), Vec::<String>::new(), "{inner:#}");
    // One list for every server (the agent's is the same list behind `none`, unit-tested in
    // the agent, since only the proxy can reach it).
    for section in ["kex", "enc", "mac", "compression"] {
        assert_eq!(door[section], inner[section], "{section} differs");
    }
}
