//! The end-to-end harness: starts the real `sallyport` binary on loopback ports the kernel
//! picks (port 0, read back from its banner) with a fresh data dir, and drives it with the real
//! `sally` and `sallyctl` binaries (and OpenSSH's own tools where they read what we write).
//! `Cluster::start()` is one line per test.
//!
//! The binaries come from the workspace target dir. `bin()` builds them first (`cargo build
//! --workspace --bins`, once for all test processes, under a file lock) when one is missing or
//! a source file changed since the last build, so plain `cargo test` works from a fresh clone.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use tempfile::TempDir;

/// The workspace's binaries the tests run.
const BINARIES: [&str; 3] = ["sallyport", "sally", "sallyctl"];

/// Where the workspace puts its binaries (next to this test executable's `deps/`), built or
/// rebuilt first when they are missing or older than the sources.
pub fn bin(name: &str) -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    let dir = BUILT.get_or_init(|| {
        let exe = std::env::current_exe().expect("current exe");
        let dir = exe
            .parent()
            .and_then(Path::parent)
            .expect("target dir")
            .to_path_buf();
        build::ensure_binaries(&dir);
        dir
    });
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace --bins`",
        p.display()
    );
    p
}

pub mod ha;
pub mod kube;
pub mod oidc;
pub mod pg;
pub mod s3;
pub mod web;

/// Building the binaries from a test: `cargo test -p sallyport-tests` compiles only this
/// crate, and Cargo has no stable way to make a test depend on another package's binaries.
mod build {
    use std::fs::File;
    use std::path::{Path, PathBuf};
    use std::process::Command;
    use std::time::SystemTime;

    /// The workspace root (this crate's parent), as compiled in.
    fn workspace() -> PathBuf {
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
        manifest.parent().unwrap_or(manifest).to_path_buf()
    }

    /// Newest modification time of what the binaries are built from: every file of the
    /// workspace but the test crate, build output, VCS data, npm packages and fuzz targets.
    /// Anything newer than the last build (documentation too) costs one no-op `cargo build`,
    /// after which the stamp is newer again.
    fn newest_source(root: &Path, target: &Path) -> Option<SystemTime> {
        let mut newest = None;
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                let Ok(ty) = e.file_type() else { continue };
                if ty.is_dir() {
                    let name = e.file_name();
                    let skip = path == target
                        || [".git", "target", "node_modules"]
                            .iter()
                            .any(|s| name == *s)
                        || dir == root && ["tests", "fuzz"].iter().any(|s| name == *s);
                    if !skip {
                        stack.push(path);
                    }
                } else if let Ok(m) = e.metadata().and_then(|m| m.modified()) {
                    newest = newest.max(Some(m));
                }
            }
        }
        newest
    }

    /// The time of the last build this workspace made into `dir`, from its stamp file.
    fn last_build(stamp: &Path, root: &Path) -> Option<SystemTime> {
        let text = std::fs::read_to_string(stamp).ok()?;
        // One target dir shared by two checkouts: a build of the other one does not count.
        if text.trim() != root.display().to_string() {
            return None;
        }
        std::fs::metadata(stamp).and_then(|m| m.modified()).ok()
    }

    fn fresh(dir: &Path, stamp: &Path, root: &Path) -> bool {
        let Some(built) = last_build(stamp, root) else {
            return false;
        };
        let target = dir.parent().unwrap_or(dir);
        super::BINARIES.iter().all(|b| dir.join(b).exists())
            && newest_source(root, target).is_none_or(|s| s <= built)
    }

    /// The error of a build that failed after the last change to the sources: every other test
    /// process reports it instead of building again (a broken build takes a while to fail).
    fn failed_since_last_change(failed: &Path, dir: &Path, root: &Path) -> Option<String> {
        let at = std::fs::metadata(failed).and_then(|m| m.modified()).ok()?;
        let target = dir.parent().unwrap_or(dir);
        newest_source(root, target)
            .is_none_or(|s| s <= at)
            .then(|| std::fs::read_to_string(failed).unwrap_or_default())
    }

    /// Runs `cargo build --workspace --bins` into `dir` (`target/<profile>`) unless the last
    /// one is newer than every source. Test processes run in parallel (nextest runs each test
    /// in its own): the first builds under an exclusive lock, the others wait and then find
    /// the binaries fresh. `SALLYPORT_TEST_NO_BUILD=1` uses what is there.
    pub fn ensure_binaries(dir: &Path) {
        if std::env::var_os("SALLYPORT_TEST_NO_BUILD").is_some_and(|v| v != "0") {
            return;
        }
        let root = workspace();
        let stamp = dir.join(".sallyport-tests-bins");
        if fresh(dir, &stamp, &root) {
            return;
        }
        let _ = std::fs::create_dir_all(dir);
        let lock = File::create(dir.join(".sallyport-tests-bins.lock")).expect("build lock file");
        lock.lock().expect("build lock");
        if fresh(dir, &stamp, &root) {
            return;
        }
        let failed = dir.join(".sallyport-tests-bins.failed");
        if let Some(error) = failed_since_last_change(&failed, dir, &root) {
            panic!("{error}");
        }
        // Files changed while cargo builds are newer than the stamp: the next test rebuilds.
        let started = SystemTime::now();
        let cargo = std::env::var_os("CARGO")
            .or_else(|| option_env!("CARGO").map(Into::into))
            .unwrap_or_else(|| "cargo".into());
        let target = dir.parent().unwrap_or(dir);
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--workspace", "--bins", "--manifest-path"])
            .arg(root.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(target);
        match dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                cmd.arg("--release");
            }
            Some(profile) => {
                cmd.args(["--profile", profile]);
            }
        }
        eprintln!("building the binaries the tests run: {cmd:?}");
        let out = cmd.output().expect("run cargo");
        if !out.status.success() {
            let error = format!(
                "cargo build --workspace --bins failed (SALLYPORT_TEST_NO_BUILD=1 runs the \
                 binaries that are there):\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            if let Ok(f) = File::create(&failed) {
                let _ = std::io::Write::write_all(&mut &f, error.as_bytes());
                let _ = f.set_modified(started);
            }
            panic!("{error}");
        }
        let _ = std::fs::remove_file(&failed);
        let f = File::create(&stamp).expect("build stamp");
        std::io::Write::write_all(&mut &f, root.display().to_string().as_bytes())
            .expect("build stamp");
        f.set_modified(started).expect("build stamp time");
    }
}

/// A loopback port nothing listens on, for what must know its port before it starts (an
/// external `sshd`, a forward's listening end); the daemon itself listens on port 0. From below
/// the kernel's ephemeral range (32768 and up here): a port the kernel hands out for `bind(0)` can be taken again, between this call and
/// the daemon's bind, as the source port of any of the many client connections the tests make,
/// and the daemon then fails with "Address already in use". Ports are picked pseudo-randomly per
/// process (nextest runs each test in its own) and checked by binding.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let seed = u64::from(std::process::id()).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
    for _ in 0..1000 {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let x = (seed ^ n.wrapping_mul(0xbf58_476d_1ce4_e5b9)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let port = 12000 + ((x >> 33) % 20000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// What a finished command said.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn from(o: Output) -> Self {
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        }
    }

    #[track_caller]
    pub fn ok(self) -> Self {
        assert_eq!(
            self.code, 0,
            "command failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        self
    }

    #[track_caller]
    pub fn fails_with(self, needle: &str) -> Self {
        assert_ne!(
            self.code, 0,
            "command should have failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        assert!(
            self.stderr.contains(needle) || self.stdout.contains(needle),
            "expected {needle:?} in the output:\nstdout: {}\nstderr: {}",
            self.stdout,
            self.stderr
        );
        self
    }
}

/// Runs a command with `stdin` and returns what it said.
pub fn run(cmd: &mut Command, stdin: &str) -> Run {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_string();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(data.as_bytes());
    });
    let out = child.wait_with_output().expect("wait");
    let _ = writer.join();
    Run::from(out)
}

/// Options for a test cluster.
#[derive(Clone)]
pub struct Options {
    pub second_factor: bool,
    pub max_login_attempts: u32,
    /// `postgres://...` to use PostgreSQL instead of the embedded SQLite.
    pub postgres: Option<String>,
    pub cluster_name: String,
    /// More `proxy_service` keys, one `key: value` a line (`ssh_login_grace: 2s`).
    pub proxy_service: Vec<String>,
    /// More `auth_service` keys, the same way (`audit: {checkpoint_every: 1}`).
    pub auth_service: Vec<String>,
    /// More `ssh_service` keys (the local agent's), the same way (`pam: {enabled: true}`).
    pub ssh_service: Vec<String>,
    /// The top-level `recordings:` section, as a YAML flow mapping
    /// (`{uri: s3://bucket/prefix, endpoint: http://127.0.0.1:PORT}`); none: the data dir.
    pub recordings: Option<String>,
    /// Environment variables for the daemon (`AWS_ACCESS_KEY_ID`, ...).
    pub env: Vec<(String, String)>,
    /// `sallyport.diag_addr` (`127.0.0.1:0`: the kernel picks the port, read from the banner
    /// into [`Cluster::diag`]); none: the diagnostics listener stays off.
    pub diag_addr: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            second_factor: false,
            max_login_attempts: 5,
            postgres: None,
            cluster_name: "test".into(),
            proxy_service: vec![],
            auth_service: vec![],
            ssh_service: vec![],
            recordings: None,
            env: vec![],
            diag_addr: None,
        }
    }
}

/// A running all-in-one `sallyport`, killed when dropped.
pub struct Cluster {
    pub dir: TempDir,
    /// The config file: the first start writes the ports it got into it, so that a restart
    /// listens where clients and agents saw it.
    pub config: PathBuf,
    /// The proxy's web address, `127.0.0.1:PORT`.
    pub proxy: String,
    /// Auth's address, `127.0.0.1:PORT`.
    pub auth: String,
    /// The proxy's SSH port (ProxyJump target).
    pub ssh_port: u16,
    /// The proxy's tunnel door (agents), `127.0.0.1:PORT`.
    pub tunnel: String,
    /// The proxy's Kubernetes door (kubectl), `127.0.0.1:PORT`.
    pub kube: String,
    /// The diagnostics listener, `127.0.0.1:PORT`, when [`Options::diag_addr`] set one.
    pub diag: Option<String>,
    pub pin: String,
    pub stdout: String,
    child: Option<Child>,
    /// `SALLY_HOME` for the clients this test runs.
    pub home: PathBuf,
    /// The daemon's environment beyond the test's (`Options::env`).
    env: Vec<(String, String)>,
    /// What the daemon wrote to stderr (its log), since it started; see [`Cluster::log`].
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Cluster {
    pub fn start() -> Self {
        Self::start_with(Options::default())
    }

    pub fn start_with(o: Options) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let storage = match &o.postgres {
            Some(url) => format!("{{type: postgres, conn_string: \"{url}\"}}"),
            None => "{type: sqlite}".into(),
        };
        let config = dir.path().join("sallyport.yaml");
        std::fs::write(
            &config,
            format!(
                "version: v1
sallyport:
  data_dir: {data}
  nodename: local1
  log: {{severity: info, format: text}}
  storage: {storage}
{diag}auth_service:
  enabled: true
  listen_addr: 127.0.0.1:0
  cluster_name: {cluster}
  authentication: {{type: local, second_factor: {sf}, max_login_attempts: {max}}}
{auth_extra}proxy_service:
  enabled: true
  web_listen_addr: 127.0.0.1:0
  ssh_listen_addr: 127.0.0.1:0
  tunnel_listen_addr: 127.0.0.1:0
  kube_listen_addr: 127.0.0.1:0
{proxy_extra}ssh_service:
  enabled: true
  labels: {{env: dev}}
{ssh_extra}{recordings}",
                auth_extra = o
                    .auth_service
                    .iter()
                    .map(|l| format!("  {l}\n"))
                    .collect::<String>(),
                proxy_extra = o
                    .proxy_service
                    .iter()
                    .map(|l| format!("  {l}\n"))
                    .collect::<String>(),
                ssh_extra = o
                    .ssh_service
                    .iter()
                    .map(|l| format!("  {l}\n"))
                    .collect::<String>(),
                recordings = o
                    .recordings
                    .as_ref()
                    .map(|r| format!("recordings: {r}\n"))
                    .unwrap_or_default(),
                diag = o
                    .diag_addr
                    .as_ref()
                    .map(|a| format!("  diag_addr: {a}\n"))
                    .unwrap_or_default(),
                data = dir.path().join("data").display(),
                cluster = o.cluster_name,
                sf = if o.second_factor { "otp" } else { "off" },
                max = o.max_login_attempts,
            ),
        )
        .unwrap();
        let home = dir.path().join("home");
        let mut c = Cluster {
            config,
            proxy: String::new(),
            auth: String::new(),
            ssh_port: 0,
            tunnel: String::new(),
            kube: String::new(),
            diag: None,
            pin: String::new(),
            stdout: String::new(),
            child: None,
            home,
            env: o.env.clone(),
            log: Default::default(),
            dir,
        };
        c.boot();
        c
    }

    /// Starts (or restarts) the daemon and waits for its banner, which says where it listens.
    /// The first start listens on ports the kernel picks (port 0: no two tests can race for
    /// one) and writes them into the config file for the restarts.
    pub fn boot(&mut self) {
        let restart = self.ssh_port != 0;
        let deadline = Instant::now() + Duration::from_secs(30);
        let banner = loop {
            match self.spawn_daemon() {
                Ok(banner) => break banner,
                // A port the stop freed can be taken, before the restart binds it again, as
                // the source port of another test's outgoing connection (the kernel's ports
                // are the ephemeral ones): it is free again when that connection closes.
                Err(why)
                    if restart
                        && why.contains("Address already in use")
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(why) => panic!("sallyport did not start: {why}"),
            }
        };
        let addr = |key: &str| {
            banner
                .lines()
                .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
                .map(|v| {
                    let v = v.trim();
                    let v = v.strip_prefix("https://").unwrap_or(v);
                    v.split_whitespace().next().unwrap_or_default().to_string()
                })
                .unwrap_or_else(|| panic!("no {key} address in the banner:\n{banner}"))
        };
        self.auth = addr("auth");
        self.proxy = addr("web");
        self.tunnel = addr("tunnel");
        self.kube = addr("kube");
        self.diag = banner
            .lines()
            .find_map(|l| l.strip_prefix("diag")?.trim().strip_prefix("http://"))
            .map(str::to_string);
        let ssh = addr("ssh");
        self.ssh_port = ssh
            .rsplit_once(':')
            .and_then(|(_, p)| p.parse().ok())
            .unwrap_or_else(|| panic!("ssh address {ssh:?} in the banner"));
        if !restart {
            let text = std::fs::read_to_string(&self.config).unwrap();
            let mut out = String::new();
            for line in text.lines() {
                let bound = [
                    ("listen_addr", &self.auth),
                    ("web_listen_addr", &self.proxy),
                    ("ssh_listen_addr", &ssh),
                    ("tunnel_listen_addr", &self.tunnel),
                    ("kube_listen_addr", &self.kube),
                ]
                .into_iter()
                .chain(self.diag.as_ref().map(|d| ("diag_addr", d)))
                .find(|(key, _)| line.trim() == format!("{key}: 127.0.0.1:0"));
                match bound {
                    Some((key, addr)) => out.push_str(&format!("  {key}: {addr}\n")),
                    None => {
                        out.push_str(line);
                        out.push('\n');
                    }
                }
            }
            std::fs::write(&self.config, out).unwrap();
        }
        self.pin = banner
            .lines()
            .find_map(|l| l.strip_prefix("CA pin"))
            .map(|p| p.trim().to_string())
            .unwrap();
        self.stdout = banner;
    }

    /// Runs `sallyport start` and returns its banner once it printed the CA pin, or what it
    /// said on stderr if it exited first. Its stderr goes on to the test's.
    fn spawn_daemon(&mut self) -> Result<String, String> {
        let mut child = Command::new(bin("sallyport"))
            .args(["start", "--config"])
            .arg(&self.config)
            .env("SALLYPORT_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                text.push_str(&line);
                text.push('\n');
                if line.starts_with("CA pin") {
                    let _ = tx.send(text.clone());
                }
            }
        });
        let stderr = child.stderr.take().unwrap();
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let said2 = said.clone();
        let log = self.log.clone();
        let errors = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("{line}");
                let mut s = said2.lock().unwrap();
                if s.len() < 64 * 1024 {
                    s.push_str(&line);
                    s.push('\n');
                }
                let mut l = log.lock().unwrap();
                if l.len() < 1024 * 1024 {
                    l.push_str(&line);
                    l.push('\n');
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(banner) => {
                self.child = Some(child);
                Ok(banner)
            }
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                // Its stdout closed before the banner: it exited.
                let status = child.wait().unwrap();
                let _ = errors.join();
                let said = said.lock().unwrap().clone();
                Err(format!("{status}: {said}"))
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                Err("no banner within 60 s".into())
            }
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // A daemon killed while its local agent is joining leaves the node registered in
            // auth without the identity the agent would have kept, and the next start's join
            // is then refused ("node name local1 is already taken"), as it should be.
            let agent = std::fs::read_to_string(&self.config)
                .is_ok_and(|t| t.contains("ssh_service:\n  enabled: true"));
            if agent {
                let identity = self.data_dir().join("agent-identity.json");
                eventually(Duration::from_secs(30), || identity.exists());
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops the daemon cleanly (SIGTERM, as a service manager does) and waits for it to exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let sent = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status()
                .unwrap();
            assert!(sent.success());
            let status = c.wait().unwrap();
            assert!(status.success(), "sallyport exited with {status}");
        }
    }

    /// What the daemon logged (at `warn` and above) in all its runs so far.
    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// The daemon's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The daemon's resident memory, in bytes.
    pub fn rss(&self) -> u64 {
        let pid = self.pid().expect("the daemon runs");
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .unwrap()
            * 1024
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    pub fn sallyctl(&self, args: &[&str]) -> Run {
        run(
            Command::new(bin("sallyctl"))
                .arg("--data-dir")
                .arg(self.data_dir())
                .args(args),
            "",
        )
    }

    /// `sallyctl` as the user logged in under `home` (no admin identity).
    pub fn sallyctl_as(&self, home: &Path, args: &[&str]) -> Run {
        run(
            Command::new(bin("sallyctl"))
                .env("SALLY_HOME", home)
                .env("HOME", home)
                .args(args),
            "",
        )
    }

    pub fn sally(&self, home: &Path, args: &[&str], stdin: &str) -> Run {
        run(
            Command::new(bin("sally"))
                .env("SALLY_HOME", home)
                .env("HOME", home)
                .args(args),
            stdin,
        )
    }

    /// Audit events of type `kind`, as `sallyctl audit search --type KIND` prints them.
    pub fn events(&self, kind: &str) -> Vec<serde_json::Value> {
        self.sallyctl(&["audit", "search", "--type", kind])
            .ok()
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The audit records of `kind` once `done` holds for them, or as they are after 10 s: a
    /// proxy's `kube.request` and `kube.port_forward` records reach auth a moment after the
    /// request, gathered into one write. Once `done` holds they are read again after 200 ms
    /// (well past the door's 25 ms gather), so that a test counting them exactly also sees a
    /// record that should not be there and came in a later write.
    pub fn events_when(
        &self,
        kind: &str,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let mut events = self.events(kind);
        let start = Instant::now();
        while !done(&events) && start.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
            events = self.events(kind);
        }
        if done(&events) {
            std::thread::sleep(Duration::from_millis(200));
            events = self.events(kind);
        }
        events
    }

    /// Writes `yaml` to a file in the test dir and runs `sallyctl create` on it.
    pub fn create(&self, yaml: &str) -> Run {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let f = self.dir.path().join(format!("resource-{n}.yaml"));
        std::fs::write(&f, yaml).unwrap();
        self.sallyctl(&["create", &f.display().to_string()])
    }

    /// Creates a user and returns its sign-up token.
    pub fn add_user(&self, name: &str, roles: &str, logins: &str) -> String {
        let mut args = vec!["users", "add", name, "--roles", roles, "--format", "json"];
        if !logins.is_empty() {
            args.extend(["--logins", logins]);
        }
        let out = self.sallyctl(&args).ok();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        v["token"].as_str().unwrap().to_string()
    }

    /// Signs up with `password`; returns the TOTP secret (base32) when the cluster asks for one.
    pub fn signup(&self, token: &str, password: &str) -> Option<String> {
        let mut child = Command::new(bin("sally"))
            .env("SALLY_HOME", &self.home)
            .args([
                "signup",
                "--proxy",
                &self.proxy,
                "--token",
                token,
                "--ca-pin",
                &self.pin,
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        writeln!(stdin, "{password}").unwrap();
        let mut secret = None;
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        // With TOTP the URI comes alone on a line, and then the code is read.
        if out.read_line(&mut line).unwrap() > 0 && line.starts_with("otpauth://") {
            let totp = totp_rs::Totp::from_url(line.trim()).unwrap();
            writeln!(stdin, "{}", totp.generate_current()).unwrap();
            secret = Some(totp.secret().to_base32());
        }
        drop(stdin);
        let status = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&status.stderr);
        assert!(status.status.success(), "signup failed: {line}{err}");
        secret
    }

    /// Logs in as `user` (password only: clusters started with the default options).
    pub fn login(&self, home: &Path, user: &str, password: &str) -> Run {
        self.sally(
            home,
            &[
                "login",
                "--proxy",
                &self.proxy,
                "--user",
                user,
                "--ca-pin",
                &self.pin,
            ],
            &format!("{password}\n"),
        )
    }

    /// A new user, signed up and logged in under a fresh home; returns that home.
    pub fn user(&self, name: &str, roles: &str, logins: &str) -> PathBuf {
        let token = self.add_user(name, roles, logins);
        self.signup(&token, "correct horse battery");
        let home = self.dir.path().join(format!("home-{name}"));
        self.login(&home, name, "correct horse battery").ok();
        home
    }

    /// Runs SQL against the SQLite backend with Python's sqlite3 (to play the attacker who
    /// edits the database, or a clock that moved on).
    pub fn sqlite(&self, sql: &str) {
        let db = self.data_dir().join("sallyport.db");
        let out = Command::new("python3")
            .args(["-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()"])
            .arg(db)
            .arg(sql)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sqlite: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A plain HTTP `GET` of `path` at `addr` (the diagnostics listener): its status and body.
pub fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::Read;
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, body.to_string())
}

/// A node agent (`sallyport start --roles=node`) in its own process, killed when dropped.
pub struct Agent {
    pub name: String,
    pub labels: String,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Agent {
    pub fn new(name: &str, labels: &str, dir: PathBuf, child: Child) -> Self {
        Agent {
            name: name.into(),
            labels: labels.into(),
            dir,
            child: Some(child),
        }
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Cluster {
    /// A join token from `sallyctl tokens add --type=node --format json`.
    pub fn join_token(&self) -> String {
        let out = self
            .sallyctl(&["tokens", "add", "--type=node", "--format", "json"])
            .ok();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        v["token"].as_str().unwrap().to_string()
    }

    /// Runs `sallyport start --roles=node` and returns what it printed if it exited.
    pub fn agent_command(
        &self,
        name: &str,
        labels: &str,
        token: Option<&str>,
        dir: &Path,
    ) -> Command {
        let mut cmd = Command::new(bin("sallyport"));
        cmd.args([
            "start",
            "--roles=node",
            "--proxy",
            &self.proxy,
            "--nodename",
            name,
            "--ca-pin",
            &self.pin,
        ])
        .arg("--data-dir")
        .arg(dir)
        .env("SALLYPORT_LOG", "warn");
        if !labels.is_empty() {
            cmd.args(["--labels", labels]);
        }
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        cmd
    }

    /// Starts an agent named `name` and waits until `sally ls` would show it online.
    pub fn agent(&self, name: &str, labels: &str) -> Agent {
        let dir = self.dir.path().join(format!("agent-{name}"));
        let token = self.join_token();
        let child = self
            .agent_command(name, labels, Some(&token), &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let agent = Agent {
            name: name.into(),
            labels: labels.into(),
            dir,
            child: Some(child),
        };
        self.wait_online(name);
        agent
    }

    /// Restarts a stopped agent from its data dir (no token: it reuses its identity).
    pub fn restart_agent(&self, agent: &mut Agent) {
        agent.stop();
        let child = self
            .agent_command(&agent.name, &agent.labels, None, &agent.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        agent.child = Some(child);
    }

    pub fn node_online(&self, name: &str) -> bool {
        let out = self.sallyctl(&["nodes", "ls", "--format", "json"]);
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&out.stdout) else {
            return false;
        };
        v.as_array().is_some_and(|nodes| {
            nodes
                .iter()
                .any(|n| n["hostname"] == name && n["online"] == true)
        })
    }

    pub fn wait_online(&self, name: &str) {
        assert!(
            eventually(Duration::from_secs(30), || self.node_online(name)),
            "node {name} never came online"
        );
    }

    /// An ssh_config for plain OpenSSH as the user logged in under `home`: `proxy` is the
    /// proxy's SSH port, every other host is verified through the cluster's host CA.
    pub fn ssh_config(&self, home: &Path, user: &str) -> PathBuf {
        let keys = home.join("keys").join(self.proxy.replace(':', "_"));
        let cfg = home.join("ssh_config");
        std::fs::write(
            &cfg,
            format!(
                "Host proxy\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\nHost *\n  UserKnownHostsFile {kh}\n  IdentityFile {key}\n  CertificateFile {key}-cert.pub\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 20\n",
                port = self.ssh_port,
                kh = home.join("known_hosts").display(),
                key = keys.join(user).display(),
            ),
        )
        .unwrap();
        cfg
    }

    /// `ssh -F <config> -J proxy <args>` left running (stdin open, stderr dropped), and the
    /// first line it printed, trimmed: a pid the session echoed, for instance.
    pub fn ssh_running(&self, cfg: &Path, args: &[&str]) -> (Child, String) {
        let mut ssh = Command::new("ssh")
            .arg("-F")
            .arg(cfg)
            .args(["-J", "proxy"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(ssh.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        (ssh, line.trim().to_string())
    }

    /// `ssh -F <config> -J proxy <args>` with stdin.
    pub fn ssh(&self, cfg: &Path, args: &[&str], stdin: &str) -> Run {
        run(
            Command::new("ssh")
                .arg("-F")
                .arg(cfg)
                .args(["-J", "proxy"])
                .args(args),
            stdin,
        )
    }
}

/// A process killed (and reaped) when dropped.
pub struct Bg(pub Child);

impl Drop for Bg {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain OpenSSH `sshd` on 127.0.0.1:`port`, its files in `dir`, trusting `ca` for user
/// certificates (the cluster's OpenSSH CA, for an agentless node); its host key is
/// `dir/<hostkey>`, made the first time. sshd's defaults otherwise (forwarding allowed, no
/// `Subsystem` line), without PAM and passwords.
pub fn start_sshd(dir: &Path, port: u16, ca: &str, hostkey: &str) -> Bg {
    std::fs::create_dir_all("/run/sshd").unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let key = dir.join(hostkey);
    if !key.exists() {
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    std::fs::write(dir.join("user_ca.pub"), ca).unwrap();
    let cfg = dir.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {key}\nTrustedUserCAKeys {ca}\nPidFile {pid}\nAuthorizedKeysFile none\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin yes\nUsePAM no\nStrictModes no\n",
            key = key.display(),
            ca = dir.join("user_ca.pub").display(),
            pid = dir.join("sshd.pid").display(),
        ),
    )
    .unwrap();
    let child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("/usr/sbin/sshd (scripts/test installs openssh-server)");
    assert!(
        eventually(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        }),
        "sshd did not start"
    );
    Bg(child)
}

/// An agentless node: a plain `sshd` trusting the cluster's OpenSSH CA, registered as `name`.
pub struct AgentlessNode {
    pub sshd: Bg,
    pub port: u16,
    /// sshd's files (config, host key, trusted CA).
    pub dir: PathBuf,
}

impl Cluster {
    /// Starts an agentless node and adds it (`sallyctl nodes add --name NAME --addr ... EXTRA`).
    pub fn agentless_node(&self, name: &str, extra: &[&str]) -> AgentlessNode {
        let dir = self.dir.path().join(format!("sshd-{name}"));
        let ca = self
            .sallyctl(&["auth", "export", "--type=openssh"])
            .ok()
            .stdout;
        let port = free_port();
        let sshd = start_sshd(&dir, port, &ca, "hostkey");
        let addr = format!("127.0.0.1:{port}");
        let mut args = vec!["nodes", "add", "--name", name, "--addr", &addr];
        args.extend_from_slice(extra);
        self.sallyctl(&args).ok();
        AgentlessNode { sshd, port, dir }
    }
}

/// Runs a user-management command (`useradd`, `groupadd`, `usermod`, ...), retrying while
/// another test holds /etc/passwd's lock.
pub fn host_admin(args: &[&str]) {
    let mut last = String::new();
    for _ in 0..50 {
        let out = Command::new(args[0]).args(&args[1..]).output().unwrap();
        if out.status.success() {
            return;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{args:?} failed: {last}");
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TOTP code for `secret` at `offset_steps` from now (1 = the next 30 s step).
pub fn totp_code(secret: &str, offset_steps: i64) -> String {
    totp_code_at(secret, sallyport_core::unix_now() + 30 * offset_steps)
}

/// The TOTP code for `secret` of the 30 s step holding `unix` seconds.
pub fn totp_code_at(secret: &str, unix: i64) -> String {
    totp_rs::Builder::new()
        .with_secret(totp_rs::Secret::try_from_base32(secret).unwrap())
        .build()
        .unwrap()
        .generate(unix as u64)
        .to_string()
}

/// Waits until `f` returns true or `timeout` passes.
pub fn eventually(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < timeout {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}
