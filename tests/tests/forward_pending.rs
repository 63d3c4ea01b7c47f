//! A pending `ssh -R` does not hold up the rest of its connection. The proxy answers a
//! `tcpip-forward` only once the node has bound it (and the grant, checked again, allows it);
//! it used to wait for that inside russh's callback, which stalls every channel of the
//! person's connection meanwhile (up to 15 s). Now the callback queues the bind and the answer
//! goes later, in its turn (our russh patch, "Global request replies in order").
//!
//! Made observable with real parts: an agentless OpenSSH `sshd` as the node (one `sshd` process
//! per node connection, so the connection that carries the forwards can be frozen alone with
//! SIGSTOP while the session's keeps going) and an OpenSSH ControlMaster connection carrying an
//! interactive `cat` and the `-O forward -R` requests.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::*;

/// Processes stopped with SIGSTOP, continued when the test ends, whatever happens.
struct Stopped(Vec<u32>);

impl Stopped {
    fn signal(pids: &[u32], sig: &str) {
        for pid in pids {
            let _ = Command::new("kill").args([sig, &pid.to_string()]).status();
        }
    }

    fn cont(&mut self) {
        Self::signal(&std::mem::take(&mut self.0), "-CONT");
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        self.cont();
    }
}

/// Every process below `root` (from /proc).
fn descendants(root: u32) -> HashSet<u32> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces, so read after its ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(ppid) = ppid {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = HashSet::new();
    let mut todo = vec![root];
    while let Some(p) = todo.pop() {
        for &c in children.get(&p).into_iter().flatten() {
            if found.insert(c) {
                todo.push(c);
            }
        }
    }
    found
}

/// `ssh` over the master at `control` (`-J proxy` too, as a client that has no master would).
fn mux(cfg: &Path, control: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new("ssh");
    cmd.arg("-F")
        .arg(cfg)
        .args(["-J", "proxy", "-o", "ExitOnForwardFailure=yes", "-o"])
        .arg(format!("ControlPath={}", control.display()))
        .args(args);
    cmd
}

/// A person's ControlMaster connection through the proxy to an agentless `sshd`, an
/// interactive `cat` on it, and one `-R` made: the proxy's forwarding connection to the node
/// exists, and its `sshd` processes are known.
struct Setup {
    cfg: std::path::PathBuf,
    control: std::path::PathBuf,
    input: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
    /// The `sshd` processes of the proxy's forwarding connection.
    forwarding: Vec<u32>,
    // Dropped in this order: the clients, then the node, then the cluster.
    _cat: Bg,
    _master: Bg,
    _sshd: Bg,
    _cluster: Cluster,
}

impl Setup {
    fn start() -> Self {
        let c = Cluster::start();
        // sshd's defaults allow forwarding.
        let sshd = c.agentless_node("plain1", &[]).sshd;
        let home = c.user("alice", "access", "root");
        let cfg = c.ssh_config(&home, "alice");
        let control = c.dir.path().join("cm");
        // One connection (the master), carrying an interactive `cat`.
        let master = Bg(mux(
            &cfg,
            &control,
            &["-o", "ControlMaster=yes", "-N", "root@plain1"],
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
        assert!(
            eventually(Duration::from_secs(20), || {
                run(
                    &mut mux(&cfg, &control, &["-O", "check", "root@plain1"]),
                    "",
                )
                .code
                    == 0
            }),
            "the master never connected"
        );
        let mut cat = mux(&cfg, &control, &["root@plain1", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let input = cat.stdin.take().unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel();
        let output = cat.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(output)
                .lines()
                .map_while(Result::ok)
            {
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = Setup {
            cfg,
            control,
            input,
            lines,
            forwarding: vec![],
            _cat: Bg(cat),
            _master: master,
            _sshd: sshd,
            _cluster: c,
        };
        assert_eq!(
            s.echo("one", Duration::from_secs(20)).as_deref(),
            Some("one")
        );
        // The first -R opens the proxy's forwarding connection to the node: a sshd process of
        // its own (the ones that were not there before).
        let before = descendants(s._sshd.0.id());
        let first = free_port();
        s.forward(first).ok();
        assert!(std::net::TcpStream::connect(("127.0.0.1", first)).is_ok());
        s.forwarding = descendants(s._sshd.0.id())
            .difference(&before)
            .copied()
            .collect();
        assert!(
            !s.forwarding.is_empty(),
            "no sshd for the forwarding connection"
        );
        s
    }

    fn mux(&self, args: &[&str]) -> Command {
        mux(&self.cfg, &self.control, args)
    }

    /// `-O forward -R port` over the master (the node's `port` back to a port nothing uses).
    fn forward_cmd(&self, port: u16) -> Command {
        self.mux(&[
            "-O",
            "forward",
            "-R",
            &format!("127.0.0.1:{port}:127.0.0.1:9"),
            "root@plain1",
        ])
    }

    fn forward(&self, port: u16) -> Run {
        run(&mut self.forward_cmd(port), "")
    }

    /// `word` through the interactive `cat`: what came back within `within`.
    fn echo(&mut self, word: &str, within: Duration) -> Option<String> {
        writeln!(self.input, "{word}").unwrap();
        self.input.flush().unwrap();
        self.lines.recv_timeout(within).ok()
    }

    /// The node's side of the forwarding connection, frozen until the guard goes.
    fn freeze(&self) -> Stopped {
        Stopped::signal(&self.forwarding, "-STOP");
        Stopped(self.forwarding.clone())
    }
}

#[test]
fn a_pending_remote_forward_does_not_hold_up_the_connection() {
    let mut s = Setup::start();
    // Frozen, the node cannot answer the next bind: it stays pending.
    let mut frozen = s.freeze();
    let second = free_port();
    let mut pending = Bg(s
        .forward_cmd(second)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap());
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        pending.0.try_wait().unwrap().is_none(),
        "the second -R was answered although the node could not bind it"
    );
    // Meanwhile the session on the same connection goes on (it waited up to 15 s before).
    assert_eq!(
        s.echo("two", Duration::from_secs(5)).as_deref(),
        Some("two"),
        "the session stalled while a remote forward was pending"
    );
    assert!(
        pending.0.try_wait().unwrap().is_none(),
        "the -R was still pending while the session went on"
    );

    // Once the node answers, so does the proxy: the bind is made and reported.
    frozen.cont();
    let answered = eventually(Duration::from_secs(20), || {
        pending.0.try_wait().unwrap().is_some()
    });
    assert!(answered, "the pending -R was never answered");
    assert_eq!(pending.0.wait().unwrap().code(), Some(0));
    assert!(std::net::TcpStream::connect(("127.0.0.1", second)).is_ok());
    assert_eq!(
        s.echo("three", Duration::from_secs(10)).as_deref(),
        Some("three")
    );
    run(&mut s.mux(&["-O", "exit", "root@plain1"]), "");
}

#[test]
fn a_remote_forward_the_node_binds_too_late_is_refused_and_undone() {
    let mut s = Setup::start();
    let mut frozen = s.freeze();
    // The node does not answer within the proxy's 15 s: the person is told no (while the
    // session goes on), and the bind the node makes later is cancelled, not left listening.
    let late = free_port();
    let waiting = std::thread::spawn({
        let cmd = s.forward_cmd(late);
        move || run(&mut { cmd }, "")
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        s.echo("while-pending", Duration::from_secs(5)).as_deref(),
        Some("while-pending")
    );
    waiting
        .join()
        .unwrap()
        .fails_with("remote port forwarding failed");
    frozen.cont();
    // Give the node time to bind and the proxy to undo it.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", late)).is_err()
        }),
        "the late bind was left listening"
    );
    // The connection is whole: a new -R works and the session goes on.
    let next = free_port();
    s.forward(next).ok();
    assert!(std::net::TcpStream::connect(("127.0.0.1", next)).is_ok());
    assert_eq!(
        s.echo("after", Duration::from_secs(10)).as_deref(),
        Some("after")
    );
    run(&mut s.mux(&["-O", "exit", "root@plain1"]), "");
}
