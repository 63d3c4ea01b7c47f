//! The browser's JSON API past sign-in and the terminal, driven as the web UI drives it (the
//! shared `sallyport_tests::web::Browser`): recordings and their casts. Every answer is auth's, asked as the signed-in user's own certificate, so each
//! check has its refusal beside it: another user's recording, a search without the right, a
//! locked user, no session.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sallyport_tests::web::*;
use sallyport_tests::*;
use serde_json::Value;

/// A cluster with the local node online and `users` (name, roles, logins) signed up.
fn cluster_with(users: &[(&str, &str, &str)]) -> Cluster {
    let c = Cluster::start();
    c.wait_online("local1");
    for (name, roles, logins) in users {
        let token = c.add_user(name, roles, logins);
        c.signup(&token, PASSWORD);
    }
    c
}

async fn signed_in(c: &Cluster, user: &str) -> Browser {
    let mut b = Browser::new(c);
    let (status, _, body) = b.login(user, PASSWORD, None).await;
    assert_eq!(status, 200, "{user}: {body}");
    b
}

/// Runs `command` in a browser terminal on local1 as root; returns the session id once the
/// terminal has closed (its recording finished).
async fn recorded_session(b: &Browser, command: &str) -> String {
    let mut t = b.terminal("node=local1&login=root&cols=80&rows=24").await;
    while t.texts.is_empty() {
        assert!(t.read_one().await, "closed: {:?}", t.close);
    }
    let id = t.texts[0]["id"].as_str().unwrap().to_string();
    t.input(format!("{command}; exit\n").as_bytes()).await;
    let code = t.closed().await;
    assert_eq!(code, 1000, "{:?} {:?}", t.texts, t.screen());
    id
}

fn ids(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .map(|s| s["session_id"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn recordings_are_listed_described_and_streamed_only_to_whom_may_replay_them() {
    let c = cluster_with(&[
        ("alice", "access", "root"),
        ("bob", "access", "root"),
        ("carol", "auditor", ""),
    ]);
    rt().block_on(async {
        let mut anon = Browser::new(&c);
        let (status, body) = anon.get("/v1/webapi/recordings").await;
        assert_eq!(status, 401, "{body}");

        let alice = signed_in(&c, "alice").await;
        let bob = signed_in(&c, "bob").await;
        let carol = signed_in(&c, "carol").await;
        let mine = recorded_session(&alice, "echo from-al''ice").await;
        let theirs = recorded_session(&bob, "echo from-b''ob").await;

        // Alice sees her own sessions only (`sally recordings ls`'s scope).
        let (status, list) = alice.get("/v1/webapi/recordings").await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(ids(&list), vec![mine.clone()]);
        // The auditor sees everyone's.
        let (status, list) = carol.get("/v1/webapi/recordings").await;
        assert_eq!(status, 200, "{list}");
        let all = ids(&list);
        assert!(all.contains(&mine) && all.contains(&theirs), "{list}");

        // One session: its record and its recording's size, as on disk.
        let file = c.data_dir().join("recordings").join(format!("{mine}.cast"));
        let on_disk = std::fs::read(&file).unwrap();
        let (status, detail) = alice.get(&format!("/v1/webapi/recordings/{mine}")).await;
        assert_eq!(status, 200, "{detail}");
        assert_eq!(detail["session_id"], mine.as_str());
        assert_eq!(detail["user"], "alice");
        assert_eq!(detail["node"], "local1");
        assert_eq!(detail["recording_size"], on_disk.len() as u64, "{detail}");

        // The cast, byte for byte, as an asciicast.
        let (status, ctype, cast) = alice
            .get_bytes(&format!("/v1/webapi/recordings/{mine}/cast"))
            .await;
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&cast));
        assert_eq!(ctype, "application/x-asciicast");
        assert_eq!(cast, on_disk);
        assert!(String::from_utf8_lossy(&cast).contains("from-alice"));

        // Bob's session is not Alice's to see: auth's 403, as JSON, for the record and the cast.
        for path in [
            format!("/v1/webapi/recordings/{theirs}"),
            format!("/v1/webapi/recordings/{theirs}/cast"),
        ] {
            let (status, body) = alice.get(&path).await;
            assert_eq!(status, 403, "{path}: {body}");
            assert!(
                body["error"].as_str().unwrap().contains("another user"),
                "{body}"
            );
        }
        // The auditor may replay it.
        let (status, _, cast) = carol
            .get_bytes(&format!("/v1/webapi/recordings/{theirs}/cast"))
            .await;
        assert_eq!(status, 200);
        assert!(String::from_utf8_lossy(&cast).contains("from-bob"));
        // An unknown session, and a name that is no session id: 404 and 400, said.
        let (status, body) = alice
            .get("/v1/webapi/recordings/7d1c2f8e-0000-4000-8000-000000000000/cast")
            .await;
        assert_eq!(status, 404, "{body}");
        assert!(body["error"].as_str().unwrap().contains("does not exist"));
        let (status, body) = alice.get("/v1/webapi/recordings/..%2F..%2Fetc/cast").await;
        assert!(status == 404 || status == 400, "{status} {body}");
        // Not signed in: no cast.
        anon.cookie = Some("not-a-session".into());
        let (status, _) = anon
            .get(&format!("/v1/webapi/recordings/{mine}/cast"))
            .await;
        assert_eq!(status, 401);

        // A locked user's web session is refused from the next poll on.
        c.sallyctl(&[
            "lock",
            "--user",
            "alice",
            "--ttl",
            "1h",
            "--message",
            "incident 8",
        ])
        .ok();
        let refused = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let (status, _) = alice.get("/v1/webapi/recordings").await;
                if status != 200 {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await
        .unwrap();
        // Auth refuses her certificate at once (403); the proxy's lock poll then ends the
        // web session itself (401) within its 2 s.
        assert!(refused == 401 || refused == 403, "{refused}");
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while alice.get("/v1/webapi/web/session").await.0 != 401 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        assert!(ended.is_ok(), "the locked user's web session lives on");
        assert_eq!(alice.get("/v1/webapi/recordings").await.0, 401);
    });
}

