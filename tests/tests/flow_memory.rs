//! End-to-end flow control: a slow reader slows the writer through the proxy, as SSH windows do
//! between OpenSSH peers, instead of the proxy buffering. Four `ssh -J` sessions each stream
//! 100 MB to a reader taking 8 MB/s — at the user's end (download) and at the node's
//! (upload) — while the daemon's resident memory is sampled; every byte must arrive, and the
//! peak must stay within what the channel windows allow.
//!
//! The bound, per session: what russh may hold for a channel is its window (see
//! `vendor/russh/PATCHES.md`, `core::flow`): the node connection's (8 MiB toward an agent),
//! the inner connection's and the door's (2 MiB each, OpenSSH's own); the local agent runs in
//! the same process and holds at most its own 8 MiB window; the recording's queue holds at most
//! 4 MiB for a writer behind (`record::QUEUE_BYTES`: 100 MB of zeros is 600 MB of asciicast, and
//! a slow disk lags). Four sessions: 4 × 24 MiB, over a
//! baseline taken after one session ran (so what every connection allocates once is in it),
//! and 16 MiB for the allocator's slack. Measured here (debug build): 84→133 MiB down, 81→117
//! MiB up; before the proxy reported consumption, 83→279 MiB down and 79→334 MiB up.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sallyport_tests::*;

const SESSIONS: usize = 4;
const BYTES: u64 = 100_000_000;
const MIB: u64 = 1024 * 1024;
const PER_SESSION: u64 = 24 * MIB;
const SLACK: u64 = 16 * MIB;

/// Reads stdin at about 8 MB/s (a millisecond per 8 KB, paced against the clock), checks that
/// every byte is zero and prints how many it read.
const SLOW_READER: &str = r#"
import sys, time
rate = 8_000_000
total = 0
bad = 0
start = time.monotonic()
stdin = sys.stdin.buffer
while True:
    chunk = stdin.read1(65536)
    if not chunk:
        break
    total += len(chunk)
    if chunk.count(0) != len(chunk):
        bad += 1
    ahead = total / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
print(total if bad == 0 else f"{total} bytes, {bad} chunks not zero")
"#;

fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Samples the daemon's resident memory every 50 ms until `done`; returns the peak.
fn sample(pid: u32, done: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    std::thread::spawn(move || {
        let peak = AtomicU64::new(0);
        while !done.load(Ordering::SeqCst) {
            peak.fetch_max(rss(pid), Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(50));
        }
        peak.load(Ordering::SeqCst)
    })
}

struct Setup {
    cluster: Cluster,
    cfg: PathBuf,
    reader: PathBuf,
}

fn setup() -> Setup {
    // The streams are NUL bytes, which a recording stores as six bytes each (`\u0000`): four
    // 100 MB sessions would write 2.4 GB of recordings. Stopping the recordings early
    // (best_effort goes on unrecorded) leaves the relay, which is what is measured.
    let cluster = Cluster::start_with(Options {
        proxy_service: vec!["max_recording_size: 1MiB".into()],
        ..Options::default()
    });
    cluster.wait_online("local1");
    let home = cluster.user("alice", "access", "root");
    let cfg = cluster.ssh_config(&home, "alice");
    let reader = cluster.dir.path().join("slow_reader.py");
    std::fs::write(&reader, SLOW_READER).unwrap();
    // The local node runs sessions as root on this machine: the reader is reachable there.
    let mut perms = std::fs::metadata(cluster.dir.path()).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(cluster.dir.path(), perms).unwrap();
    // A first session, so what every connection allocates once is in the baseline.
    cluster
        .ssh(&cfg, &["root@local1", "head -c 10000000 /dev/zero"], "")
        .ok();
    Setup {
        cluster,
        cfg,
        reader,
    }
}

fn ssh(cfg: &Path, command: &str) -> Command {
    let mut c = Command::new("ssh");
    c.arg("-F")
        .arg(cfg)
        .args(["-J", "proxy", "root@local1", command]);
    c
}

/// Runs the four sessions `start` makes (each returning what its reader printed) while
/// sampling the daemon; asserts every reader got all 100 MB of zeros and the peak stayed in
/// bounds.
fn measure(s: &Setup, what: &str, start: impl Fn() -> std::thread::JoinHandle<String>) {
    let pid = s.cluster.pid().expect("the daemon runs");
    std::thread::sleep(Duration::from_millis(500));
    let baseline = rss(pid);
    let done = Arc::new(AtomicBool::new(false));
    let sampler = sample(pid, done.clone());
    let started = Instant::now();
    let sessions: Vec<_> = (0..SESSIONS).map(|_| start()).collect();
    let results: Vec<String> = sessions.into_iter().map(|s| s.join().unwrap()).collect();
    let took = started.elapsed();
    done.store(true, Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    let bound = baseline + SESSIONS as u64 * PER_SESSION + SLACK;
    eprintln!(
        "{what}: baseline {} MiB, peak {} MiB, bound {} MiB, {SESSIONS} × {BYTES} bytes in {took:?}",
        baseline / MIB,
        peak / MIB,
        bound / MIB
    );
    for r in &results {
        assert_eq!(r.trim(), BYTES.to_string(), "{what}: a reader got {r:?}");
    }
    assert!(
        peak <= bound,
        "{what}: the daemon grew from {} MiB to {} MiB (bound {} MiB)",
        baseline / MIB,
        peak / MIB,
        bound / MIB
    );
}

#[test]
fn slow_readers_at_the_users_end_hold_back_the_node_not_the_proxys_memory() {
    let s = setup();
    measure(&s, "download", || {
        let mut ssh = ssh(&s.cfg, &format!("head -c {BYTES} /dev/zero"))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = ssh.stdout.take().unwrap();
        let reader = Command::new("python3")
            .arg(&s.reader)
            .stdin(Stdio::from(out))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::spawn(move || {
            let got = reader.wait_with_output().unwrap();
            let status = ssh.wait().unwrap();
            assert!(status.success(), "ssh: {status}");
            String::from_utf8_lossy(&got.stdout).into_owned()
        })
    });
}

#[test]
fn slow_readers_on_the_node_hold_back_the_user_not_the_proxys_memory() {
    let s = setup();
    let blob = s.cluster.dir.path().join("zeros");
    let mut f = std::fs::File::create(&blob).unwrap();
    let mib = vec![0u8; 1_000_000];
    for _ in 0..BYTES / 1_000_000 {
        f.write_all(&mib).unwrap();
    }
    drop(f);
    let command = format!("python3 {}", s.reader.display());
    measure(&s, "upload", || {
        let input = std::fs::File::open(&blob).unwrap();
        let ssh = ssh(&s.cfg, &command)
            .stdin(Stdio::from(input))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        std::thread::spawn(move || {
            let out = ssh.wait_with_output().unwrap();
            assert!(
                out.status.success(),
                "ssh: {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        })
    });
}
