//! Lists and watches narrowed to what the roles allow, end to end: real kubectl 1.32 through the
//! kube door and a kube agent to the fixture API server (`tests/kube/`), which gzips every list
//! kubectl asks for (its `--gzip-threshold` is 0), so the door reads gzip on the way. Alice may
//! see dev's web-1 and nothing else: kubectl's Tables, JSON lists and watches show her web-1 only,
//! and what no rule could match never reaches the API server.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::kube::{ApiServer, KUBECTL, kubectl};
use sallyport_tests::*;

const WEB_1: &str = "kind: role
version: v1
metadata: {name: kube-web-1}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_resources:
      - {kind: pod, namespace: dev, name: web-1, verbs: [get, list, watch]}
";

/// The pods the fixture starts with, none of which but web-1 alice may see.
const HIDDEN: &[&str] = &["web-2", "db-1", "shell"];

struct Setup {
    c: Cluster,
    api: ApiServer,
    _agent: Agent,
    home: PathBuf,
    kubeconfig: PathBuf,
}

/// A cluster, the fixture API server behind a kube agent for `lab` (env=dev), and alice with
/// `kube-web-1`, logged in to `lab` with `sally kube login`.
fn setup() -> Setup {
    let c = Cluster::start();
    let api = ApiServer::start(&c.dir.path().join("apiserver"), &[]);
    c.create(WEB_1).ok();
    let agent = c.kube_agent("lab", "env=dev", &api.kubeconfig());
    let home = c.user("alice", "kube-web-1", "");
    c.sally(&home, &["kube", "login", "lab"], "").ok();
    let kubeconfig = home.join(".kube/config");
    Setup {
        c,
        api,
        _agent: agent,
        home,
        kubeconfig,
    }
}

impl Setup {
    fn kubectl(&self, args: &[&str]) -> Run {
        kubectl(&self.home, &self.kubeconfig, &[], args)
    }

    /// What reached the API server on a path containing `needle`.
    fn requests_to(&self, needle: &str) -> Vec<serde_json::Value> {
        self.api
            .requests()
            .into_iter()
            .filter(|r| r["path"].as_str().is_some_and(|p| p.contains(needle)))
            .collect()
    }

    /// The fixture's own hook, as the cluster's administrator: `POST` creates a pod, `DELETE`
    /// deletes one, and a running watch sees it.
    fn fixture_pod(&self, method: &str, namespace: &str, name: &str) {
        let dir = &self.api.dir;
        let out = run(
            Command::new("curl")
                .args(["-sS", "-f", "-X", method])
                .arg("--cacert")
                .arg(dir.join("ca.crt"))
                .arg("--cert")
                .arg(dir.join("agent.crt"))
                .arg("--key")
                .arg(dir.join("agent.key"))
                .arg(format!(
                    "https://127.0.0.1:{}/fixture/pods/{namespace}/{name}",
                    self.api.port
                )),
            "",
        );
        assert_eq!(out.code, 0, "{method} {namespace}/{name}: {out:?}");
    }
}

fn assert_only_web_1(what: &str, out: &str) {
    assert!(out.contains("web-1"), "{what}: web-1 missing:\n{out}");
    for hidden in HIDDEN {
        assert!(!out.contains(hidden), "{what}: {hidden} shown:\n{out}");
    }
}

#[test]
fn kubectl_lists_only_the_pods_the_roles_allow() {
    let s = setup();
    // A Table of dev's pods, and of every namespace's.
    let out = s.kubectl(&["get", "pods", "-n", "dev"]).ok();
    assert_only_web_1("get pods -n dev", &out.stdout);
    assert!(out.stdout.starts_with("NAME"), "{}", out.stdout);
    let out = s.kubectl(&["get", "pods", "-A"]).ok();
    assert_only_web_1("get pods -A", &out.stdout);
    assert!(out.stdout.contains("NAMESPACE"), "{}", out.stdout);
    assert_eq!(out.stdout.lines().count(), 2, "{}", out.stdout);
    // JSON lists: the items go, the list's own fields stay.
    for args in [
        &["get", "pods", "-A", "-o", "json"][..],
        &["get", "pods", "-n", "dev", "-o", "json"][..],
    ] {
        let out = s.kubectl(args).ok();
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
        let names: Vec<&str> = v["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["web-1"], "{args:?}");
    }
    let out = s.kubectl(&["get", "pods", "-A", "-o", "name"]).ok();
    assert_eq!(out.stdout.trim(), "pod/web-1");
    // A label selector the API server applies, then the roles.
    let out = s
        .kubectl(&["get", "pods", "-A", "-l", "app=web", "-o", "name"])
        .ok();
    assert_eq!(out.stdout.trim(), "pod/web-1");

    // The API server was asked for JSON (gzip allowed), as alice, and answered gzipped.
    let seen = s.requests_to("/pods");
    assert!(!seen.is_empty());
    for r in &seen {
        let text = r.to_string();
        assert!(!text.contains("protobuf"), "{text}");
        assert_eq!(r["accept_encoding"], "gzip", "{text}");
        assert_eq!(
            r["impersonate"]["Impersonate-User"],
            serde_json::json!(["alice"]),
            "{text}"
        );
    }

    // What no rule could match is refused by the door, and never reaches the API server.
    s.kubectl(&["get", "pods", "-n", "prod"])
        .fails_with("Error from server (Forbidden)")
        .fails_with("alice may not list pod in namespace prod");
    s.kubectl(&["get", "secrets", "-n", "dev"])
        .fails_with("Error from server (Forbidden)");
    s.kubectl(&["get", "secrets", "-A"])
        .fails_with("Error from server (Forbidden)");
    s.kubectl(&["get", "pod", "web-2", "-n", "dev"])
        .fails_with("may not get pod \"web-2\" in namespace dev");
    s.kubectl(&["get", "pods", "-n", "dev", "-o", "yaml"]).ok();
    assert!(s.requests_to("/namespaces/prod").is_empty());
    assert!(s.requests_to("/secrets").is_empty());
    assert!(s.requests_to("/pods/web-2").is_empty());

    // Audited: filtered, allowed, the API server's code.
    let list_all = |e: &serde_json::Value| e["path"] == "/api/v1/pods" && e["verb"] == "list";
    let events = s.c.events_when("kube.request", |ev| {
        ev.iter().any(list_all) && ev.iter().any(|e| e["namespace"] == "prod")
    });
    let all = events
        .iter()
        .find(|e| list_all(e))
        .unwrap_or_else(|| panic!("no kube.request for /api/v1/pods: {events:#?}"));
    assert_eq!(all["allowed"], true);
    assert_eq!(all["response_code"], 200);
    assert_eq!(all["reason"], "allowed, filtered to what the roles allow");
    assert_eq!(all["kube_users"], serde_json::json!(["alice"]));
    let prod = events
        .iter()
        .find(|e| e["namespace"] == "prod")
        .unwrap_or_else(|| panic!("no refused kube.request: {events:#?}"));
    assert_eq!(prod["allowed"], false);
    assert_eq!(prod["response_code"], 403);
}

/// `kubectl get -w` until `--request-timeout` ends it; returns its stdout and stderr.
fn watch(s: &Setup, args: &[&str], timeout: &str) -> std::thread::JoinHandle<(String, String)> {
    let mut cmd = Command::new(KUBECTL);
    cmd.env("KUBECONFIG", &s.kubeconfig)
        .env("HOME", &s.home)
        .env("SALLY_HOME", &s.home)
        .args(["--request-timeout", timeout])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = cmd.spawn().unwrap();
    std::thread::spawn(move || {
        let out = child.wait_with_output().unwrap();
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
}

fn wait_for_watch(s: &Setup, path: &str) {
    assert!(
        eventually(Duration::from_secs(20), || {
            s.requests_to(path)
                .iter()
                .any(|r| r["query"].as_str().is_some_and(|q| q.contains("watch=")))
        }),
        "kubectl's watch of {path} never reached the API server: {:#?}",
        s.api.requests()
    );
}

#[test]
fn kubectl_watches_only_the_pods_the_roles_allow() {
    let s = setup();
    let dev = watch(&s, &["get", "pods", "-n", "dev", "-w"], "12s");
    let all = watch(&s, &["get", "pods", "-A", "-w", "-o", "json"], "12s");
    wait_for_watch(&s, "/api/v1/namespaces/dev/pods");
    wait_for_watch(&s, "/api/v1/pods");
    // Mid-watch: a hidden pod first (its event carries the Table's columns, which kubectl
    // still gets), then web-1 goes and comes back, then more hidden ones.
    s.fixture_pod("POST", "dev", "web-3");
    s.fixture_pod("DELETE", "dev", "web-1");
    s.fixture_pod("POST", "dev", "web-1");
    s.fixture_pod("POST", "prod", "web-1");
    s.fixture_pod("POST", "dev", "db-9");

    let (out, err) = dev.join().unwrap();
    let what = format!("get pods -n dev -w:\n{out}\nstderr: {err}");
    assert!(out.starts_with("NAME"), "{what}");
    for hidden in ["web-2", "web-3", "db-9", "db-1", "shell"] {
        assert!(!out.contains(hidden), "{hidden} shown: {what}");
    }
    // The list, then web-1's events as they came: terminating, deleted, created again.
    let rows = out.lines().filter(|l| l.starts_with("web-1 ")).count();
    assert!(rows >= 3, "{what}");
    assert!(out.contains("Terminating"), "{what}");

    let (out, err) = all.join().unwrap();
    let objects: Vec<serde_json::Value> = serde_json::Deserializer::from_str(&out)
        .into_iter()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| panic!("{e}: {out}\nstderr: {err}"));
    assert!(objects.len() >= 3, "{out}\nstderr: {err}");
    for o in &objects {
        // The first is the list, then one object per event.
        let items = o["items"]
            .as_array()
            .cloned()
            .unwrap_or_else(|| vec![o.clone()]);
        for i in items {
            assert_eq!(i["metadata"]["name"], "web-1", "{out}");
            assert_eq!(i["metadata"]["namespace"], "dev", "{out}");
        }
    }
    // Every watch went out asking for JSON, and each was audited as filtered.
    for r in s.requests_to("/pods") {
        assert!(!r.to_string().contains("protobuf"), "{r}");
    }
    let watches: Vec<serde_json::Value> =
        s.c.events_when("kube.request", |ev| {
            ev.iter().filter(|e| e["verb"] == "watch").count() >= 2
        })
        .into_iter()
        .filter(|e| e["verb"] == "watch")
        .collect();
    assert!(watches.len() >= 2, "{watches:#?}");
    assert!(
        watches
            .iter()
            .all(|e| e["reason"] == "allowed, filtered to what the roles allow"),
        "{watches:#?}"
    );
}

/// The fixture's kubeconfig is the cluster administrator's: the pods really are there.
#[test]
fn the_hidden_pods_are_there_for_whom_the_roles_allow() {
    let s = setup();
    let admin = s.home.join("admin");
    std::fs::create_dir_all(&admin).unwrap();
    let out = kubectl(&admin, &s.api.kubeconfig(), &[], &["get", "pods", "-A"]).ok();
    for pod in ["web-1", "web-2", "db-1", "shell"] {
        assert!(out.stdout.contains(pod), "{}", out.stdout);
    }
    // And alice, given every pod of dev, sees dev's whole list as it is (no filter).
    s.c.create(
        "kind: role
version: v1
metadata: {name: kube-dev-pods}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_resources:
      - {kind: pod, namespace: dev, name: '*', verbs: [list]}
",
    )
    .ok();
    s.c.sallyctl(&[
        "users",
        "update",
        "alice",
        "--set-roles",
        "kube-web-1,kube-dev-pods",
    ])
    .ok();
    assert!(
        eventually(Duration::from_secs(10), || {
            let out = s.kubectl(&["get", "pods", "-n", "dev"]);
            out.code == 0 && out.stdout.contains("web-2")
        }),
        "alice never saw web-2 with a role allowing every pod of dev"
    );
    let listed = |e: &serde_json::Value| {
        e["path"] == "/api/v1/namespaces/dev/pods"
            && e["verb"] == "list"
            && e["reason"] == "allowed"
    };
    let events = s.c.events_when("kube.request", |ev| ev.iter().any(listed));
    assert!(events.iter().any(listed), "{events:#?}");
}
