//! Zero-length data on a `-L` forward through the proxy (vendor/russh/PATCHES.md, "Zero-length
//! data is not delivered"): RFC 4254 allows an empty CHANNEL_DATA, OpenSSH never sends one, and
//! the proxy's forward pump used to read it as end of file, half-closing the node's side and
//! then stalling the connection once the channel's queue filled. Neither OpenSSH nor russh's
//! client can send empty data, so the client is paramiko (tests/py/empty_data.py, which writes
//! the messages raw); the test runs the echo server the forward reaches and watches it for an
//! end of file that must not come.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc::{RecvTimeoutError, channel};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sallyport_tests::*;

/// What the echo server saw on one connection.
#[derive(Debug, Default, Clone)]
struct Seen {
    bytes: Vec<u8>,
    eof: bool,
}

/// A TCP echo server on 127.0.0.1 that records, per connection in order of arrival, the bytes
/// it read and whether it read end of file. Its threads end with the test process.
fn echo_server() -> (u16, Arc<Mutex<Vec<Seen>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::<Seen>::new()));
    let all = seen.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let i = {
                let mut all = all.lock().unwrap();
                all.push(Seen::default());
                all.len() - 1
            };
            let all = all.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) => {
                            all.lock().unwrap()[i].eof = true;
                            break;
                        }
                        Ok(n) => {
                            all.lock().unwrap()[i].bytes.extend_from_slice(&buf[..n]);
                            if conn.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        Err(_) => break,
                    }
                }
            });
        }
    });
    (port, seen)
}

#[test]
fn empty_channel_data_neither_ends_nor_stalls_a_local_forward() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let (echo_port, seen) = echo_server();
    let key = home
        .join("keys")
        .join(c.proxy.replace(':', "_"))
        .join("alice");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("py/empty_data.py");
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(c.ssh_port.to_string())
        .arg("alice")
        .arg(&key)
        .arg(home.join("known_hosts"))
        .args(["local1", "root"])
        .arg(echo_port.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (with paramiko: scripts/test installs it)");
    let (tx, rx) = channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    // Up to READY: both connections, the echoes before and after the empty data, the second
    // channel. The script's own timeouts (10 s an echo) end it before this one does.
    let mut said = String::new();
    let ready = loop {
        match rx.recv_timeout(Duration::from_secs(90)) {
            Ok(line) => {
                said.push_str(&line);
                said.push('\n');
                if line == "READY" {
                    break true;
                }
            }
            Err(RecvTimeoutError::Disconnected) => break false,
            Err(RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                break false;
            }
        }
    };
    if !ready {
        let status = child.wait().unwrap();
        panic!(
            "empty_data.py ({status}) did not get through:\n{said}stderr: {}\necho server saw: {:?}",
            errors.join().unwrap(),
            seen.lock().unwrap()
        );
    }

    // The connections are still open: the forward must not have passed an end of file on.
    let before = seen.lock().unwrap().clone();
    assert_eq!(before.len(), 2, "{before:?}");
    assert_eq!(before[0].bytes, b"helloworld", "{before:?}");
    assert!(
        !before[0].eof,
        "the empty data ended the forward: {before:?}\n{said}"
    );
    assert_eq!(before[1].bytes, b"again", "{before:?}");
    assert!(!before[1].eof, "{before:?}");

    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "empty_data.py: {status}\n{said}stderr: {}",
        errors.join().unwrap()
    );
    // And a real end of file does reach the echo server (the check above can see one).
    assert!(
        eventually(Duration::from_secs(10), || seen
            .lock()
            .unwrap()
            .iter()
            .all(|s| s.eof)),
        "{:?}",
        seen.lock().unwrap()
    );
}
