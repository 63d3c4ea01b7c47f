//! `kubectl exec` over SPDY/3.1, both sides: real kubectl 1.32 with
//! `KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false` speaks SPDY to the proxy's kube door, and the kube
//! agent falls back to SPDY when the API server refuses the WebSocket (the fixture's
//! `--no-websocket`, a cluster before 1.30). Either way round the session is the same one: the
//! exit code, stdin's end, bulk bytes exactly, the recording and the audit, the same refusal.
//! Which protocol the API server saw is read from the fixture's own session log.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::kube::{ApiServer, KUBECTL, Setup, requests_to, setup, setup_with};
use sallyport_tests::*;

const SPDY: (&str, &str) = ("KUBECTL_REMOTE_COMMAND_WEBSOCKETS", "false");

/// What the fixture says of each exec it ran: transport (`websocket`, `spdy`) and protocol.
fn upstream_sessions(api: &ApiServer) -> Vec<serde_json::Value> {
    std::fs::read_to_string(api.dir.join("sessions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The transport the API server ran `command` over (its last such exec).
fn upstream_transport(api: &ApiServer, command: &[&str]) -> String {
    let mut found = String::new();
    assert!(
        eventually(Duration::from_secs(5), || {
            found = upstream_sessions(api)
                .iter()
                .rev()
                .find(|r| r["command"] == serde_json::json!(command))
                .map(|r| {
                    let word = |k: &str| r[k].as_str().unwrap_or_default().to_string();
                    format!("{} {}", word("transport"), word("protocol"))
                })
                .unwrap_or_default();
            !found.is_empty()
        }),
        "the API server ran no {command:?}: {:#?}",
        upstream_sessions(api)
    );
    found
}

/// `len` bytes that do not repeat in any short period (xorshift).
fn noise(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// `kubectl exec -i POD -- cat` with `data` on stdin; its stdout, byte for byte.
fn cat_through(s: &Setup, env: &[(&str, &str)], data: &[u8]) -> Vec<u8> {
    let mut cmd = Command::new(KUBECTL);
    cmd.env("KUBECONFIG", &s.kubeconfig)
        .env("HOME", &s.home)
        .args(["--request-timeout", "60s"])
        .args([
            "exec", "-i", "-n", "dev", "web-1", "-c", "main", "--", "cat",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let mut out = Vec::new();
    child.stdout.take().unwrap().read_to_end(&mut out).unwrap();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let status = child.wait().unwrap();
    writer.join().unwrap().unwrap();
    // On failure, what the fixture says became of the exec too (`result`: its Status, or
    // "client went away" when the agent's connection ended first).
    assert!(
        status.success(),
        "kubectl exec -i cat: {status}: {err}\nthe API server's last cat: {:?}",
        upstream_sessions(&s.api)
            .into_iter()
            .rev()
            .find(|r| r["command"] == serde_json::json!(["cat"]))
    );
    out
}

/// echo, an exit code with stderr, and `cat` ended by stdin's end, with kubectl's `env`.
fn the_basics(s: &Setup, env: &[(&str, &str)], tag: &str) {
    let out = s
        .kubectl(
            env,
            &[
                "exec", "-n", "dev", "web-1", "-c", "main", "--", "echo", tag,
            ],
            "",
        )
        .ok();
    assert_eq!(out.stdout, format!("{tag}\n"));
    // Nothing else said: no complaint from kubectl about the stream.
    assert_eq!(out.stderr, "", "{out:?}");
    let script = format!("echo out {tag}; echo err >&2; exit 3");
    let out = s.kubectl(
        env,
        &["exec", "-n", "dev", "web-2", "--", "sh", "-c", &script],
        "",
    );
    assert_eq!(out.code, 3, "{out:?}");
    assert_eq!(out.stdout, format!("out {tag}\n"));
    assert!(out.stderr.contains("err"), "{out:?}");
    // stdin's end (SPDY: the stream's FIN) ends `cat`.
    let out = s
        .kubectl(
            env,
            &[
                "exec", "-i", "-n", "dev", "web-1", "-c", "main", "--", "cat",
            ],
            &format!("line one {tag}\nline two\n"),
        )
        .ok();
    assert_eq!(out.stdout, format!("line one {tag}\nline two\n"));
}

/// The session whose `session.start` names `command`.
fn exec_session(c: &Cluster, command: &str) -> serde_json::Value {
    let mut found = None;
    assert!(
        eventually(Duration::from_secs(5), || {
            found = c
                .events("session.start")
                .into_iter()
                .find(|e| e["command"] == command);
            found.is_some()
        }),
        "no session.start for {command}: {:#?}",
        c.events("session.start")
    );
    found.unwrap()
}

fn ended_with(c: &Cluster, id: &str, code: i64) -> bool {
    eventually(Duration::from_secs(5), || {
        c.events("session.end")
            .iter()
            .any(|e| e["session_id"] == id && e["exit_code"] == code)
    })
}

#[test]
fn kubectl_over_spdy_runs_through_the_session_engine_recorded_and_audited() {
    let s = setup("kube-dev", &[]);
    the_basics(&s, &[SPDY], "over spdy");
    // 4 MiB through `cat`, byte for byte.
    let data = noise(4 << 20);
    let got = cat_through(&s, &[SPDY], &data);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "the bytes that came back differ");

    // A session like any other: recorded, audited, with SPDY named as the protocol.
    let start = exec_session(&s.c, "echo over spdy");
    assert_eq!(start["user"], "alice");
    assert_eq!(start["kube_cluster"], "lab");
    assert_eq!(start["namespace"], "dev");
    assert_eq!(start["pod"], "web-1");
    assert_eq!(start["protocol"], "SPDY/3.1+v4.channel.k8s.io");
    let id = start["session_id"].as_str().unwrap().to_string();
    let cast = s.c.data_dir().join("recordings").join(format!("{id}.cast"));
    assert!(
        eventually(Duration::from_secs(5), || std::fs::read_to_string(&cast)
            .is_ok_and(|t| t.contains("over spdy"))),
        "recording {} lacks the output",
        cast.display()
    );
    assert!(ended_with(&s.c, &id, 0), "no session.end with exit 0");
    let exit3 = exec_session(&s.c, "sh -c echo out over spdy; echo err >&2; exit 3");
    assert!(ended_with(&s.c, exit3["session_id"].as_str().unwrap(), 3));
    // The door's answer and audit: the SPDY upgrade, allowed.
    let is_upgrade = |e: &serde_json::Value| {
        e["method"] == "POST"
            && e["path"].as_str().is_some_and(|p| p.ends_with("/exec"))
            && e["response_code"] == 101
    };
    let upgraded =
        s.c.events_when("kube.request", |ev| {
            ev.iter().filter(|e| is_upgrade(e)).count() >= 4
        })
        .into_iter()
        .filter(is_upgrade)
        .count();
    assert!(upgraded >= 4, "{upgraded} SPDY execs audited as upgraded");
    // Upstream the agent still speaks WebSocket v5 to an API server that has it.
    assert_eq!(
        upstream_transport(&s.api, &["echo", "over spdy"]),
        "websocket v5.channel.k8s.io"
    );
}

#[test]
fn an_api_server_without_websocket_is_spoken_to_over_spdy() {
    let s = setup_with("kube-dev", &[], &["--no-websocket"]);
    // kubectl over WebSocket to the door; the agent's WebSocket is refused (as the kubelet
    // refuses v5), and it asks again over SPDY.
    the_basics(&s, &[], "ws to spdy");
    assert_eq!(
        upstream_transport(&s.api, &["echo", "ws to spdy"]),
        "spdy v4.channel.k8s.io"
    );
    assert_eq!(
        upstream_transport(&s.api, &["cat"]),
        "spdy v4.channel.k8s.io"
    );
    let cat = upstream_sessions(&s.api)
        .into_iter()
        .rev()
        .find(|r| r["command"] == serde_json::json!(["cat"]))
        .unwrap();
    assert_eq!(cat["stdin_closed"], true, "{cat}");
    let data = noise(4 << 20);
    assert!(
        cat_through(&s, &[], &data) == data,
        "the bytes that came back differ"
    );
    let start = exec_session(&s.c, "echo ws to spdy");
    assert_eq!(start["protocol"], "v5.channel.k8s.io");
    // SPDY both ways.
    the_basics(&s, &[SPDY], "spdy to spdy");
    assert_eq!(
        upstream_transport(&s.api, &["echo", "spdy to spdy"]),
        "spdy v4.channel.k8s.io"
    );
    // The API server's own refusal still reaches kubectl as its words, from the first try.
    s.kubectl(&[], &["exec", "-n", "dev", "nosuch", "--", "true"], "")
        .fails_with("not found");
}

#[test]
fn kubectl_over_spdy_reaches_a_websocket_only_api_server() {
    let s = setup_with("kube-dev", &[], &["--no-spdy"]);
    the_basics(&s, &[SPDY], "spdy to ws");
    assert_eq!(
        upstream_transport(&s.api, &["echo", "spdy to ws"]),
        "websocket v5.channel.k8s.io"
    );
    let data = noise(1 << 20);
    assert!(
        cat_through(&s, &[SPDY], &data) == data,
        "the bytes that came back differ"
    );
}

#[test]
fn a_terminal_over_spdy_both_ways_is_sized_and_resized() {
    let s = setup_with("kube-dev", &[], &["--no-websocket"]);
    // As in kube_session.rs: `script` gives kubectl -t a terminal, 100x30, then 120x40.
    let inner = format!(
        "stty cols 100 rows 30; (while [ ! -e {sized} ]; do sleep 0.05; done; stty cols 120 rows 40 </dev/tty) & KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false KUBECONFIG={} HOME={} {KUBECTL} exec -it -n dev web-1 -c main -- sh -c 'sleep 0.5; stty size; touch {sized}; sleep 2.5; stty size; exit 4'",
        s.kubeconfig.display(),
        s.home.display(),
        sized = s.home.join("sized").display(),
    );
    let out = run(
        Command::new("script").args(["-qec", &inner, "/dev/null"]),
        "",
    );
    assert!(
        out.stdout.contains("30 100") && out.stdout.contains("40 120"),
        "{out:?}"
    );
    assert_eq!(out.code, 4, "{out:?}");
    let up = upstream_sessions(&s.api)
        .into_iter()
        .rev()
        .find(|r| r["tty"] == true)
        .unwrap();
    assert_eq!(up["transport"], "spdy", "{up}");
    let start = exec_session(
        &s.c,
        &format!(
            "sh -c sleep 0.5; stty size; touch {}; sleep 2.5; stty size; exit 4",
            s.home.join("sized").display()
        ),
    );
    assert_eq!(start["tty"], true);
    let id = start["session_id"].as_str().unwrap();
    let cast =
        std::fs::read_to_string(s.c.data_dir().join("recordings").join(format!("{id}.cast")))
            .unwrap();
    let header: serde_json::Value = serde_json::from_str(cast.lines().next().unwrap()).unwrap();
    assert_eq!(
        (header["width"].clone(), header["height"].clone()),
        (100.into(), 30.into())
    );
    assert!(cast.contains("\"r\",\"120x40\""), "{cast}");
}

#[test]
fn a_refused_exec_is_refused_alike_over_both_protocols() {
    // alice may read pods in prod (so kubectl gets as far as the exec) but not exec there.
    let viewer = "kind: role
version: v1
metadata: {name: prod-viewer}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_resources:
      - {kind: pod, namespace: prod, name: '*', verbs: [get, list]}
";
    let s = setup("kube-dev,prod-viewer", &[viewer]);
    let before = requests_to(&s.api, "/exec").len();
    let said = "may not exec pod \"db-1\" in namespace prod";
    // SPDY alone; then kubectl's own way: WebSocket, refused, then SPDY, refused alike.
    let spdy = s.kubectl(&[SPDY], &["exec", "-n", "prod", "db-1", "--", "true"], "");
    spdy.fails_with("Forbidden").fails_with(said);
    let both = s.kubectl(&[], &["exec", "-n", "prod", "db-1", "--", "true"], "");
    both.fails_with("Forbidden").fails_with(said);
    assert_eq!(requests_to(&s.api, "/exec").len(), before);
    // The door's audit: three tries, each refused with the same words.
    let db_exec = |e: &serde_json::Value| e["path"] == "/api/v1/namespaces/prod/pods/db-1/exec";
    let refused: Vec<serde_json::Value> =
        s.c.events_when("kube.request", |ev| {
            ev.iter().filter(|e| db_exec(e)).count() >= 3
        })
        .into_iter()
        .filter(db_exec)
        .collect();
    assert_eq!(refused.len(), 3, "{refused:#?}");
    assert!(
        refused
            .iter()
            .all(|e| e["allowed"] == false && e["response_code"] == 403),
        "{refused:#?}"
    );
    assert!(
        refused.windows(2).all(|w| w[0]["reason"] == w[1]["reason"]),
        "{refused:#?}"
    );
    // Over SPDY, through the POST kubectl sends it as; over WebSocket, its GET.
    let methods: Vec<&str> = refused
        .iter()
        .filter_map(|e| e["method"].as_str())
        .collect();
    assert_eq!(
        methods.iter().filter(|m| **m == "POST").count(),
        2,
        "{methods:?}"
    );
}

#[test]
fn a_lock_ends_a_live_exec_over_spdy_both_ways() {
    let s = setup_with("kube-dev", &[], &["--no-websocket"]);
    let mut cat = Command::new(KUBECTL)
        .env("KUBECONFIG", &s.kubeconfig)
        .env("HOME", &s.home)
        .env(SPDY.0, SPDY.1)
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
    s.c.sallyctl(&["lock", "--user", "alice", "--message", "incident 12"])
        .ok();
    let ended = eventually(Duration::from_secs(10), || {
        cat.try_wait().unwrap().is_some()
    });
    assert!(ended, "kubectl exec still runs for a locked user");
    drop(stdin);
    let out = cat.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("incident 12"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("before the lock"));
    // The agent let go of the API server's stream too.
    assert!(
        eventually(Duration::from_secs(10), || upstream_sessions(&s.api)
            .iter()
            .any(|r| r["command"] == serde_json::json!(["cat"]))),
        "the API server's cat never ended: {:#?}",
        upstream_sessions(&s.api)
    );
}

#[test]
fn an_api_server_that_never_opens_windows_still_gets_all_the_bytes() {
    // spdystream's way, as every real API server's: no WINDOW_UPDATE ever. The agent must not
    // wait for one, and SPDY on both sides carries 4 MiB each way all the same.
    let s = setup_with("kube-dev", &[], &["--no-websocket", "--no-window-updates"]);
    let data = noise(4 << 20);
    assert!(
        cat_through(&s, &[SPDY], &data) == data,
        "the bytes that came back differ"
    );
    let cat = upstream_sessions(&s.api)
        .into_iter()
        .rev()
        .find(|r| r["command"] == serde_json::json!(["cat"]))
        .unwrap();
    assert_eq!(cat["transport"], "spdy", "{cat}");
    assert_eq!(cat["bytes"]["stdin"], 4 << 20, "{cat}");
    assert!(cat["spdy_frames_out"]["WINDOW_UPDATE"].is_null(), "{cat}");
}
