//! Kubernetes for the end-to-end tests: the fixture API server (`tests/kube/apiserver.py`, the
//! real wire protocol, since no real API server runs here), kube agents, and real `kubectl`
//! 1.32.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{Agent, Cluster, Run, bin, eventually, run};

/// kubectl 1.32 itself: `/usr/bin/kubectl` is a dispatcher that picks its own version.
pub const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";

/// The fixture API server, killed when dropped.
pub struct ApiServer {
    pub dir: PathBuf,
    pub port: u16,
    child: Child,
}

impl ApiServer {
    /// Starts the fixture with `flags` (`--no-websocket`, `--no-spdy`, `--forward 80=PORT`).
    pub fn start(dir: &Path, flags: &[&str]) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("kube/apiserver.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg("--dir")
            .arg(dir)
            .args(["--port", "0"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let v: serde_json::Value = serde_json::from_str(line.trim())
            .unwrap_or_else(|e| panic!("the fixture API server said {line:?}: {e}"));
        let port = v["port"].as_u64().unwrap() as u16;
        ApiServer {
            dir: dir.to_path_buf(),
            port,
            child,
        }
    }

    /// The kubeconfig with the agent's client certificate.
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    /// Every request the fixture received, as it logged them.
    pub fn requests(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(self.dir.join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Cluster {
    /// A join token for a kube agent.
    pub fn kube_token(&self) -> String {
        let out = self
            .sallyctl(&["tokens", "add", "--type=kube", "--format", "json"])
            .ok();
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
        v["token"].as_str().unwrap().to_string()
    }

    /// `sallyport start --roles=kube` for cluster `name`.
    pub fn kube_agent_command(
        &self,
        name: &str,
        labels: &str,
        kubeconfig: &Path,
        token: Option<&str>,
        dir: &Path,
    ) -> Command {
        let mut cmd = Command::new(bin("sallyport"));
        cmd.args([
            "start",
            "--roles=kube",
            "--proxy",
            &self.proxy,
            "--kube-cluster",
            name,
            "--ca-pin",
            &self.pin,
        ])
        .arg("--kubeconfig")
        .arg(kubeconfig)
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

    /// Starts a kube agent for cluster `name` and waits until it is online.
    pub fn kube_agent(&self, name: &str, labels: &str, kubeconfig: &Path) -> Agent {
        let dir = self.dir.path().join(format!("kube-agent-{name}"));
        let token = self.kube_token();
        let child = self
            .kube_agent_command(name, labels, kubeconfig, Some(&token), &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let agent = Agent::new(name, labels, dir, child);
        self.wait_kube_online(name);
        agent
    }

    pub fn kube_online(&self, name: &str) -> bool {
        let out = self.sallyctl(&["get", "kube_clusters", "--format", "json"]);
        serde_json::from_str::<serde_json::Value>(&out.stdout)
            .ok()
            .and_then(|v| v.as_array().cloned())
            .is_some_and(|cs| cs.iter().any(|c| c["name"] == name && c["online"] == true))
    }

    pub fn wait_kube_online(&self, name: &str) {
        assert!(
            eventually(Duration::from_secs(30), || self.kube_online(name)),
            "Kubernetes cluster {name} never came online"
        );
    }
}

/// kubectl 1.32 with `kubeconfig`, its caches under `home`, and `env`.
pub fn kubectl(home: &Path, kubeconfig: &Path, env: &[(&str, &str)], args: &[&str]) -> Run {
    let mut cmd = Command::new(KUBECTL);
    cmd.env("KUBECONFIG", kubeconfig)
        .env("HOME", home)
        .env("SALLY_HOME", home)
        .args(["--request-timeout", "20s"])
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    run(&mut cmd, "")
}

/// A role for `kubectl` on cluster `lab` (env=dev): pods in namespace `dev`, with exec, as
/// group `developers`.
pub const DEV_ROLE: &str = "kind: role
version: v1
metadata: {name: kube-dev}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_groups: [developers]
    kubernetes_resources:
      - {kind: pod, namespace: dev, name: '*', verbs: [get, list, watch, exec]}
";

/// A cluster with the fixture API server behind a kube agent for `lab`, and alice logged in
/// to it with `sally kube login`.
pub struct Setup {
    pub c: Cluster,
    pub api: ApiServer,
    pub agent: Agent,
    pub home: PathBuf,
    pub kubeconfig: PathBuf,
}

/// A cluster, the fixture API server behind a kube agent for `lab` (env=dev, [`DEV_ROLE`]
/// created), and alice with `roles` (after `extra_roles` are created), logged in to `lab`.
pub fn setup(roles: &str, extra_roles: &[&str]) -> Setup {
    setup_with(roles, extra_roles, &[])
}

/// [`setup`], with the fixture API server started with `flags`.
pub fn setup_with(roles: &str, extra_roles: &[&str], flags: &[&str]) -> Setup {
    let c = Cluster::start();
    let api = ApiServer::start(&c.dir.path().join("apiserver"), flags);
    c.create(DEV_ROLE).ok();
    for r in extra_roles {
        c.create(r).ok();
    }
    let agent = c.kube_agent("lab", "env=dev", &api.kubeconfig());
    let home = c.user("alice", roles, "");
    c.sally(&home, &["kube", "login", "lab"], "").ok();
    let kubeconfig = home.join(".kube/config");
    Setup {
        c,
        api,
        agent,
        home,
        kubeconfig,
    }
}

impl Setup {
    /// kubectl 1.32 as alice, with `env` and `stdin`.
    pub fn kubectl(&self, env: &[(&str, &str)], args: &[&str], stdin: &str) -> Run {
        let mut cmd = Command::new(KUBECTL);
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", &self.home)
            .args(["--request-timeout", "20s"])
            .args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        run(&mut cmd, stdin)
    }
}

/// The requests the fixture got whose path contains `needle`.
pub fn requests_to(api: &ApiServer, needle: &str) -> Vec<serde_json::Value> {
    api.requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.contains(needle)))
        .collect()
}
