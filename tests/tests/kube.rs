//! Kubernetes access end to end: real kubectl 1.32, through `sally kube login`'s kubeconfig,
//! the proxy's kube door and a kube agent, to the fixture API server (`tests/kube/`, the real
//! wire protocol). What reached the API server is read from the fixture's own request log, so
//! "refused" means nothing arrived there.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sallyport_tests::kube::{Setup, kubectl, requests_to, setup, setup_with};
use sallyport_tests::*;

#[test]
fn kubectl_reaches_what_the_roles_allow_as_the_principals_they_give() {
    let s = setup("kube-dev", &[]);
    let ls =
        s.c.sally(&s.home, &["kube", "ls", "--format", "json"], "")
            .ok();
    let clusters: serde_json::Value = serde_json::from_str(&ls.stdout).unwrap();
    assert!(
        clusters
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["name"] == "lab" && c["online"] == true),
        "{}",
        ls.stdout
    );
    let out = kubectl(&s.home, &s.kubeconfig, &[], &["get", "pods", "-n", "dev"]).ok();
    assert!(
        out.stdout.contains("web-1") && out.stdout.contains("web-2"),
        "{}",
        out.stdout
    );
    // The API server saw the agent's own identity, impersonating alice with the role's group,
    // and never a credential of hers.
    let seen = requests_to(&s.api, "/api/v1/namespaces/dev/pods");
    assert!(!seen.is_empty(), "{:?}", s.api.requests());
    for r in &seen {
        let text = r.to_string();
        assert!(r["authorization"].is_null(), "{text}");
        assert!(text.contains("sallyport-agent"), "{text}");
        assert_eq!(
            r["impersonate"]["Impersonate-User"],
            serde_json::json!(["alice"]),
            "{text}"
        );
        let groups = r["impersonate"]["Impersonate-Group"].to_string();
        assert!(
            groups.contains("developers") && groups.contains("system:authenticated"),
            "{text}"
        );
    }

    // Another namespace: refused by the door, and the API server never hears of it.
    kubectl(&s.home, &s.kubeconfig, &[], &["get", "pods", "-n", "prod"])
        .fails_with("Error from server (Forbidden)")
        .fails_with("alice may not list pod in namespace prod");
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &["get", "pod", "db-1", "-n", "prod"],
    )
    .fails_with("may not get pod \"db-1\" in namespace prod");
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &["get", "secrets", "-n", "dev"],
    )
    .fails_with("Forbidden");
    assert!(requests_to(&s.api, "/namespaces/prod").is_empty());
    assert!(requests_to(&s.api, "/secrets").is_empty());

    // Principals the roles do not give.
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &["--as", "root", "get", "pods", "-n", "dev"],
    )
    .fails_with("impersonation request has been denied");
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &[
            "--as",
            "alice",
            "--as-group",
            "system:masters",
            "get",
            "pods",
            "-n",
            "dev",
        ],
    )
    .fails_with("impersonation request has been denied");
    let masters = s
        .api
        .requests()
        .into_iter()
        .filter(|r| {
            r.to_string().contains("system:masters")
                && r["impersonate"].to_string().contains("system:masters")
        })
        .count();
    assert_eq!(masters, 0, "an asked-for group reached the API server");

    // Every request is audited, allowed or not, with who was impersonated.
    let allowed_one =
        |e: &serde_json::Value| e["allowed"] == true && e["path"] == "/api/v1/namespaces/dev/pods";
    let denied_one = |e: &serde_json::Value| e["allowed"] == false && e["namespace"] == "prod";
    let events = s.c.events_when("kube.request", |ev| {
        ev.iter().any(allowed_one) && ev.iter().any(denied_one)
    });
    let allowed = events
        .iter()
        .find(|e| allowed_one(e))
        .unwrap_or_else(|| panic!("no allowed kube.request: {events:#?}"));
    assert_eq!(allowed["user"], "alice");
    assert_eq!(allowed["kube_cluster"], "lab");
    assert_eq!(allowed["verb"], "list");
    assert_eq!(allowed["kind"], "pod");
    assert_eq!(allowed["namespace"], "dev");
    assert_eq!(allowed["response_code"], 200);
    assert_eq!(allowed["kube_users"], serde_json::json!(["alice"]));
    assert!(
        allowed["kubectl_command"]
            .as_str()
            .unwrap_or_default()
            .contains("kubectl get"),
        "{allowed}"
    );
    let denied = events
        .iter()
        .find(|e| denied_one(e))
        .unwrap_or_else(|| panic!("no refused kube.request: {events:#?}"));
    assert_eq!(denied["response_code"], 403);
    assert!(
        denied["reason"]
            .as_str()
            .unwrap()
            .contains("no role allows"),
        "{denied}"
    );
}

#[test]
fn several_kubernetes_users_mean_kubectl_must_choose_one() {
    let two = "kind: role
version: v1
metadata: {name: kube-two}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_users: [viewer, deployer]
    kubernetes_resources:
      - {kind: pod, namespace: dev, verbs: [get, list]}
";
    let s = setup("kube-two", &[two]);
    kubectl(&s.home, &s.kubeconfig, &[], &["get", "pods", "-n", "dev"])
        .fails_with("choose one with kubectl --as");
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &["--as", "deployer", "get", "pods", "-n", "dev"],
    )
    .ok();
    let seen = requests_to(&s.api, "/api/v1/namespaces/dev/pods");
    assert!(
        seen.iter()
            .all(|r| r["impersonate"]["Impersonate-User"] == serde_json::json!(["deployer"])),
        "{seen:?}"
    );
}

/// The login's key and the kubeconfig certificate `sally kube credentials` hands kubectl.
fn kube_cert(s: &Setup) -> (PathBuf, PathBuf) {
    let out =
        s.c.sally(
            &s.home,
            &[
                "kube",
                "credentials",
                "--proxy",
                &s.c.proxy,
                "--cluster",
                "lab",
            ],
            "",
        )
        .ok();
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let cert = s.home.join("kube-cert.pem");
    let key = s.home.join("kube-key.pem");
    std::fs::write(
        &cert,
        v["status"]["clientCertificateData"].as_str().unwrap(),
    )
    .unwrap();
    std::fs::write(&key, v["status"]["clientKeyData"].as_str().unwrap()).unwrap();
    (cert, key)
}

/// `curl` to the kube door; returns (status, body).
fn curl(c: &Cluster, path: &str, cert: Option<(&Path, &Path)>) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-k", "--path-as-is", "-w", "\n%{http_code}"]);
    if let Some((cert, key)) = cert {
        cmd.arg("--cert").arg(cert).arg("--key").arg(key);
    }
    cmd.arg(format!("https://{}{path}", c.kube));
    let out = run(&mut cmd, "");
    let (body, code) = out.stdout.trim_end().rsplit_once('\n').unwrap_or(("", ""));
    (code.parse().unwrap_or(0), body.to_string())
}

#[test]
fn the_door_refuses_what_it_cannot_read_and_whom_it_does_not_know() {
    let s = setup("kube-dev", &[]);
    let before = s.api.requests().len();
    // No certificate, or a login certificate that is not a kubeconfig one: told what to run.
    let (code, body) = curl(&s.c, "/kube/lab/api/v1/namespaces/dev/pods", None);
    assert_eq!(code, 401, "{body}");
    assert!(
        body.contains("sally kube login") && body.contains("\"kind\":\"Status\""),
        "{body}"
    );
    let keys = s.home.join("keys").join(s.c.proxy.replace(':', "_"));
    let login = (keys.join("alice-x509.pem"), keys.join("alice.key.pem"));
    let (code, body) = curl(
        &s.c,
        "/kube/lab/api/v1/namespaces/dev/pods",
        Some((&login.0, &login.1)),
    );
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("not a Kubernetes certificate"), "{body}");

    let (cert, key) = kube_cert(&s);
    let with = Some((cert.as_path(), key.as_path()));
    assert_eq!(
        curl(&s.c, "/kube/lab/api/v1/namespaces/dev/pods", with).0,
        200
    );
    for path in [
        "/kube/lab/api/v1/namespaces/dev/pods/../../prod/pods",
        "/kube/lab/api/v1/namespaces/dev%2F..%2Fprod/pods",
        "/kube/lab/api//v1/namespaces/prod/pods",
        "/kube/lab/api/v1/namespaces/%2e%2e/pods",
        // Read by the API server as secrets and nodes: the door decides on no other word.
        "/kube/lab/api/v1/namespaces/dev/%73ecrets",
        "/kube/lab/api/v1/namespaces/d%65v/pods",
        // The kubelet's own API runs commands unrecorded: never passed on.
        "/kube/lab/api/v1/nodes/n1/proxy/run/dev/web-1/main?cmd=id",
    ] {
        let (code, body) = curl(&s.c, path, with);
        assert_eq!(code, 400, "{path}: {body}");
        assert!(body.contains("\"reason\":\"BadRequest\""), "{body}");
    }
    // The certificate names its cluster: another path is refused.
    let (code, body) = curl(&s.c, "/kube/other/api/v1/namespaces/dev/pods", with);
    assert_eq!(code, 403, "{body}");
    assert!(
        body.contains("this certificate is for cluster lab"),
        "{body}"
    );
    let (code, _) = curl(&s.c, "/api/v1/namespaces/dev/pods", with);
    assert_eq!(code, 404);
    // A WebSocket anywhere but exec, attach and port-forward would be an unrecorded pipe (here on
    // a path the roles allow).
    let out = run(
        Command::new("curl")
            .args([
                "-sS",
                "--http1.1",
                "-k",
                "-w",
                "\n%{http_code}",
                "-H",
                "Connection: Upgrade",
                "-H",
                "Upgrade: websocket",
            ])
            .args([
                "-H",
                "Sec-WebSocket-Version: 13",
                "-H",
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
            ])
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg(format!(
                "https://{}/kube/lab/api/v1/namespaces/dev/pods/web-1/log",
                s.c.kube
            )),
        "",
    );
    assert!(out.stdout.trim_end().ends_with("403"), "{out:?}");
    assert!(
        out.stdout
            .contains("upgrades only exec, attach and port-forward"),
        "{out:?}"
    );
    // Of all these, only the one allowed request reached the API server.
    assert_eq!(
        s.api.requests().len(),
        before + 1,
        "{:#?}",
        &s.api.requests()[before..]
    );
}

#[test]
fn a_lock_stops_kubectl_within_seconds() {
    let s = setup("kube-dev", &[]);
    kubectl(&s.home, &s.kubeconfig, &[], &["get", "pods", "-n", "dev"]).ok();
    // A running watch is a live stream: the lock ends it too.
    let mut watch = Command::new(sallyport_tests::kube::KUBECTL)
        .env("KUBECONFIG", &s.kubeconfig)
        .env("HOME", &s.home)
        .args(["get", "pods", "-n", "dev", "-w"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    assert!(
        eventually(Duration::from_secs(10), || requests_to(&s.api, "/pods")
            .iter()
            .any(|r| r["query"].as_str().unwrap_or_default().contains("watch"))),
        "the watch never reached the API server"
    );
    s.c.sallyctl(&["lock", "--user", "alice", "--message", "incident 7"])
        .ok();
    assert!(
        eventually(Duration::from_secs(6), || {
            let out = kubectl(&s.home, &s.kubeconfig, &[], &["get", "pods", "-n", "dev"]);
            out.code != 0 && out.stderr.contains("incident 7")
        }),
        "kubectl still works for a locked user"
    );
    assert!(
        eventually(Duration::from_secs(10), || watch
            .try_wait()
            .unwrap()
            .is_some()),
        "a locked user's watch goes on"
    );
}

#[test]
fn a_collection_is_deleted_only_when_every_item_in_it_may_be() {
    let role = "kind: role
version: v1
metadata: {name: kube-deleter}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_resources:
      - {kind: pod, namespace: dev, verbs: ['*']}
  deny:
    kubernetes_resources:
      - {kind: pod, namespace: dev, name: web-2, verbs: [delete, deletecollection]}
";
    let s = setup("kube-deleter", &[role]);
    let out = s.c.sally(
        &s.home,
        &[
            "kube",
            "credentials",
            "--proxy",
            &s.c.proxy,
            "--cluster",
            "lab",
        ],
        "",
    );
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let cert = s.home.join("c.pem");
    let key = s.home.join("k.pem");
    std::fs::write(
        &cert,
        v["status"]["clientCertificateData"].as_str().unwrap(),
    )
    .unwrap();
    std::fs::write(&key, v["status"]["clientKeyData"].as_str().unwrap()).unwrap();
    let out = run(
        Command::new("curl")
            .args(["-sS", "-k", "-X", "DELETE", "-w", "\n%{http_code}"])
            .arg("--cert")
            .arg(&cert)
            .arg("--key")
            .arg(&key)
            .arg(format!(
                "https://{}/kube/lab/api/v1/namespaces/dev/pods",
                s.c.kube
            )),
        "",
    );
    assert!(out.stdout.trim_end().ends_with("403"), "{out:?}");
    assert!(
        out.stdout.contains("may not delete every pod in dev"),
        "{out:?}"
    );
    assert!(
        s.api.requests().iter().all(|r| r["method"] != "DELETE"),
        "{:?}",
        s.api.requests()
    );
    // One by one, the rest may go; web-2 may not.
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &["delete", "pod", "-n", "dev", "web-2"],
    )
    .fails_with("Forbidden");
    kubectl(
        &s.home,
        &s.kubeconfig,
        &[],
        &["delete", "pod", "-n", "dev", "web-1", "--wait=false"],
    )
    .ok();
}

/// The session whose `session.start` names `pod` and `command`.
fn exec_session(c: &Cluster, pod: &str, command: &str) -> serde_json::Value {
    c.events("session.start")
        .into_iter()
        .find(|e| e["pod"] == pod && e["command"] == command)
        .unwrap_or_else(|| {
            panic!(
                "no session.start for {pod} {command}: {:#?}",
                c.events("session.start")
            )
        })
}

#[test]
fn kubectl_exec_runs_through_the_session_engine_recorded_and_audited() {
    // `own-sessions` lets alice list and replay her own sessions.
    let own = "kind: role
version: v1
metadata: {name: own-sessions}
spec:
  allow:
    rules: [{resources: [session], verbs: [list, read]}]
";
    let s = setup("kube-dev,own-sessions", &[own]);
    let k = |env: &[(&str, &str)], args: &[&str], stdin: &str| s.kubectl(env, args, stdin);
    let out = k(
        &[],
        &[
            "exec",
            "-n",
            "dev",
            "web-1",
            "-c",
            "main",
            "--",
            "echo",
            "hello from web-1",
        ],
        "",
    )
    .ok();
    assert_eq!(out.stdout, "hello from web-1\n");
    // Exit codes come through as kubectl's own.
    let out = k(
        &[],
        &[
            "exec",
            "-n",
            "dev",
            "web-2",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
        "",
    );
    assert_eq!(out.code, 3, "{out:?}");
    assert_eq!(out.stdout, "out\n");
    assert!(out.stderr.contains("err"), "{out:?}");
    // stdin, and its end (v5's close message) ends `cat`.
    let out = k(
        &[],
        &[
            "exec", "-i", "-n", "dev", "web-1", "-c", "main", "--", "cat",
        ],
        "line one\nline two\n",
    )
    .ok();
    assert_eq!(out.stdout, "line one\nline two\n");

    // Recorded, and audited with the pod, the command and the principals.
    let start = exec_session(&s.c, "web-1", "echo hello from web-1");
    assert_eq!(start["user"], "alice");
    assert_eq!(start["kube_cluster"], "lab");
    assert_eq!(start["namespace"], "dev");
    assert_eq!(start["container"], "main");
    assert_eq!(start["protocol"], "v5.channel.k8s.io");
    assert_eq!(start["kube_users"], serde_json::json!(["alice"]));
    let id = start["session_id"].as_str().unwrap().to_string();
    let cast = s.c.data_dir().join("recordings").join(format!("{id}.cast"));
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(&cast)
            .is_ok_and(|t| t.contains("hello from web-1"))),
        "recording {} lacks the output",
        cast.display()
    );
    // Listed and played like SSH sessions, the cluster and pod where SSH shows the node.
    let ls = s.c.sally(&s.home, &["recordings", "ls"], "").ok();
    assert!(ls.stdout.contains("lab/dev/web-1"), "{}", ls.stdout);
    let played = s.c.sally(&s.home, &["play", &id], "").ok();
    assert!(played.stdout.contains("hello from web-1"), "{played:?}");
    let header: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&cast)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(header["command"], "echo hello from web-1", "{header}");
    assert!(
        eventually(Duration::from_secs(5), || s
            .c
            .events("session.end")
            .iter()
            .any(|e| e["session_id"] == id.as_str() && e["exit_code"] == 0)),
        "no session.end with exit 0"
    );
    let exit3 = exec_session(&s.c, "web-2", "sh -c echo out; echo err >&2; exit 3");
    let id3 = exit3["session_id"].as_str().unwrap().to_string();
    assert!(eventually(Duration::from_secs(5), || {
        s.c.events("session.end")
            .iter()
            .any(|e| e["session_id"] == id3.as_str() && e["exit_code"] == 3)
    }));

    // What the roles do not allow never reaches the API server.
    let before = requests_to(&s.api, "/exec").len();
    // (kubectl reads the pod first: that is refused already.)
    k(&[], &["exec", "-n", "prod", "db-1", "--", "true"], "").fails_with("Forbidden");
    assert_eq!(requests_to(&s.api, "/exec").len(), before);
    // The API server's own refusal reaches kubectl as its words.
    k(&[], &["exec", "-n", "dev", "nosuch", "--", "true"], "").fails_with("not found");
    // SPDY, kubectl's other way, runs too (tests/tests/kube_spdy.rs).
    k(
        &[("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false")],
        &["exec", "-n", "dev", "web-1", "-c", "main", "--", "true"],
        "",
    )
    .ok();
}

#[test]
fn port_forward_is_audited_and_ended_by_a_lock() {
    // What the pod serves on its port 80: a local web server.
    let www = tempfile::tempdir().unwrap();
    std::fs::write(www.path().join("index.html"), "served by web-1\n").unwrap();
    let web_port = free_port();
    let _web = Bg(Command::new("python3")
        .args([
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            &web_port.to_string(),
        ])
        .current_dir(www.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap());
    let forward = format!("80={web_port}");
    let s = setup_with("kube-dev-pf", &[PF_ROLE], &["--forward", &forward]);
    // Both of kubectl's ways: SPDY tunneled in a WebSocket (1.31+), and plain SPDY.
    let forwards: Vec<(u16, Bg)> = [None, Some(("KUBECTL_PORT_FORWARD_WEBSOCKETS", "false"))]
        .into_iter()
        .map(|env| {
            let local = free_port();
            let mut pf = Command::new(sallyport_tests::kube::KUBECTL);
            pf.env("KUBECONFIG", &s.kubeconfig)
                .env("HOME", &s.home)
                .args([
                    "port-forward",
                    "-n",
                    "dev",
                    "pod/web-1",
                    &format!("{local}:80"),
                ])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            if let Some((k, v)) = env {
                pf.env(k, v);
            }
            (local, Bg(pf.spawn().unwrap()))
        })
        .collect();
    let fetch = |local: u16| {
        let url = format!("http://127.0.0.1:{local}/index.html");
        run(
            Command::new("curl").args(["-sS", "--max-time", "2", &url]),
            "",
        )
    };
    for (local, _) in &forwards {
        assert!(
            eventually(Duration::from_secs(15), || fetch(*local).stdout
                == "served by web-1\n"),
            "nothing came through the port-forward: {:?}",
            fetch(*local)
        );
    }
    let started = |c: &Cluster, action: &str| {
        c.events("kube.port_forward")
            .into_iter()
            .filter(|e| e["action"] == action)
            .collect::<Vec<_>>()
    };
    let mut start = started(&s.c, "start");
    assert!(
        eventually(Duration::from_secs(10), || {
            start = started(&s.c, "start");
            start.len() >= 2
        }),
        "{start:#?}"
    );
    // Read again past the door's gather: a third start would be in a later write.
    std::thread::sleep(Duration::from_millis(200));
    start = started(&s.c, "start");
    assert_eq!(start.len(), 2, "{start:#?}");
    for e in &start {
        assert_eq!(e["pod"], "web-1");
        assert_eq!(e["namespace"], "dev");
        assert_eq!(e["kube_cluster"], "lab");
        assert_eq!(e["user"], "alice");
    }
    // A lock ends the streams at once, and says why in the audit log.
    s.c.sallyctl(&["lock", "--user", "alice", "--message", "incident 9"])
        .ok();
    assert!(
        eventually(Duration::from_secs(10), || started(&s.c, "stop").len() == 2),
        "the port-forwards were not ended: {:#?}",
        started(&s.c, "stop")
    );
    for stop in started(&s.c, "stop") {
        assert!(
            stop["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("incident 9"),
            "{stop}"
        );
        // kubectl names the pod port inside its streams, both ways: the stop says which.
        assert_eq!(stop["ports"], serde_json::json!([80]), "{stop}");
    }
    for (local, _) in &forwards {
        assert!(
            eventually(Duration::from_secs(10), || fetch(*local).stdout
                != "served by web-1\n"),
            "a port-forward still carries traffic after the lock"
        );
    }
}

const PF_ROLE: &str = "kind: role
version: v1
metadata: {name: kube-dev-pf}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_resources:
      - {kind: pod, namespace: dev, verbs: [get, list, portforward]}
";
