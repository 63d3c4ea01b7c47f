//! The scale-out topology as processes on loopback: one PostgreSQL database (scripts/test's
//! server, a fresh database per topology), auth instances (`--roles=auth`), proxies that join
//! them with `proxy` tokens (`--roles=proxy --auth-server A,B --token T --ca-pin P`), and node
//! agents (`--roles=node`) that join through one proxy and then keep a tunnel to every proxy.
//! Each process can be killed (`kill -9`), stopped cleanly and started again from its data dir.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{Run, TempDir, bin, eventually, free_port, run};

/// One `sallyport` process: its config, data dir and what its banner said.
pub struct Service {
    pub name: String,
    pub config: PathBuf,
    pub data: PathBuf,
    /// Extra arguments for every start (`--auth-server ...`).
    pub args: Vec<String>,
    /// Arguments for the first start only (`--token ...`).
    pub first_args: Vec<String>,
    /// Its environment beyond the test's (the recording store's credentials).
    pub env: Vec<(String, String)>,
    pub banner: String,
    child: Option<Child>,
    started: bool,
}

impl Service {
    fn spawn(&mut self) -> Result<String, String> {
        let mut cmd = Command::new(bin("sallyport"));
        cmd.args(["start", "--config"])
            .arg(&self.config)
            .args(&self.args)
            .env("SALLYPORT_LOG", "warn")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !self.started {
            cmd.args(&self.first_args);
        }
        let mut child = cmd.spawn().map_err(|e| e.to_string())?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        let wants = if self.name.starts_with("node") {
            "joined cluster"
        } else {
            "CA pin"
        };
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                text.push_str(&line);
                text.push('\n');
                if line.starts_with(wants) || line.contains(wants) {
                    let _ = tx.send(text.clone());
                }
            }
        });
        let stderr = child.stderr.take().ok_or("no stderr")?;
        let name = self.name.clone();
        let said = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let said2 = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                eprintln!("[{name}] {line}");
                if let Ok(mut s) = said2.lock()
                    && s.len() < 64 * 1024
                {
                    s.push_str(&line);
                    s.push('\n');
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(banner) => {
                self.child = Some(child);
                self.started = true;
                Ok(banner)
            }
            Err(_) => {
                let _ = child.kill();
                let status = child.wait().map(|s| s.to_string()).unwrap_or_default();
                std::thread::sleep(Duration::from_millis(200));
                Err(format!(
                    "{status}: {}",
                    said.lock().map(|s| s.clone()).unwrap_or_default()
                ))
            }
        }
    }

    /// Starts the service; what it said when it exited instead.
    pub fn try_start(&mut self) -> Result<(), String> {
        self.spawn().map(|b| self.banner = b)
    }

    /// Starts the service (again) and waits for its banner.
    pub fn start(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.spawn() {
                Ok(b) => {
                    self.banner = b;
                    return;
                }
                // A port freed by a kill can be briefly taken as another test's source port.
                Err(why) if why.contains("Address already in use") && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(500))
                }
                Err(why) => panic!("{} did not start: {why}", self.name),
            }
        }
    }

    /// `kill -9`: no clean shutdown, nothing flushed.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as a service manager stops it, and wait for the exit.
    pub fn terminate(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
            let _ = c.wait();
        }
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A proxy's addresses.
pub struct ProxyAddrs {
    pub web: String,
    pub ssh_port: u16,
    pub tunnel: String,
}

/// The whole topology.
pub struct Topology {
    pub dir: TempDir,
    pub db_url: String,
    db_name: String,
    admin_url: String,
    pub auths: Vec<Service>,
    pub auth_addrs: Vec<String>,
    pub proxies: Vec<Service>,
    pub proxy_addrs: Vec<ProxyAddrs>,
    pub nodes: Vec<Service>,
    pub pin: String,
    /// The `recordings:` section of auth's and the proxies' configs, if any.
    store: Option<String>,
    store_env: Vec<(String, String)>,
    /// More `auth_service` keys for every auth instance, one `key: value` each.
    auth_extra: Vec<String>,
}

/// Runs SQL as the test role on the server's `postgres` database.
fn psql(admin_url: &str, sql: &str) {
    let out = Command::new("psql")
        .arg(admin_url)
        .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
        .output()
        .expect("psql");
    assert!(
        out.status.success(),
        "psql: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Topology {
    /// `auths` auth instances and `proxies` proxies on one fresh PostgreSQL database, and
    /// `nodes` agents named node1.. joined through the first proxy. Returns once every node is
    /// online.
    pub fn start(auths: usize, proxies: usize, nodes: usize) -> Self {
        Self::start_with(auths, proxies, nodes, None)
    }

    /// The same with recordings in S3: `store` is the `recordings:` section (the services get
    /// the test credentials in their environment).
    pub fn start_with(auths: usize, proxies: usize, nodes: usize, store: Option<String>) -> Self {
        Self::start_custom(auths, proxies, nodes, store, &[])
    }

    /// The same with more `auth_service` keys (`host_cert_ttl: 40s`).
    pub fn start_custom(
        auths: usize,
        proxies: usize,
        nodes: usize,
        store: Option<String>,
        auth_extra: &[&str],
    ) -> Self {
        let base = std::env::var("SALLYPORT_TEST_POSTGRES").expect(
            "set SALLYPORT_TEST_POSTGRES=postgres://user:pass@127.0.0.1:5432 (scripts/test does)",
        );
        let db_name = format!("sp_ha_{}_{}", std::process::id(), free_port());
        let admin_url = format!("{base}/postgres");
        psql(&admin_url, &format!("DROP DATABASE IF EXISTS {db_name}"));
        psql(&admin_url, &format!("CREATE DATABASE {db_name}"));
        let dir = tempfile::tempdir().expect("tempdir");
        let mut t = Topology {
            db_url: format!("{base}/{db_name}"),
            db_name,
            admin_url,
            dir,
            auths: vec![],
            auth_addrs: vec![],
            proxies: vec![],
            proxy_addrs: vec![],
            nodes: vec![],
            pin: String::new(),
            store_env: if store.is_some() {
                crate::s3::credentials()
            } else {
                vec![]
            },
            store,
            auth_extra: auth_extra.iter().map(|l| l.to_string()).collect(),
        };
        for i in 1..=auths {
            let (mut s, addr) = t.auth_service(&format!("auth{i}"));
            // Auth instances share the audit checkpoint key (kept outside the database so that a
            // database writer cannot re-sign the chain): the operator copies it, as here.
            if i > 1 {
                std::fs::create_dir_all(&s.data).expect("data dir");
                let key = "audit-checkpoint.key";
                std::fs::copy(t.auths[0].data.join(key), s.data.join(key)).expect("key copy");
            }
            // One at a time: the first creates the schema and the CAs, the others find them.
            s.start();
            t.pin = s
                .banner
                .lines()
                .find_map(|l| l.strip_prefix("CA pin"))
                .map(|p| p.trim().to_string())
                .unwrap_or_default();
            t.auths.push(s);
            t.auth_addrs.push(addr);
        }
        for i in 1..=proxies {
            t.add_proxy(i);
        }
        for i in 1..=nodes {
            t.add_node(&format!("node{i}"));
        }
        for i in 1..=nodes {
            t.wait_online(&format!("node{i}"));
        }
        t
    }

    /// An auth instance on the topology's database (not started), and its address.
    pub fn auth_service(&self, name: &str) -> (Service, String) {
        let addr = format!("127.0.0.1:{}", free_port());
        let data = self.dir.path().join(name);
        let config = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &config,
            format!(
                "version: v1
sallyport:
  data_dir: {data}
  log: {{severity: info, format: text}}
  storage: {{type: postgres, conn_string: \"{db}\"}}
auth_service:
  enabled: true
  listen_addr: {addr}
  cluster_name: ha
  authentication: {{type: local, second_factor: off}}
{extra}proxy_service:
  enabled: false
ssh_service:
  enabled: false
{store}",
                data = data.display(),
                db = self.db_url,
                extra = self
                    .auth_extra
                    .iter()
                    .map(|l| format!("  {l}\n"))
                    .collect::<String>(),
                store = self
                    .store
                    .as_ref()
                    .map(|s| format!("recordings: {s}\n"))
                    .unwrap_or_default(),
            ),
        )
        .expect("config");
        let s = Service {
            name: name.to_string(),
            config,
            data,
            args: vec![],
            first_args: vec![],
            env: self.store_env.clone(),
            banner: String::new(),
            child: None,
            started: false,
        };
        (s, addr)
    }

    fn add_proxy(&mut self, i: usize) {
        let name = format!("proxy{i}");
        let data = self.dir.path().join(&name);
        let config = self.dir.path().join(format!("{name}.yaml"));
        let (web, ssh, tunnel, kube) = (free_port(), free_port(), free_port(), free_port());
        std::fs::write(
            &config,
            format!(
                "version: v1
sallyport:
  data_dir: {data}
  nodename: {name}
  log: {{severity: info, format: text}}
auth_service:
  enabled: false
proxy_service:
  enabled: true
  web_listen_addr: 127.0.0.1:{web}
  ssh_listen_addr: 127.0.0.1:{ssh}
  tunnel_listen_addr: 127.0.0.1:{tunnel}
  kube_listen_addr: 127.0.0.1:{kube}
ssh_service:
  enabled: false
{store}",
                data = data.display(),
                store = self
                    .store
                    .as_ref()
                    .map(|s| format!("recordings: {s}\n"))
                    .unwrap_or_default(),
            ),
        )
        .expect("config");
        let token = self.token("proxy");
        let mut s = Service {
            name,
            config,
            data,
            args: vec!["--auth-server".into(), self.auth_addrs.join(",")],
            first_args: vec!["--token".into(), token, "--ca-pin".into(), self.pin.clone()],
            env: self.store_env.clone(),
            banner: String::new(),
            child: None,
            started: false,
        };
        s.start();
        self.proxies.push(s);
        self.proxy_addrs.push(ProxyAddrs {
            web: format!("127.0.0.1:{web}"),
            ssh_port: ssh,
            tunnel: format!("127.0.0.1:{tunnel}"),
        });
    }

    /// A node agent joined through the first proxy.
    pub fn add_node(&mut self, name: &str) {
        let data = self.dir.path().join(name);
        let config = self.dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &config,
            format!(
                "version: v1
sallyport:
  data_dir: {data}
  nodename: {name}
  log: {{severity: info, format: text}}
auth_service:
  enabled: false
proxy_service:
  enabled: false
ssh_service:
  enabled: true
  labels: {{env: ha}}
",
                data = data.display(),
            ),
        )
        .expect("config");
        let token = self.token("node");
        let mut s = Service {
            name: name.to_string(),
            config,
            data,
            args: vec!["--roles=node".into()],
            first_args: vec![
                "--proxy".into(),
                self.proxy_addrs[0].web.clone(),
                "--token".into(),
                token,
                "--ca-pin".into(),
                self.pin.clone(),
            ],
            env: vec![],
            banner: String::new(),
            child: None,
            started: false,
        };
        s.start();
        self.nodes.push(s);
    }

    /// The admin identity of the first auth instance still running.
    fn admin_dir(&self) -> &Path {
        self.auths
            .iter()
            .find(|a| a.running())
            .map(|a| a.data.as_path())
            .expect("an auth instance runs")
    }

    /// `sallyctl --data-dir` with the admin identity of a running auth instance.
    pub fn sallyctl(&self, args: &[&str]) -> Run {
        run(
            Command::new(bin("sallyctl"))
                .arg("--data-dir")
                .arg(self.admin_dir())
                .args(args),
            "",
        )
    }

    /// A one-time join token of `kind`.
    pub fn token(&self, kind: &str) -> String {
        let out = self
            .sallyctl(&[
                "tokens",
                "add",
                &format!("--type={kind}"),
                "--format",
                "json",
            ])
            .ok();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
        v["token"].as_str().unwrap_or_default().to_string()
    }

    /// Every node as `sallyctl nodes ls` shows it: (name, online).
    pub fn nodes_online(&self) -> Vec<(String, bool)> {
        let out = self.sallyctl(&["nodes", "ls", "--format", "json"]);
        serde_json::from_str::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|n| {
                (
                    n["hostname"].as_str().unwrap_or_default().to_string(),
                    n["online"] == true,
                )
            })
            .collect()
    }

    pub fn wait_online(&self, name: &str) {
        assert!(
            eventually(Duration::from_secs(30), || self
                .nodes_online()
                .iter()
                .any(|(n, up)| n == name && *up)),
            "node {name} never came online"
        );
    }

    /// A user signed up and logged in through proxy `via` (its own `SALLY_HOME`).
    pub fn user(&self, name: &str, roles: &str, logins: &str, via: usize) -> PathBuf {
        let out = self
            .sallyctl(&[
                "users", "add", name, "--roles", roles, "--logins", logins, "--format", "json",
            ])
            .ok();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("json");
        let token = v["token"].as_str().unwrap_or_default().to_string();
        let home = self.dir.path().join(format!("home-{name}"));
        let web = &self.proxy_addrs[via].web;
        run(
            Command::new(bin("sally"))
                .env("SALLY_HOME", &home)
                .env("HOME", &home)
                .args([
                    "signup", "--proxy", web, "--token", &token, "--ca-pin", &self.pin,
                ]),
            "correct horse battery\n",
        )
        .ok();
        self.login(&home, name, via).ok();
        home
    }

    /// `sally login` through proxy `via`.
    pub fn login(&self, home: &Path, name: &str, via: usize) -> Run {
        self.sally(
            home,
            &[
                "login",
                "--proxy",
                &self.proxy_addrs[via].web,
                "--user",
                name,
                "--ca-pin",
                &self.pin,
            ],
            "correct horse battery\n",
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

    /// An ssh_config for OpenSSH through proxy `via` (host `proxy`), as the user under `home`
    /// who logged in through proxy `login_via`.
    pub fn ssh_config(&self, home: &Path, user: &str, via: usize, login_via: usize) -> PathBuf {
        let keys = home
            .join("keys")
            .join(self.proxy_addrs[login_via].web.replace(':', "_"));
        let cfg = home.join(format!("ssh_config_{via}"));
        std::fs::write(
            &cfg,
            format!(
                "Host proxy\n  HostName 127.0.0.1\n  Port {port}\n  User {user}\nHost *\n  UserKnownHostsFile {kh}\n  IdentityFile {key}\n  CertificateFile {key}-cert.pub\n  IdentitiesOnly yes\n  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 20\n",
                port = self.proxy_addrs[via].ssh_port,
                kh = home.join("known_hosts").display(),
                key = keys.join(user).display(),
            ),
        )
        .expect("ssh config");
        cfg
    }

    /// Runs SQL on the topology's database (to read what auth wrote).
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .arg(&self.db_url)
            .args(["-v", "ON_ERROR_STOP=1", "-qAtc", sql])
            .output()
            .expect("psql");
        assert!(
            out.status.success(),
            "psql: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }
}

impl Drop for Topology {
    fn drop(&mut self) {
        for s in self
            .nodes
            .iter_mut()
            .chain(self.proxies.iter_mut())
            .chain(self.auths.iter_mut())
        {
            s.kill();
        }
        let _ = Command::new("psql")
            .arg(&self.admin_url)
            .args([
                "-c",
                &format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.db_name),
            ])
            .output();
    }
}
