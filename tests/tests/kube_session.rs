//! `kubectl exec`, `attach` and `cp` as sessions: a terminal sized and resized in the
//! recording, attach, files both ways, a lock and an idle limit ending a live exec, a restarted
//! kube agent, and the agent in in-cluster mode. Real kubectl 1.32 against the fixture API
//! server (`tests/kube/`), through the proxy's kube door and a kube agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::kube::{ApiServer, KUBECTL, requests_to, setup};
use sallyport_tests::*;

/// The recording of the session whose `session.start` command is `command`.
fn recording(c: &Cluster, command: &str) -> (String, Vec<serde_json::Value>) {
    let start = c
        .events("session.start")
        .into_iter()
        .find(|e| e["command"] == command)
        .unwrap_or_else(|| panic!("no session.start for {command:?}"));
    let id = start["session_id"].as_str().unwrap().to_string();
    let cast = c.data_dir().join("recordings").join(format!("{id}.cast"));
    assert!(
        eventually(Duration::from_secs(5), || cast.exists()),
        "no recording {}",
        cast.display()
    );
    let text = std::fs::read_to_string(&cast).unwrap();
    let lines = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (id, lines)
}

#[test]
fn a_terminal_is_sized_by_kubectl_and_its_resizes_are_recorded() {
    let s = setup("kube-dev", &[]);
    // kubectl -t needs a terminal: `script` gives it one, 100x30, then makes it 120x40 while
    // the command runs (the kernel tells kubectl, which sends a resize).
    let inner = format!(
        "stty cols 100 rows 30; (while [ ! -e {sized} ]; do sleep 0.05; done; stty cols 120 rows 40 </dev/tty) & KUBECONFIG={} HOME={} {KUBECTL} exec -it -n dev web-1 -c main -- sh -c 'sleep 0.5; stty size; touch {sized}; sleep 2.5; stty size; exit 4'",
        s.kubeconfig.display(),
        s.home.display(),
        sized = s.home.join("sized").display(),
    );
    let out = run(
        Command::new("script").args(["-qec", &inner, "/dev/null"]),
        "",
    );
    let (_, cast) = recording(
        &s.c,
        &format!(
            "sh -c sleep 0.5; stty size; touch {}; sleep 2.5; stty size; exit 4",
            s.home.join("sized").display()
        ),
    );
    assert!(
        out.stdout.contains("30 100") && out.stdout.contains("40 120"),
        "{out:?} {cast:?}"
    );
    assert_eq!(out.code, 4, "{out:?}");
    // The recording starts at kubectl's first size and holds the resize as an `r` event.
    assert_eq!(cast[0]["width"], 100, "{:?}", cast[0]);
    assert_eq!(cast[0]["height"], 30, "{:?}", cast[0]);
    assert!(
        cast.iter().any(|e| e[1] == "r" && e[2] == "120x40"),
        "{cast:?}"
    );
    assert!(
        cast.iter()
            .any(|e| e[1] == "o" && e[2].as_str().unwrap_or_default().contains("40 120")),
        "{cast:?}"
    );
}

#[test]
fn attach_and_copy_files_both_ways() {
    let s = setup("kube-dev", &[]);
    // attach: the fixture runs the pod's shell; closing stdin ends it.
    let out = s
        .kubectl(
            &[],
            &["attach", "-i", "-n", "dev", "web-1", "-c", "main"],
            "echo attached here\n",
        )
        .ok();
    assert!(out.stdout.contains("attached here"), "{out:?}");
    let (_, cast) = recording(&s.c, "attach dev/web-1");
    assert!(
        cast.iter()
            .any(|e| e[2].as_str().unwrap_or_default().contains("attached here")),
        "{cast:?}"
    );

    // kubectl cp runs tar in the pod, through exec, both ways.
    let local = s.home.join("notes.txt");
    let body: String = (0..20_000).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&local, &body).unwrap();
    s.kubectl(
        &[],
        &[
            "cp",
            local.to_str().unwrap(),
            "dev/web-1:notes-copy.txt",
            "-c",
            "main",
        ],
        "",
    )
    .ok();
    let in_pod = s.api.dir.join("pods/dev/web-1/notes-copy.txt");
    assert_eq!(std::fs::read_to_string(&in_pod).unwrap(), body);
    let back = s.home.join("back.txt");
    s.kubectl(
        &[],
        &[
            "cp",
            "dev/web-1:notes-copy.txt",
            back.to_str().unwrap(),
            "-c",
            "main",
        ],
        "",
    )
    .ok();
    assert_eq!(std::fs::read_to_string(&back).unwrap(), body);
    // Both were sessions of their own (tar), audited.
    let tars =
        s.c.events("session.start")
            .into_iter()
            .filter(|e| e["command"].as_str().unwrap_or_default().starts_with("tar"))
            .count();
    assert_eq!(tars, 2);
}

const IDLE_ROLE: &str = "kind: role
version: v1
metadata: {name: kube-idle}
spec:
  options: {client_idle_timeout: 2s}
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_resources:
      - {kind: pod, namespace: dev, verbs: [get, exec]}
";

#[test]
fn a_lock_or_the_idle_limit_ends_a_live_exec() {
    let s = setup("kube-dev", &[]);
    // A live `cat`: ended by a lock within the 2 s poll, with the lock's message.
    let mut cat = Command::new(KUBECTL)
        .env("KUBECONFIG", &s.kubeconfig)
        .env("HOME", &s.home)
        .args([
            "exec", "-i", "-n", "dev", "web-1", "-c", "main", "--", "cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = cat.stdin.take().unwrap();
    stdin.write_all(b"before the lock\n").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || !requests_to(&s.api, "/exec")
            .is_empty()),
        "the exec never reached the API server"
    );
    std::thread::sleep(Duration::from_millis(500));
    s.c.sallyctl(&["lock", "--user", "alice", "--message", "incident 11"])
        .ok();
    let ended = eventually(Duration::from_secs(10), || {
        cat.try_wait().unwrap().is_some()
    });
    assert!(ended, "kubectl exec still runs for a locked user");
    drop(stdin);
    let out = cat.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("incident 11"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("before the lock"));

    // client_idle_timeout: an exec that does nothing is ended.
    let s = setup("kube-idle", &[IDLE_ROLE]);
    let out = s.kubectl(
        &[],
        &[
            "exec", "-n", "dev", "web-1", "-c", "main", "--", "sleep", "20",
        ],
        "",
    );
    assert_ne!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("idle"), "{out:?}");
}

#[test]
fn a_restarted_kube_agent_serves_again_without_a_token() {
    let mut s = setup("kube-dev", &[]);
    s.kubectl(&[], &["get", "pods", "-n", "dev"], "").ok();
    s.agent.stop();
    assert!(
        eventually(Duration::from_secs(60), || !s.c.kube_online("lab")),
        "the cluster still shows online with its agent gone"
    );
    let out = s.kubectl(&[], &["get", "pods", "-n", "dev"], "");
    assert!(
        out.stderr.contains("offline") || out.stderr.contains("ServiceUnavailable"),
        "{out:?}"
    );
    // The same data dir, no token: the agent's own identity.
    let child =
        s.c.kube_agent_command("lab", "env=dev", &s.api.kubeconfig(), None, &s.agent.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
    let _agent = Agent::new("lab", "env=dev", s.agent.dir.clone(), child);
    s.c.wait_kube_online("lab");
    let out = s.kubectl(&[], &["get", "pods", "-n", "dev"], "").ok();
    assert!(out.stdout.contains("web-1"), "{out:?}");
}

#[test]
fn a_kube_agent_without_a_kubeconfig_uses_its_service_account() {
    let c = Cluster::start();
    let api = ApiServer::start(&c.dir.path().join("apiserver"), &[]);
    c.create(sallyport_tests::kube::DEV_ROLE).ok();
    // The pod's service account as Kubernetes mounts it: a CA and a token, in a directory.
    let sa = c.dir.path().join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::copy(api.dir.join("ca.crt"), sa.join("ca.crt")).unwrap();
    std::fs::copy(api.dir.join("token"), sa.join("token")).unwrap();
    std::fs::write(sa.join("namespace"), "default").unwrap();
    let dir = c.dir.path().join("kube-agent-incluster");
    let token = c.kube_token();
    let mut cmd = Command::new(bin("sallyport"));
    cmd.args([
        "start",
        "--roles=kube",
        "--proxy",
        &c.proxy,
        "--kube-cluster",
        "lab",
        "--labels",
        "env=dev",
        "--ca-pin",
        &c.pin,
        "--token",
        &token,
    ])
    .arg("--data-dir")
    .arg(&dir)
    .env("SALLYPORT_LOG", "warn")
    .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    .env("KUBERNETES_SERVICE_PORT", api.port.to_string())
    .env("SALLYPORT_KUBE_SERVICE_ACCOUNT_DIR", &sa)
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    let _agent = Agent::new("lab", "env=dev", dir, cmd.spawn().unwrap());
    c.wait_kube_online("lab");
    let home = c.user("alice", "kube-dev", "");
    c.sally(&home, &["kube", "login", "lab"], "").ok();
    let out = sallyport_tests::kube::kubectl(
        &home,
        &home.join(".kube/config"),
        &[],
        &["get", "pods", "-n", "dev"],
    )
    .ok();
    assert!(out.stdout.contains("web-1"), "{out:?}");
    // The API server saw the service account's token, impersonating alice.
    let seen = requests_to(&api, "/api/v1/namespaces/dev/pods");
    assert!(
        seen.iter()
            .all(|r| r["identity"] == "token" || r.to_string().contains("\"token\"")),
        "{seen:?}"
    );
    assert!(
        seen.iter()
            .all(|r| r["impersonate"]["Impersonate-User"] == serde_json::json!(["alice"])),
        "{seen:?}"
    );
}
