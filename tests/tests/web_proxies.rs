//! Web sessions behind a load balancer: several proxies, one auth. Two proxies run as their own
//! processes (`sallyport start --auth-server ... --token ... --ca-pin ...` with a `proxy` token),
//! joined to the cluster's auth, both answering to one public address (the balancer's). A
//! browser signs in through proxy A; its next requests land on proxy B, which knows the session
//! (cookie and CSRF token) from auth. A sign-out on B ends the terminal the browser has open on
//! A within seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use sallyport_tests::web::*;
use sallyport_tests::*;
use serde_json::json;

/// What the balancer's address is to browsers: both proxies accept it as the origin.
const PUBLIC: &str = "sallyport.lb.test";

/// A proxy on its own, joined to `c`'s auth.
struct Proxy {
    child: Child,
    web: String,
    _dir: tempfile::TempDir,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_proxy(c: &Cluster, name: &str) -> Proxy {
    let token: serde_json::Value = serde_json::from_str(
        c.sallyctl(&["tokens", "add", "--type=proxy", "--format", "json"])
            .ok()
            .stdout
            .trim(),
    )
    .unwrap();
    let token = token["token"].as_str().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let web = format!("127.0.0.1:{}", free_port());
    let config = dir.path().join("proxy.yaml");
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
  web_listen_addr: {web}
  ssh_listen_addr: 127.0.0.1:{ssh}
  tunnel_listen_addr: 127.0.0.1:{tunnel}
  kube_listen_addr: 127.0.0.1:{kube}
  public_addr: [\"{PUBLIC}:443\"]
ssh_service:
  enabled: false
",
            data = dir.path().join("data").display(),
            ssh = free_port(),
            tunnel = free_port(),
            kube = free_port(),
        ),
    )
    .unwrap();
    let mut child = Command::new(bin("sallyport"))
        .args(["start", "-c"])
        .arg(&config)
        .args([
            "--auth-server",
            &c.auth,
            "--token",
            &token,
            "--ca-pin",
            &c.pin,
        ])
        .env("SALLYPORT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || for _ in BufReader::new(stdout).lines() {});
    let p = Proxy {
        child,
        web,
        _dir: dir,
    };
    // Serving once its web port answers.
    let deadline = Instant::now() + Duration::from_secs(60);
    rt().block_on(async {
        let b = Browser::at(c, &p.web);
        loop {
            if let Ok(r) = b
                .request(reqwest::Method::GET, "/v1/webapi/ping", None)
                .send()
                .await
                && r.status() == 200
            {
                break;
            }
            assert!(Instant::now() < deadline, "proxy {name} did not start");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    });
    p
}

/// A node agent of its own (`--roles=node`), dialing proxy `web`: it learns the other proxies
/// from the heartbeats' answers and keeps a tunnel to each.
fn start_node(c: &Cluster, web: &str, name: &str) -> (Child, tempfile::TempDir) {
    let token: serde_json::Value = serde_json::from_str(
        c.sallyctl(&["tokens", "add", "--type=node", "--format", "json"])
            .ok()
            .stdout
            .trim(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(bin("sallyport"))
        .args(["start", "--roles=node", "--proxy", web, "--token"])
        .arg(token["token"].as_str().unwrap())
        .args(["--ca-pin", &c.pin, "--nodename", name, "--data-dir"])
        .arg(dir.path())
        .env("SALLYPORT_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    (child, dir)
}

/// A browser at proxy `addr`, as the balancer's page: the balancer's origin.
fn behind_balancer(c: &Cluster, addr: &str) -> Browser {
    let mut b = Browser::at(c, addr);
    b.origin = format!("https://{PUBLIC}");
    b
}

#[test]
fn a_session_opened_on_one_proxy_is_used_and_ended_on_another() {
    let c = Cluster::start();
    let token = c.add_user("alice", "access", "root");
    c.signup(&token, PASSWORD);
    let a = start_proxy(&c, "proxy-a");
    let b = start_proxy(&c, "proxy-b");
    let (mut node, _node_dir) = start_node(&c, &a.web, "node1");
    rt().block_on(async {
        let mut on_a = behind_balancer(&c, &a.web);
        let (status, _, body) = on_a.login("alice", PASSWORD, None).await;
        assert_eq!(status, 200, "{body}");
        let mut on_b = behind_balancer(&c, &b.web);
        on_b.cookie = on_a.cookie.clone();
        on_b.csrf = on_a.csrf.clone();

        // B knows the session from auth: who, the same CSRF token, and it answers as her.
        let (status, s) = on_b.get("/v1/webapi/web/session").await;
        assert_eq!(status, 200, "{s}");
        assert_eq!(s["user"], "alice");
        assert_eq!(s["csrf_token"].as_str(), on_a.csrf.as_deref());
        // (node1 joins as the test goes on.)
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, nodes) = on_b.get("/v1/webapi/nodes").await;
            assert_eq!(status, 200, "{nodes}");
            if nodes.to_string().contains("node1") {
                break;
            }
            assert!(Instant::now() < deadline, "{nodes}");
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        // ...and refuses what it refuses on A: a request that changes something without the
        // token, a made-up cookie.
        let (status, body) = on_b
            .send_as(
                reqwest::Method::POST,
                "/v1/webapi/roles/validate",
                Some(&on_b.origin.clone()),
                None,
                json!({"yaml": "kind: role"}),
            )
            .await;
        assert_eq!(status, 403, "{body}");
        let mut stranger = behind_balancer(&c, &b.web);
        stranger.cookie = Some("f".repeat(64));
        assert_eq!(stranger.get("/v1/webapi/web/session").await.0, 401);

        // A terminal on A; signed out on B: A ends it within seconds, with B's words.
        // The node's agent learns of the new proxies from its heartbeats: until its tunnel to A
        // is up, A says the node is offline.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut t = loop {
            let mut t = on_a.terminal("node=node1&login=root").await;
            t.input(b"echo on-a-$((6*7))\n").await;
            let up = tokio::time::timeout(Duration::from_secs(20), async {
                while !t.screen().contains("on-a-42") {
                    if !t.read_one().await {
                        return false;
                    }
                }
                true
            })
            .await;
            if matches!(up, Ok(true)) {
                break t;
            }
            assert!(
                t.error().contains("not connected to this proxy") && Instant::now() < deadline,
                "{:?} {:?}",
                t.texts,
                t.close
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        };
        let started = Instant::now();
        let (status, body) = on_b
            .logout(Some(&on_b.origin.clone()), on_b.csrf.as_deref())
            .await;
        assert_eq!(status, 200, "{body}");
        let code = t.closed().await;
        let took = started.elapsed();
        assert_eq!(code, 4401, "{:?}", t.texts);
        assert!(t.error().contains("you signed out"), "{:?}", t.texts);
        assert!(took < Duration::from_secs(6), "ended after {took:?}");
        eprintln!("terminal on A ended {took:?} after the sign-out on B");
        // Nowhere signed in any more.
        assert_eq!(on_a.get("/v1/webapi/web/session").await.0, 401);
        assert_eq!(on_b.get("/v1/webapi/web/session").await.0, 401);
    });
    let _ = node.kill();
    let _ = node.wait();
}
