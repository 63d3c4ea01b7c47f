//! The browser's web session and terminal, driven as a browser drives them: HTTPS with an
//! `Origin`, the session cookie and the CSRF token; the terminal a WebSocket with subprotocol
//! `sallyport.term.v1` (binary frames raw bytes, text frames JSON). Every check of the door has
//! its refusal beside it: another origin, no token, no cookie, a login the roles refuse, a
//! message that is not one, a frame too large, a sign-out and a lock ending a live terminal.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sallyport_tests::web::*;
use sallyport_tests::*;
use serde_json::{Value, json};

/// A cluster with `alice` (role `access`, login root) signed up, the local node online.
fn cluster_with_alice(o: Options) -> (Cluster, Option<String>) {
    let c = Cluster::start_with(o);
    c.wait_online("local1");
    let token = c.add_user("alice", "access", "root");
    let secret = c.signup(&token, PASSWORD);
    (c, secret)
}

#[test]
fn sign_in_list_nodes_and_run_a_terminal() {
    let (c, _) = cluster_with_alice(Options::default());
    rt().block_on(async {
        let mut b = Browser::new(&c);
        let (status, set_cookie, body) = b.login("alice", PASSWORD, None).await;
        assert_eq!(status, 200, "{body}");
        for flag in ["HttpOnly", "Secure", "SameSite=Strict", "Path=/"] {
            assert!(set_cookie.contains(flag), "{set_cookie}");
        }
        assert!(
            set_cookie.starts_with("__Host-sallyport_session="),
            "{set_cookie}"
        );
        assert!(!set_cookie.contains("Domain"), "{set_cookie}");
        assert_eq!(body["user"], "alice");

        // The session and its CSRF token; API answers are never cached.
        let resp = b
            .request(reqwest::Method::GET, "/v1/webapi/web/session", None)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        assert_eq!(resp.headers()["cache-control"], "no-store");
        let s: Value = resp.json().await.unwrap();
        assert_eq!(s["user"], "alice");
        assert_eq!(s["roles"], json!(["access"]));
        assert!(
            s["logins"].as_array().unwrap().contains(&json!("root")),
            "{s}"
        );
        assert!(s["expires"].as_str().is_some(), "{s}");
        assert_eq!(s["idle_timeout_secs"], 1800);
        let csrf = s["csrf_token"].as_str().unwrap();
        assert!(csrf.len() >= 32, "{s}");
        assert_eq!(Some(csrf), b.csrf.as_deref());

        // The nodes her roles reach, with the logins allowed on each.
        let (status, nodes) = b.get("/v1/webapi/nodes").await;
        assert_eq!(status, 200, "{nodes}");
        let local = nodes
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "local1")
            .unwrap_or_else(|| panic!("{nodes}"));
        assert_eq!(local["status"], "online");
        assert_eq!(local["labels"]["env"], "dev");
        assert_eq!(local["logins"], json!(["root"]));

        // A terminal: the session frame, a shell, a resize, a paste of 1 MiB, the exit status.
        let mut t = b.terminal("node=local1&login=root&cols=90&rows=30").await;
        while t.texts.is_empty() {
            assert!(t.read_one().await, "closed: {:?}", t.close);
        }
        let hello = &t.texts[0];
        assert_eq!(hello["type"], "session", "{hello}");
        let session_id = hello["id"].as_str().unwrap().to_string();
        t.input(b"echo h''i\n").await;
        t.wait_for("hi\r\n").await;
        t.input(b"stty size\n").await;
        t.wait_for("30 90").await;
        t.text(r#"{"type":"resize","cols":100,"rows":37}"#).await;
        // Out of range: said, and the session lives.
        t.text(r#"{"type":"resize","cols":0,"rows":5000}"#).await;
        t.input(b"stty size\n").await;
        t.wait_for("37 100").await;
        assert!(t.error().contains("1 to 1000"), "{:?}", t.texts);
        // Input is never dropped: 1 MiB pasted in 32 KiB frames arrives whole.
        t.input(b"stty raw -echo; head -c 1048576 | wc -c; stty sane\n")
            .await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let chunk = vec![b'a'; 32 * 1024];
        for _ in 0..32 {
            t.input(&chunk).await;
        }
        t.wait_for("1048576").await;
        t.input(b"exit 3\n").await;
        assert_eq!(t.closed().await, 1000, "{:?}", t.texts);
        let exit = t.frames("exit");
        assert_eq!(exit.len(), 1, "{:?}", t.texts);
        assert_eq!(exit[0]["status"], 3);

        // Recorded as every session: the resize as an `r` event.
        let cast = std::fs::read_to_string(
            c.data_dir()
                .join("recordings")
                .join(format!("{session_id}.cast")),
        )
        .unwrap();
        assert!(cast.contains(r#""r","100x37""#), "{cast}");
        // Audited with the browser's address.
        let start = c
            .events("session.start")
            .into_iter()
            .find(|e| e["session_id"] == session_id.as_str() || e["sid"] == session_id.as_str())
            .unwrap_or_else(|| panic!("no session.start for {session_id}"));
        assert!(
            start.to_string().contains("127.0.0.1:"),
            "the browser's address: {start}"
        );
        let logins = c.events("user.login");
        assert!(
            logins
                .iter()
                .any(|e| e["method"] == "web" && e["success"] == true),
            "{logins:?}"
        );
    });
}

#[test]
fn other_origins_missing_tokens_and_bad_requests_are_refused() {
    let (c, _) = cluster_with_alice(Options::default());
    rt().block_on(async {
        let mut b = Browser::new(&c);
        // Not signed in: 401 JSON, and the terminal closes 4401.
        let (status, body) = b.get("/v1/webapi/web/session").await;
        assert_eq!(status, 401, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("sign in"),
            "{body}"
        );
        let (status, _) = b.get("/v1/webapi/nodes").await;
        assert_eq!(status, 401);
        let mut t = b.terminal("node=local1&login=root").await;
        assert_eq!(t.closed().await, 4401);
        assert!(t.error().contains("sign in"), "{:?}", t.texts);

        // Sign-in from another origin, or none: 403, no cookie.
        for origin in [
            Some("https://evil.example"),
            Some("https://127.0.0.1:1"),
            None,
        ] {
            let resp = b
                .request(reqwest::Method::POST, "/v1/webapi/web/login", origin)
                .json(&json!({"user": "alice", "password": PASSWORD}))
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status().as_u16(), 403, "{origin:?}");
            assert!(resp.headers().get("set-cookie").is_none());
            let body: Value = resp.json().await.unwrap();
            assert!(
                body["error"].as_str().unwrap().contains("cross-origin"),
                "{body}"
            );
        }
        // Not JSON: 415; too large: 413.
        let resp = b
            .request(
                reqwest::Method::POST,
                "/v1/webapi/web/login",
                Some(&b.origin),
            )
            .header("content-type", "application/x-www-form-urlencoded")
            .body("user=alice&password=x")
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 415);
        let resp = b
            .request(
                reqwest::Method::POST,
                "/v1/webapi/web/login",
                Some(&b.origin),
            )
            .header("content-type", "application/json")
            .body(format!(
                r#"{{"user":"alice","password":"{}"}}"#,
                "x".repeat(70 * 1024)
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 413);
        // An unknown API route: a JSON 404.
        let (status, body) = b.get("/v1/webapi/no/such/thing").await;
        assert_eq!(status, 404);
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("no such API route"),
            "{body}"
        );

        let (status, _, _) = b.login("alice", PASSWORD, None).await;
        assert_eq!(status, 200);
        let csrf = b.csrf.clone().unwrap();
        let origin = b.origin.clone();
        // Sign-out without the token, with a wrong one, or from another origin: 403, and the
        // session lives.
        for (o, token) in [
            (Some(origin.as_str()), None),
            (Some(origin.as_str()), Some("0".repeat(csrf.len()))),
            (Some("https://evil.example"), Some(csrf.clone())),
            (None, Some(csrf.clone())),
        ] {
            let (status, body) = b.logout(o, token.as_deref()).await;
            assert_eq!(status, 403, "{o:?} {token:?}: {body}");
        }
        assert_eq!(b.get("/v1/webapi/web/session").await.0, 200);

        // An upgrade from another origin, or none: 403 before any WebSocket.
        for o in [Some("https://evil.example"), Some("http://127.0.0.1"), None] {
            match b.terminal_from(o, "node=local1&login=root").await {
                Err((status, body)) => {
                    assert_eq!(status, 403, "{o:?}: {body}");
                    assert!(body.contains("cross-origin"), "{body}");
                }
                Ok(_) => panic!("an upgrade from {o:?} was accepted"),
            }
        }

        // A text frame that is not JSON, or of an unknown type: 1008.
        for bad in ["not json", r#"{"type":"shell"}"#, "[1,2]"] {
            let mut t = b.terminal("node=local1&login=root").await;
            t.text(bad).await;
            assert_eq!(t.closed().await, 1008, "{bad}: {:?}", t.texts);
            assert!(!t.error().is_empty(), "{bad}");
        }
        // A frame over 64 KiB: 1009.
        let mut t = b.terminal("node=local1&login=root").await;
        t.input(&vec![b'x'; 65 * 1024]).await;
        assert_eq!(t.closed().await, 1009, "{:?}", t.texts);
        // A node that is not there: refused, never a hang.
        let mut t = b.terminal("node=nosuch&login=root").await;
        assert_eq!(t.closed().await, 4403);
        assert!(t.error().contains("nosuch"), "{:?}", t.texts);
    });
}

#[test]
fn a_login_the_roles_do_not_allow_is_refused_with_the_reason_and_audited() {
    let (c, _) = cluster_with_alice(Options::default());
    rt().block_on(async {
        let mut b = Browser::new(&c);
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        let mut t = b.terminal("node=local1&login=nobody").await;
        assert_eq!(t.closed().await, 4403, "{:?}", t.texts);
        assert!(t.frames("session").is_empty());
        assert!(t.error().contains("nobody"), "{:?}", t.texts);
    });
    let rejected = c.events("session.reject");
    assert!(
        rejected
            .iter()
            .any(|e| e.to_string().contains("nobody") && e["user"] == "alice"),
        "{rejected:?}"
    );
}

#[test]
fn sign_out_and_a_lock_end_live_terminals() {
    let (c, _) = cluster_with_alice(Options::default());
    rt().block_on(async {
        let mut b = Browser::new(&c);
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        let mut t = b.terminal("node=local1&login=root").await;
        t.input(b"echo up$((1+1))\n").await;
        t.wait_for("up2").await;
        let csrf = b.csrf.clone();
        let (status, body) = b.logout(Some(&b.origin.clone()), csrf.as_deref()).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(t.closed().await, 4401, "{:?}", t.texts);
        assert!(t.error().contains("signed out"), "{:?}", t.texts);
        // The session is gone server-side: the old cookie is worth nothing.
        assert_eq!(b.get("/v1/webapi/web/session").await.0, 401);
        let mut t = b.terminal("node=local1&login=root").await;
        assert_eq!(t.closed().await, 4401);

        // A lock ends the terminal (within the 2 s poll) and the session.
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        let mut t = b.terminal("node=local1&login=root").await;
        t.input(b"echo up$((2+2))\n").await;
        t.wait_for("up4").await;
        c.sallyctl(&[
            "lock",
            "--user",
            "alice",
            "--ttl",
            "1h",
            "--message",
            "incident 7",
        ])
        .ok();
        let code = tokio::time::timeout(Duration::from_secs(10), t.closed())
            .await
            .unwrap();
        assert_eq!(code, 4409, "{:?}", t.texts);
        assert!(t.error().contains("locked"), "{:?}", t.texts);
        assert_eq!(b.get("/v1/webapi/web/session").await.0, 401);
        // And a locked user cannot sign in again.
        let (status, _, body) = b.login("alice", PASSWORD, None).await;
        assert_ne!(status, 200, "{body}");
    });
}

#[test]
fn a_wrong_password_reads_as_a_wrong_code() {
    let (c, secret) = cluster_with_alice(Options {
        second_factor: true,
        ..Default::default()
    });
    let secret = secret.unwrap();
    rt().block_on(async {
        let mut b = Browser::new(&c);
        // A code that is never valid now (five steps ahead), and the right one with a wrong
        // password: one answer.
        let (s1, cookie1, wrong_password) = b
            .login("alice", "wrong password", Some(&totp_code(&secret, 1)))
            .await;
        let (s2, cookie2, wrong_code) = b
            .login("alice", PASSWORD, Some(&totp_code(&secret, 5)))
            .await;
        assert_eq!((s1, s2), (401, 401), "{wrong_password} {wrong_code}");
        assert_eq!(wrong_password["error"], wrong_code["error"]);
        assert!(cookie1.is_empty() && cookie2.is_empty());
        // The next step's code (sign-up used this one) signs in, once.
        let code = totp_code(&secret, 1);
        let (status, _, body) = b.login("alice", PASSWORD, Some(&code)).await;
        assert_eq!(status, 200, "{body}");
        let mut again = Browser::new(&c);
        let (status, _, _) = again.login("alice", PASSWORD, Some(&code)).await;
        assert_eq!(status, 401);
    });
    let logins = c.events("user.login");
    assert!(
        logins
            .iter()
            .any(|e| e["method"] == "web" && e["success"] == false),
        "{logins:?}"
    );
}

#[test]
fn a_web_session_without_input_ends_and_polling_does_not_keep_it() {
    let (c, _) = cluster_with_alice(Options {
        proxy_service: vec!["web_idle_timeout: 6s".into()],
        ..Default::default()
    });
    rt().block_on(async {
        let mut b = Browser::new(&c);
        assert_eq!(b.login("alice", PASSWORD, None).await.0, 200);
        let (_, s) = b.get("/v1/webapi/web/session").await;
        assert_eq!(s["idle_timeout_secs"], 6);
        // Terminal input keeps it alive past the timeout (6 s: a loaded machine's shell may
        // take seconds to answer the first line).
        let mut t = b.terminal("node=local1&login=root").await;
        for i in 0..5 {
            t.input(format!("echo k{i}$((1+1))\n").as_bytes()).await;
            t.wait_for(&format!("k{i}2")).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        assert_eq!(b.get("/v1/webapi/web/session").await.0, 200);
        // Then nothing but polling: the session ends, and its terminal with it.
        let mut ended = false;
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            if b.get("/v1/webapi/web/session").await.0 == 401 {
                ended = true;
                break;
            }
        }
        assert!(ended, "polling kept the web session alive");
        assert_eq!(t.closed().await, 4401, "{:?}", t.texts);
        assert!(t.error().contains("web_idle_timeout"), "{:?}", t.texts);
    });
}
