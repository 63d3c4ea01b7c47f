//! The browser's JSON API past sign-in and the terminal, driven as the web UI drives it (the
//! shared `sallyport_tests::web::Browser`): recordings and their casts, the audit log and its
//! download. Every answer is auth's, asked as the signed-in user's own certificate, so each
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

        // Alice sees her own sessions only: what `sally recordings ls` shows her.
        let (status, list) = alice.get("/v1/webapi/recordings").await;
        assert_eq!(status, 200, "{list}");
        assert_eq!(ids(&list), vec![mine.clone()]);
        let home = c.dir.path().join("home-alice");
        c.login(&home, "alice", PASSWORD).ok();
        let listed: Value = serde_json::from_str(
            &c.sally(&home, &["recordings", "ls", "--format", "json"], "")
                .ok()
                .stdout,
        )
        .unwrap();
        assert_eq!(ids(&listed), ids(&list));
        assert_eq!(listed[0]["node"], list[0]["node"]);
        assert_eq!(listed[0]["start"], list[0]["start"]);
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

/// The `user.login` records a search for `filters` finds, through the page's paging.
async fn all_pages(b: &Browser, filters: &str, limit: u32) -> Vec<Value> {
    let mut out = Vec::new();
    let mut cursor: Option<i64> = None;
    loop {
        let mut path = format!("/v1/webapi/audit?{filters}&limit={limit}");
        if let Some(c) = cursor {
            path.push_str(&format!("&cursor={c}"));
        }
        let (status, page) = b.get(&path).await;
        assert_eq!(status, 200, "{path}: {page}");
        let events = page["events"].as_array().unwrap();
        assert!(events.len() <= limit as usize, "{page}");
        out.extend(events.iter().cloned());
        match page["next_cursor"].as_i64() {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
}

fn seqs(events: &[Value]) -> Vec<i64> {
    events.iter().map(|e| e["seq"].as_i64().unwrap()).collect()
}

#[test]
fn the_audit_log_is_paged_filtered_and_downloaded_as_sallyctl_prints_it() {
    let c = cluster_with(&[("alice", "access", "root"), ("carol", "auditor", "")]);
    rt().block_on(async {
        // Some records to page through: sign-ins of both, and a recorded session of Alice's.
        for _ in 0..3 {
            signed_in(&c, "alice").await;
            signed_in(&c, "carol").await;
        }
        let alice = signed_in(&c, "alice").await;
        let session = recorded_session(&alice, "echo audited").await;
        let carol = signed_in(&c, "carol").await;

        // A person without the right to search gets auth's refusal, said.
        let (status, body) = alice.get("/v1/webapi/audit").await;
        assert_eq!(status, 403, "{body}");
        assert!(body["error"].as_str().unwrap().contains("event"), "{body}");
        let (status, _, _) = alice.get_bytes("/v1/webapi/audit/download").await;
        assert_eq!(status, 403);

        // Pages: newest first, each at most `limit`, no record twice, none left out.
        let one_go = all_pages(&carol, "type=user.login", 1000).await;
        assert!(one_go.len() >= 8, "{one_go:?}");
        let paged = all_pages(&carol, "type=user.login", 3).await;
        assert_eq!(seqs(&paged), seqs(&one_go));
        let s = seqs(&paged);
        assert!(s.windows(2).all(|w| w[0] > w[1]), "newest first: {s:?}");
        // Records no signed checkpoint covers yet are said, as sallyctl warns of them.
        let (_, page) = carol.get("/v1/webapi/audit?limit=5").await;
        let newest = page["events"][0]["seq"].as_i64().unwrap();
        match page["unanchored_from"].as_i64() {
            Some(from) => assert!(from <= newest, "{page}"),
            None => assert!(page["unanchored_from"].is_null(), "{page}"),
        }

        // Filters: user, node, session, since/until.
        let mine = all_pages(&carol, "type=user.login&user=alice", 100).await;
        assert!(mine.len() >= 4, "{mine:?}");
        assert!(mine.iter().all(|e| e["user"] == "alice"), "{mine:?}");
        let of_session = all_pages(&carol, &format!("session={session}"), 100).await;
        let kinds: Vec<&str> = of_session
            .iter()
            .map(|e| e["event"].as_str().unwrap())
            .collect();
        assert!(
            kinds.contains(&"session.start") && kinds.contains(&"session.end"),
            "{kinds:?}"
        );
        assert!(
            of_session
                .iter()
                .all(|e| e["session_id"] == session.as_str())
        );
        let on_node = all_pages(&carol, "type=session.start&node=local1", 100).await;
        assert_eq!(on_node.len(), 1, "{on_node:?}");
        let elsewhere = all_pages(&carol, "type=session.start&node=web9", 100).await;
        assert!(elsewhere.is_empty(), "{elsewhere:?}");
        let future = all_pages(&carol, "since=2999-01-01T00:00:00Z", 100).await;
        assert!(future.is_empty(), "{future:?}");
        let past = all_pages(&carol, "type=user.login&until=2000-01-01T00:00:00Z", 100).await;
        assert!(past.is_empty(), "{past:?}");

        // Bad filters are said, as JSON.
        for (query, needle) in [
            ("type=no.such", "no.such"),
            ("limit=0", "limit"),
            ("cursor=x", "cursor"),
            ("since=yesterday", "since"),
            ("colour=red", "unknown field"),
        ] {
            let (status, body) = carol.get(&format!("/v1/webapi/audit?{query}")).await;
            assert_eq!(status, 400, "{query}: {body}");
            assert!(
                body["error"].as_str().unwrap().contains(needle),
                "{query}: {body}"
            );
        }

        // The download is what `sallyctl audit search` prints for the same range, byte for byte.
        let by_session = format!("session={session}");
        for (query, args) in [
            ("type=user.login", vec!["--type", "user.login"]),
            (
                "type=user.login&user=alice",
                vec!["--type", "user.login", "--user", "alice"],
            ),
            (by_session.as_str(), vec!["--session", session.as_str()]),
            (
                "type=session.start&node=local1",
                vec!["--type", "session.start", "--node", "local1"],
            ),
            (
                "type=user.login&until=2999-01-01T00:00:00Z",
                vec!["--type", "user.login", "--until", "2999-01-01T00:00:00Z"],
            ),
        ] {
            let (status, ctype, download) = carol
                .get_bytes(&format!("/v1/webapi/audit/download?{query}"))
                .await;
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&download));
            assert_eq!(ctype, "application/x-ndjson");
            let mut search = vec!["audit", "search", "--limit", "10000"];
            search.extend(args);
            let printed = c.sallyctl(&search).ok().stdout;
            assert_eq!(String::from_utf8_lossy(&download), printed, "{query}");
            assert!(printed.lines().count() >= 1, "{query}");
        }
    });
}

const STAGING: &str = "kind: role\nversion: v1\nmetadata: {name: staging}\nspec:\n  allow:\n    logins: [ubuntu]\n    rules:\n      - resources: [session]\n        verbs: [list]\n";

/// The 1-based line and column where `needle` first is in `text`.
fn place_of(text: &str, needle: &str) -> (u64, u64) {
    let at = text.find(needle).unwrap();
    let line = text[..at].matches('\n').count() as u64 + 1;
    let column = (at - text[..at].rfind('\n').map_or(0, |i| i + 1)) as u64 + 1;
    (line, column)
}

#[test]
fn roles_are_edited_as_yaml_checked_where_wrong_and_saved_only_over_what_was_opened() {
    use reqwest::Method;
    let c = cluster_with(&[("alice", "access", "root"), ("ed", "editor", "")]);
    rt().block_on(async {
        let ed = signed_in(&c, "ed").await;
        let (status, list) = ed.get("/v1/webapi/roles").await;
        assert_eq!(status, 200, "{list}");
        let names: Vec<&str> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec!["access", "auditor", "editor"]);
        let (status, access) = ed.get("/v1/webapi/roles/access").await;
        assert_eq!(status, 200, "{access}");
        assert!(
            access["yaml"].as_str().unwrap().contains("internal.logins"),
            "{access}"
        );
        assert_eq!(access["revision"].as_str().unwrap().len(), 64);

        // Checked where wrong: the parser's refusal and validate's, each at its value.
        let craete = STAGING.replace("verbs: [list]", "verbs: [craete]");
        let v2 = STAGING.replace("version: v1", "version: v2");
        let pattern = STAGING.replace("[ubuntu]", "[ubuntu, 'ub*']");
        for (text, needle, says) in [
            (&craete, "craete", "craete"),
            (&v2, "v2", "version"),
            (&pattern, "'ub*'", "not patterns"),
        ] {
            let (status, body) = ed
                .send(
                    Method::POST,
                    "/v1/webapi/roles/validate",
                    serde_json::json!({"yaml": text}),
                )
                .await;
            assert_eq!(status, 200, "{body}");
            let errors = body["errors"].as_array().unwrap();
            assert_eq!(errors.len(), 1, "{body}");
            let (line, column) = place_of(text, needle);
            assert_eq!(errors[0]["line"], line, "{needle}: {body}");
            assert_eq!(errors[0]["column"], column, "{needle}: {body}");
            assert!(
                errors[0]["message"].as_str().unwrap().contains(says),
                "{body}"
            );
            // Saving it is refused the same way, and nothing is saved.
            let (status, body) = ed
                .send(
                    Method::PUT,
                    "/v1/webapi/roles/staging",
                    serde_json::json!({"yaml": text}),
                )
                .await;
            assert_eq!(status, 400, "{body}");
            assert_eq!(body["errors"][0]["line"], line, "{body}");
        }
        assert_eq!(ed.get("/v1/webapi/roles/staging").await.0, 404);
        let (status, body) = ed
            .send(
                Method::POST,
                "/v1/webapi/roles/validate",
                serde_json::json!({"yaml": STAGING}),
            )
            .await;
        assert_eq!((status, body), (200, serde_json::json!({"errors": []})));

        // Created, then saved over the revision it was opened at.
        let (status, made) = ed
            .send(
                Method::PUT,
                "/v1/webapi/roles/staging",
                serde_json::json!({"yaml": STAGING}),
            )
            .await;
        assert_eq!(status, 200, "{made}");
        assert_eq!(made["created"], true);
        // Creating it again is a conflict, not an overwrite.
        let (status, body) = ed
            .send(
                Method::PUT,
                "/v1/webapi/roles/staging",
                serde_json::json!({"yaml": STAGING}),
            )
            .await;
        assert_eq!(status, 409, "{body}");
        let (_, opened) = ed.get("/v1/webapi/roles/staging").await;
        assert_eq!(opened["revision"], made["revision"]);
        let first_edit = STAGING.replace("[ubuntu]", "[ubuntu, deploy]");
        let (status, saved) = ed
            .send(
                Method::PUT,
                "/v1/webapi/roles/staging",
                serde_json::json!({"yaml": first_edit, "revision": opened["revision"]}),
            )
            .await;
        assert_eq!(status, 200, "{saved}");
        assert_eq!(saved["created"], false);
        // A second editor who opened the same revision: 409, and the first edit stands.
        let (status, body) = ed
            .send(
                Method::PUT,
                "/v1/webapi/roles/staging",
                serde_json::json!({"yaml": STAGING.replace("[ubuntu]", "[ops]"), "revision": opened["revision"]}),
            )
            .await;
        assert_eq!(status, 409, "{body}");
        assert!(
            body["error"].as_str().unwrap().contains("changed"),
            "{body}"
        );
        let (_, now) = ed.get("/v1/webapi/roles/staging").await;
        assert!(now["yaml"].as_str().unwrap().contains("deploy"), "{now}");
        assert_eq!(now["revision"], saved["revision"]);
        let (status, body) = ed
            .send(
                Method::PUT,
                "/v1/webapi/roles/staging",
                serde_json::json!({"yaml": STAGING.replace("name: staging", "name: other")}),
            )
            .await;
        assert_eq!(status, 400, "{body}");

        // Another origin or no CSRF token: 403 before anything is read.
        for (origin, csrf) in [
            (Some("https://evil.example"), ed.csrf.clone()),
            (Some(ed.origin.as_str()), None),
            (Some(ed.origin.as_str()), Some("wrong".to_string())),
            (None, ed.csrf.clone()),
        ] {
            for (method, path) in [
                (Method::PUT, "/v1/webapi/roles/staging"),
                (Method::POST, "/v1/webapi/roles/validate"),
                (Method::DELETE, "/v1/webapi/roles/staging"),
            ] {
                let (status, body) = ed
                    .send_as(
                        method.clone(),
                        path,
                        origin,
                        csrf.as_deref(),
                        serde_json::json!({"yaml": STAGING, "revision": now["revision"]}),
                    )
                    .await;
                assert_eq!(status, 403, "{method} {path} from {origin:?}: {body}");
            }
        }
        assert_eq!(ed.get("/v1/webapi/roles/staging").await.1, now);

        // A person whose roles say nothing of roles: auth's 403, said.
        let alice = signed_in(&c, "alice").await;
        let (status, body) = alice.get("/v1/webapi/roles").await;
        assert_eq!(status, 403, "{body}");
        assert!(body["error"].as_str().unwrap().contains("role"), "{body}");
        let (status, _) = alice
            .send(
                Method::PUT,
                "/v1/webapi/roles/staging",
                serde_json::json!({"yaml": STAGING, "revision": now["revision"]}),
            )
            .await;
        assert_eq!(status, 403);
        assert_eq!(alice.send(Method::DELETE, "/v1/webapi/roles/staging", Value::Null).await.0, 403);

        // Deleted.
        let (status, body) = ed
            .send(Method::DELETE, "/v1/webapi/roles/staging", Value::Null)
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(ed.get("/v1/webapi/roles/staging").await.0, 404);
        // Every route the table lists is served (whatever it then says to a stranger).
        let stranger = Browser::new(&c);
        for route in sallyport_core::routes::WEB {
            let path = route
                .pattern
                .replace("{id}", "x")
                .replace("{name}", "x");
            let method = reqwest::Method::from_bytes(route.method.as_str().as_bytes()).unwrap();
            let resp = stranger
                .request(method, &path, None)
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .await
                .unwrap();
            let status = resp.status().as_u16();
            let body = resp.text().await.unwrap_or_default();
            // The router's own 404 and 405 name themselves; anything else is the route's answer.
            assert!(
                !body.contains("no such API route") && !body.contains("does not answer"),
                "{route:?}: {status} {body}"
            );
        }
        // A route asked with a method it does not answer: a JSON 405.
        let (status, body) = ed.get("/v1/webapi/roles/validate").await;
        assert_eq!(status, 405, "{body}");
        assert!(body["error"].as_str().unwrap().contains("GET"), "{body}");
        let updates = c.events("role.update");
        assert_eq!(updates.len(), 1, "{updates:?}");
    });
}

fn find_user<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap_or_else(|| panic!("not a list: {list}"))
        .iter()
        .find(|u| u["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// The token in a sign-up link, checked to be this proxy's `/web/signup#TOKEN`.
fn signup_token(b: &Browser, answer: &Value) -> String {
    let url = answer["signup_url"].as_str().unwrap();
    let token = url
        .strip_prefix(&format!("{}/web/signup#", b.origin))
        .unwrap_or_else(|| panic!("{url}"));
    assert!(token.len() >= 32, "{url}");
    token.to_string()
}

#[test]
fn admins_add_reset_lock_and_unlock_users_and_make_join_tokens_and_no_one_else_does() {
    use reqwest::Method;
    use serde_json::json;
    let c = cluster_with(&[("alice", "access", "root"), ("ed", "editor", "")]);
    rt().block_on(async {
        let ed = signed_in(&c, "ed").await;

        // A new user: the sign-up link, once; it works with `sally signup`.
        let (status, added) = ed
            .send(
                Method::POST,
                "/v1/webapi/users",
                json!({"name": "dave", "roles": ["access"], "logins": ["root"]}),
            )
            .await;
        assert_eq!(status, 200, "{added}");
        assert_eq!(added["user"], "dave");
        assert!(added.get("token").is_none(), "{added}");
        let token = signup_token(&ed, &added);
        let (_, users) = ed.get("/v1/webapi/users").await;
        assert_eq!(find_user(&users, "dave")["status"], "pending", "{users}");
        c.signup(&token, PASSWORD);
        let (status, users) = ed.get("/v1/webapi/users").await;
        assert_eq!(status, 200, "{users}");
        let dave = find_user(&users, "dave");
        assert_eq!(dave["roles"], json!(["access"]));
        assert_eq!(dave["logins"], json!(["root"]));
        assert_eq!(dave["status"], "active");
        assert_eq!(dave["locked"], false);
        assert_eq!(find_user(&users, "ed")["type"], "local");
        let mut dave_b = signed_in(&c, "dave").await;

        // A lock: dave's web session ends; unlocked, he signs in again.
        let (status, lock) = ed
            .send(
                Method::POST,
                "/v1/webapi/locks",
                json!({"user": "dave", "message": "incident 9", "ttl": "1h"}),
            )
            .await;
        assert_eq!(status, 200, "{lock}");
        assert_eq!(lock["user"], "dave");
        assert!(lock["expires"].as_str().is_some(), "{lock}");
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while dave_b.get("/v1/webapi/web/session").await.0 != 401 {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
        .await;
        assert!(ended.is_ok(), "the locked user's web session lives on");
        let (status, _, body) = dave_b.login("dave", PASSWORD, None).await;
        assert_ne!(status, 200, "{body}");
        let (_, users) = ed.get("/v1/webapi/users").await;
        let dave = find_user(&users, "dave");
        assert_eq!(dave["locked"], true, "{users}");
        assert_eq!(dave["locks"][0]["message"], "incident 9");
        let id = lock["id"].as_str().unwrap();
        let (status, body) = ed
            .send(
                Method::DELETE,
                &format!("/v1/webapi/locks/{id}"),
                Value::Null,
            )
            .await;
        assert_eq!(status, 200, "{body}");
        let (_, users) = ed.get("/v1/webapi/users").await;
        assert_eq!(find_user(&users, "dave")["locked"], false, "{users}");
        assert_eq!(dave_b.login("dave", PASSWORD, None).await.0, 200);
        let (status, body) = ed
            .send(
                Method::POST,
                "/v1/webapi/locks",
                json!({"user": "dave", "ttl": "soon"}),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(body["error"].as_str().unwrap().starts_with("ttl"), "{body}");

        // A reset: the old password is gone, the new link signs up again.
        let (status, reset) = ed
            .send(Method::POST, "/v1/webapi/users/dave/reset", Value::Null)
            .await;
        assert_eq!(status, 200, "{reset}");
        let again = signup_token(&ed, &reset);
        assert_ne!(again, token);
        assert_ne!(Browser::new(&c).login("dave", PASSWORD, None).await.0, 200);
        c.signup(&again, "another horse battery");
        assert_eq!(
            Browser::new(&c)
                .login("dave", "another horse battery", None)
                .await
                .0,
            200
        );

        // A join token: the agent's command, once; the list shows no secret.
        let (status, made) = ed
            .send(Method::POST, "/v1/webapi/tokens", json!({"type": "node"}))
            .await;
        assert_eq!(status, 200, "{made}");
        let command = made["command"].as_str().unwrap();
        let proxy = ed.origin.strip_prefix("https://").unwrap();
        assert!(
            command.starts_with(&format!(
                "sallyport start --roles=node --proxy={proxy} --token="
            )),
            "{command}"
        );
        assert!(
            command.contains(&format!("--ca-pin={}", c.pin)),
            "{command}"
        );
        let secret = command
            .split_whitespace()
            .find_map(|w| w.strip_prefix("--token="))
            .unwrap();
        let (status, tokens) = ed.get("/v1/webapi/tokens").await;
        assert_eq!(status, 200, "{tokens}");
        assert!(
            tokens
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t["type"] == "node"),
            "{tokens}"
        );
        assert!(!tokens.to_string().contains(secret), "{tokens}");
        // The token in the command joins an agent.
        let dir = c.dir.path().join("agent-web2");
        let child = c
            .agent_command("web2", "", Some(secret), &dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let _agent = Agent::new("web2", "", dir, child);
        c.wait_online("web2");
        let (status, body) = ed
            .send(Method::POST, "/v1/webapi/tokens", json!({"type": "signup"}))
            .await;
        assert_eq!(status, 400, "{body}");

        // Cross-origin or without the CSRF token: refused, nothing made.
        for (origin, csrf) in [
            (Some("https://evil.example"), ed.csrf.clone()),
            (Some(ed.origin.as_str()), None),
        ] {
            for (path, body) in [
                (
                    "/v1/webapi/users",
                    json!({"name": "mallory", "roles": ["editor"]}),
                ),
                ("/v1/webapi/locks", json!({"user": "ed"})),
                ("/v1/webapi/tokens", json!({"type": "node"})),
                ("/v1/webapi/users/dave/reset", Value::Null),
            ] {
                let (status, answer) = ed
                    .send_as(Method::POST, path, origin, csrf.as_deref(), body)
                    .await;
                assert_eq!(status, 403, "{path} from {origin:?}: {answer}");
            }
        }
        let (_, users) = ed.get("/v1/webapi/users").await;
        assert!(!users.to_string().contains("mallory"), "{users}");
        assert_eq!(find_user(&users, "ed")["locked"], false);

        // A plain user: auth's 403 on every admin route, said.
        let alice = signed_in(&c, "alice").await;
        for path in ["/v1/webapi/users", "/v1/webapi/tokens"] {
            let (status, body) = alice.get(path).await;
            assert_eq!(status, 403, "{path}: {body}");
            assert!(!body["error"].as_str().unwrap().is_empty(), "{body}");
        }
        for (path, body) in [
            (
                "/v1/webapi/users",
                json!({"name": "mallory", "roles": ["editor"]}),
            ),
            ("/v1/webapi/locks", json!({"user": "ed"})),
            ("/v1/webapi/tokens", json!({"type": "node"})),
            ("/v1/webapi/users/dave/reset", Value::Null),
        ] {
            let (status, answer) = alice.send(Method::POST, path, body).await;
            assert_eq!(status, 403, "{path}: {answer}");
        }
        let (status, _) = alice
            .send(
                Method::DELETE,
                &format!("/v1/webapi/locks/{id}"),
                Value::Null,
            )
            .await;
        assert_eq!(status, 403);
        assert_eq!(
            Browser::new(&c)
                .login("dave", "another horse battery", None)
                .await
                .0,
            200
        );
    });
}

/// A cast is passed on as it is read, never held whole, with no whole-answer timeout: while a
/// browser that took 1 MiB of a 48 MiB recording stops for 35 s (longer than the proxy's 30 s
/// for a whole call to auth), the daemon holds far less than the file; the rest then arrives
/// whole and byte for byte.
#[test]
fn a_large_cast_read_slowly_arrives_whole() {
    let c = cluster_with(&[("alice", "access", "root")]);
    rt().block_on(async {
        let alice = signed_in(&c, "alice").await;
        let id = recorded_session(&alice, "echo big").await;
        let file = c.data_dir().join("recordings").join(format!("{id}.cast"));
        let mut cast = std::fs::read(&file).unwrap();
        let line =
            b"[1.0, \"o\", \"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\"]\n";
        while cast.len() < 48 * 1024 * 1024 {
            cast.extend_from_slice(line);
        }
        std::fs::write(&file, &cast).unwrap();

        let (_, detail) = alice.get(&format!("/v1/webapi/recordings/{id}")).await;
        assert_eq!(detail["recording_size"], cast.len() as u64);

        let before = c.rss();
        let mut resp = alice
            .request(
                reqwest::Method::GET,
                &format!("/v1/webapi/recordings/{id}/cast"),
                None,
            )
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut got = Vec::with_capacity(cast.len());
        while got.len() < 1024 * 1024 {
            got.extend_from_slice(&resp.chunk().await.unwrap().unwrap());
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        let held = c.rss().saturating_sub(before);
        assert!(
            held < 16 * 1024 * 1024,
            "the daemon grew by {held} bytes while the browser paused"
        );
        tokio::time::sleep(Duration::from_secs(32)).await;
        while let Some(chunk) = resp.chunk().await.unwrap() {
            got.extend_from_slice(&chunk);
        }
        assert_eq!(got.len(), cast.len());
        assert!(got == cast, "the cast arrived changed");
    });
}
