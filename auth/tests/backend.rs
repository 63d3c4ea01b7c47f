//! The backend suite: the same flows against embedded SQLite and against PostgreSQL
//! (`SALLYPORT_TEST_POSTGRES`, which `scripts/test` sets after starting PostgreSQL).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use russh::keys::ssh_key::{Algorithm, PrivateKey};
use sallyport_auth::users::SsoIdentity;
use sallyport_auth::{AuthConfig, AuthError, AuthServer};
use sallyport_core::api::{AddUser, LoginRequest, SignupFinish, SignupStart};

async fn suite(url: &str) {
    sallyport_core::install_crypto_provider();
    let mut cfg = AuthConfig::new("suite", url);
    cfg.second_factor = false;
    cfg.max_login_attempts = 2;
    let auth = AuthServer::open(cfg.clone()).await.unwrap();
    let pins = auth.authorities.pins().unwrap();

    let t = auth
        .add_user(
            &AddUser {
                name: "u1".into(),
                roles: vec!["access".into()],
                logins: vec!["root".into()],
            },
            "test",
        )
        .await
        .unwrap();
    assert!(matches!(
        auth.add_user(
            &AddUser {
                name: "u1".into(),
                roles: vec!["access".into()],
                logins: vec![]
            },
            "test"
        )
        .await,
        Err(AuthError::Conflict(_))
    ));
    let started = auth
        .signup_start(&SignupStart {
            token: t.token.clone(),
        })
        .await
        .unwrap();
    assert_eq!(started.user, "u1");
    assert!(started.otpauth_uri.is_none());
    auth.signup_finish(
        &SignupFinish {
            token: t.token.clone(),
            password: "password-1".into(),
            otp_code: None,
        },
        "test",
    )
    .await
    .unwrap();
    assert!(
        auth.signup_finish(
            &SignupFinish {
                token: t.token,
                password: "password-2".into(),
                otp_code: None
            },
            "test"
        )
        .await
        .is_err()
    );

    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
    let login = |password: &str| LoginRequest {
        user: "u1".into(),
        password: password.into(),
        otp_code: None,
        ssh_public_key: key.public_key().to_openssh().unwrap(),
        ttl_secs: Some(3600),
        remote_addr: None,
        web: false,
    };
    let certs = auth
        .login(&login("password-1"), "127.0.0.1:1")
        .await
        .unwrap();
    assert_eq!(certs.logins, vec!["root"]);
    assert!(auth.login(&login("nope"), "127.0.0.1:1").await.is_err());
    let locked = auth.login(&login("nope"), "127.0.0.1:1").await;
    assert!(matches!(locked, Err(AuthError::Locked(_))), "{locked:?}");
    assert!(matches!(
        auth.login(&login("password-1"), "127.0.0.1:1").await,
        Err(AuthError::Locked(_))
    ));

    sso_users_are_keyed_on_their_identity(&auth).await;
    presence_is_refreshed_in_one_request(&auth).await;
    a_nul_in_a_record_is_kept_as_a_replacement(&auth).await;

    let v = auth.audit_verify().await.unwrap();
    assert!(v.ok, "{}", v.message);
    let n = auth.audit_count().await.unwrap();
    assert!(n >= 5, "{n}");
    drop(auth);

    // A second instance on the same storage sees the same CAs, users and chain.
    let again = AuthServer::open(cfg).await.unwrap();
    assert_eq!(again.authorities.pins().unwrap(), pins);
    assert_eq!(again.list_users().await.unwrap().len(), 2);
    assert!(again.audit_verify().await.unwrap().ok);
}

/// An SSO user belongs to one (connector, issuer, sub); the unique index and the statements that
/// guard it hold on both databases.
/// A proxy's batched presence refresh keeps the nodes it reported online, never records one
/// it did not (another proxy's, a removed node's, an unknown id): those come back as unknown,
/// for the proxy to report on their own as before.
async fn presence_is_refreshed_in_one_request(auth: &AuthServer) {
    use base64::Engine;
    use sallyport_core::api::{AddJoinToken, JoinRequest, Presence, TokenKind};
    let mut ids = Vec::new();
    for name in ["batch1", "batch2", "batch3"] {
        let token = auth
            .add_join_token(
                &AddJoinToken {
                    kind: TokenKind::Node,
                    ttl_secs: 600,
                },
                "test",
            )
            .await
            .unwrap();
        let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519).unwrap();
        let spki = match key.key_data() {
            russh::keys::ssh_key::private::KeypairData::Ed25519(k) => {
                sallyport_core::x509::ed25519_spki(&k.public.0)
            }
            _ => unreachable!(),
        };
        let joined = auth
            .join(
                &JoinRequest {
                    token: token.token,
                    nodename: name.into(),
                    labels: [("team".to_string(), format!("{name}-team"))].into(),
                    tls_spki: base64::engine::general_purpose::STANDARD.encode(spki),
                    ssh_host_key: key.public_key().to_openssh().unwrap(),
                    remote_addr: None,
                },
                "192.0.2.1",
            )
            .await
            .unwrap();
        ids.push(joined.node_id);
    }
    let online = |p: bool| Presence {
        online: p,
        labels: None,
    };
    // batch1 and batch2 through this proxy, batch3 through another.
    auth.presence(&ids[0], "proxy", &online(true))
        .await
        .unwrap();
    auth.presence(&ids[1], "proxy", &online(true))
        .await
        .unwrap();
    auth.presence(&ids[2], "other", &online(true))
        .await
        .unwrap();
    let mut asked = ids.clone();
    asked.push("no-such-node".into());
    let mut unknown = auth.presence_refresh("proxy", &asked).await.unwrap();
    unknown.sort();
    let mut want = vec![ids[2].clone(), "no-such-node".to_string()];
    want.sort();
    assert_eq!(unknown, want);
    let listed = |name: &str, nodes: &[sallyport_core::api::NodeInfo]| {
        nodes.iter().find(|n| n.hostname == name).unwrap().online
    };
    let nodes = auth.list_nodes().await.unwrap();
    assert!(listed("batch1", &nodes) && listed("batch2", &nodes));
    // The listing (one JSON document from the database) keeps labels, kinds and the order.
    let batch: Vec<&sallyport_core::api::NodeInfo> = nodes
        .iter()
        .filter(|n| n.hostname.starts_with("batch"))
        .collect();
    let names: Vec<&str> = batch.iter().map(|n| n.hostname.as_str()).collect();
    assert_eq!(names, ["batch1", "batch2", "batch3"]);
    assert_eq!(
        batch[1].labels.get("team").map(String::as_str),
        Some("batch2-team")
    );
    assert_eq!(batch[1].kind, sallyport_core::api::NodeKind::Agent);
    assert_eq!(batch[1].id, ids[1]);
    let mut sorted: Vec<&str> = nodes.iter().map(|n| n.hostname.as_str()).collect();
    sorted.sort();
    assert_eq!(
        sorted,
        nodes
            .iter()
            .map(|n| n.hostname.as_str())
            .collect::<Vec<_>>()
    );
    // batch2's tunnel ended here: a refresh does not bring it back.
    auth.presence(&ids[1], "proxy", &online(false))
        .await
        .unwrap();
    auth.remove_node("batch1", "test").await.unwrap();
    let unknown = auth.presence_refresh("proxy", &ids[..2]).await.unwrap();
    assert_eq!(unknown.len(), 2, "{unknown:?}");
    assert!(auth.find_node("batch1").await.unwrap().is_none());
    // Too many at once is a clear refusal.
    let many = vec![ids[0].clone(); sallyport_core::api::MAX_PRESENCE_REFRESH + 1];
    assert!(matches!(
        auth.presence_refresh("proxy", &many).await,
        Err(AuthError::BadRequest(_))
    ));
}

async fn sso_users_are_keyed_on_their_identity(auth: &AuthServer) {
    let id = |connector, subject| SsoIdentity {
        connector,
        issuer: "https://idp.example.com",
        subject,
    };
    let roles = vec!["access".to_string()];
    let traits = Default::default();
    let first = auth
        .upsert_sso_user("a@x.io", &id("corp", "s1"), &roles, &traits)
        .await
        .unwrap();
    assert!(!first.adopted);
    // The same identity again refreshes the same user.
    auth.upsert_sso_user("a@x.io", &id("corp", "s1"), &roles, &traits)
        .await
        .unwrap();
    for (who, name, needle) in [
        (
            id("corp", "s2"),
            "a@x.io",
            "already linked to another identity",
        ),
        (
            id("corp2", "s1"),
            "a@x.io",
            "already linked to another identity",
        ),
        (
            id("corp", "s1"),
            "b@x.io",
            "the provider now names you b@x.io",
        ),
        (id("corp", "s3"), "u1", "a local user named u1 exists"),
    ] {
        let e = auth
            .upsert_sso_user(name, &who, &roles, &traits)
            .await
            .err()
            .unwrap_or_else(|| panic!("{who:?} as {name}"));
        assert!(
            matches!(&e, AuthError::Conflict(m) if m.contains(needle)),
            "{who:?} as {name}: {e}"
        );
    }
    assert!(auth.get_user("b@x.io").await.unwrap().is_none());

    // An SSO user from before identities were stored is linked to the first identity that
    // signs in as it, and held by that one from then on.
    sqlx::query(
        "INSERT INTO users (name, user_type, roles, traits, created) VALUES ('old@x.io', 'sso', '[\"access\"]', '{}', 0)",
    )
    .execute(&auth.backend.pool)
    .await
    .unwrap();
    let linked = auth
        .upsert_sso_user("old@x.io", &id("corp", "s9"), &roles, &traits)
        .await
        .unwrap();
    assert!(linked.adopted);
    let e = auth
        .upsert_sso_user("old@x.io", &id("corp2", "s9"), &roles, &traits)
        .await
        .err()
        .unwrap();
    assert!(e.to_string().contains("already linked"), "{e}");
    auth.remove_user("old@x.io", "test").await.unwrap();

    // One that last signed in through a connector (its audit says which) is linked only
    // through that connector: another connector presenting its name does not take it over.
    sqlx::query(
        "INSERT INTO users (name, user_type, roles, traits, created) VALUES ('legacy@x.io', 'sso', '[\"access\"]', '{}', 0)",
    )
    .execute(&auth.backend.pool)
    .await
    .unwrap();
    let login = |connector: &str, success: bool| {
        sallyport_core::audit::Event::new(
            sallyport_core::audit::EventType::UserLogin,
            Some("legacy@x.io"),
        )
        .with("success", success)
        .with("method", "oidc")
        .with("connector", connector.to_string())
    };
    auth.emit(login("corp2", true)).await.unwrap();
    // A failed attempt through another connector later on changes nothing.
    auth.emit(login("corp", false)).await.unwrap();
    // Even behind more failed attempts than one page of the (bounded, paged) audit read.
    for _ in 0..120 {
        auth.emit(login("corp", false)).await.unwrap();
    }
    let e = auth
        .upsert_sso_user("legacy@x.io", &id("corp", "s10"), &roles, &traits)
        .await
        .err()
        .unwrap();
    assert_eq!(
        e.to_string(),
        "user legacy@x.io signs in through connector corp2, not corp; ask an admin to remove user legacy@x.io (`sallyctl users rm legacy@x.io`) if connector corp should have it"
    );
    let linked = auth
        .upsert_sso_user("legacy@x.io", &id("corp2", "s10"), &roles, &traits)
        .await
        .unwrap();
    assert!(linked.adopted);
    auth.remove_user("legacy@x.io", "test").await.unwrap();

    legacy_event_names(auth).await;
}

/// A record written before the catalogue renamed its event keeps its old name (the chain hashes
/// it), so a search under today's name or the former one finds it beside new records.
/// A NUL someone sent (in an exec's command, a path, a name typed at a login) is audited on
/// both databases, as U+FFFD: PostgreSQL refuses U+0000 in `text` and `jsonb`, so the record,
/// and every search reading it, would otherwise fail.
async fn a_nul_in_a_record_is_kept_as_a_replacement(auth: &AuthServer) {
    use sallyport_core::audit::{Event, EventType};
    auth.emit(
        Event::new(EventType::Exec, Some("mal\0lory"))
            .with("session_id", "s-nul")
            .with("command", "true\0; rm -rf /")
            .with("argv", serde_json::json!(["a\0b", {"k\0": "v\0"}])),
    )
    .await
    .unwrap();
    let found = auth
        .audit_search(&sallyport_core::api::AuditQuery {
            session: Some("s-nul".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(found.records.len(), 1, "{:?}", found.records);
    let r = &found.records[0];
    assert_eq!(r["command"], "true\u{fffd}; rm -rf /");
    assert_eq!(r["user"], "mal\u{fffd}lory");
    assert_eq!(
        r["argv"],
        serde_json::json!(["a\u{fffd}b", {"k\u{fffd}": "v\u{fffd}"}])
    );
    assert!(auth.audit_verify().await.unwrap().ok);
}

async fn legacy_event_names(auth: &AuthServer) {
    use sallyport_core::audit::{self, Event, EventType};
    // Appended as auth wrote it then: the same seal, the name of the time.
    let head: String =
        sqlx::query_scalar("SELECT value FROM cluster_state WHERE key = 'audit_head'")
            .fetch_one(&auth.backend.pool)
            .await
            .unwrap();
    let (seq, prev) = head.split_once(':').unwrap();
    let seq = seq.parse::<i64>().unwrap() + 1;
    let event = Event::new(EventType::LockDelete, Some("old-admin")).with("lock_id", "l1");
    let (mut record, _) = audit::seal(&event, "suite", seq, prev, time::OffsetDateTime::now_utc());
    record["event"] = "lock.deleted".into();
    let hash = audit::chain_hash(record.as_object().unwrap());
    record["hash"] = hash.clone().into();
    sqlx::query("INSERT INTO audit_events (seq, time, event_type, user_name, record, hash) VALUES ($1, $2, $3, $4, $5, $6)")
        .bind(seq)
        .bind(sallyport_core::unix_now())
        .bind("lock.deleted")
        .bind("old-admin")
        .bind(record.to_string())
        .bind(&hash)
        .execute(&auth.backend.pool)
        .await
        .unwrap();
    sqlx::query("UPDATE cluster_state SET value = $1 WHERE key = 'audit_head'")
        .bind(format!("{seq}:{hash}"))
        .execute(&auth.backend.pool)
        .await
        .unwrap();
    auth.emit(Event::new(EventType::LockDelete, Some("admin")).with("lock_id", "l2"))
        .await
        .unwrap();
    let search = |name: &str| sallyport_core::api::AuditQuery {
        event_type: Some(name.into()),
        ..Default::default()
    };
    for name in ["lock.delete", "lock.deleted"] {
        let found = auth.audit_search(&search(name)).await.unwrap();
        let got: Vec<_> = found
            .records
            .iter()
            .map(|r| (r["event"].as_str().unwrap(), r["lock_id"].as_str().unwrap()))
            .collect();
        assert_eq!(
            got,
            [("lock.deleted", "l1"), ("lock.delete", "l2")],
            "{name}"
        );
    }
    let e = auth
        .audit_search(&search("lock.removed"))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&e, AuthError::BadRequest(m) if m.starts_with("\"lock.removed\" is not an audit event type; the types are: user.create, ")),
        "{e}"
    );

    // The web API's filters and paging: node, session, until; back with `before`, forward with
    // `after` (oldest first either way).
    for i in 0..5 {
        auth.emit(
            Event::new(EventType::SessionStart, Some("pager"))
                .with("session_id", format!("s{i}"))
                .with("node", if i % 2 == 0 { "even" } else { "odd" }),
        )
        .await
        .unwrap();
    }
    let q = |f: &dyn Fn(&mut sallyport_core::api::AuditQuery)| {
        let mut q = sallyport_core::api::AuditQuery {
            user: Some("pager".into()),
            ..Default::default()
        };
        f(&mut q);
        q
    };
    let sessions = |found: sallyport_auth::audit_log::AuditSearch| -> Vec<String> {
        found
            .records
            .iter()
            .map(|r| r["session_id"].as_str().unwrap().to_string())
            .collect()
    };
    let all = auth.audit_search(&q(&|_| {})).await.unwrap();
    let seqs: Vec<i64> = all
        .records
        .iter()
        .map(|r| r["seq"].as_i64().unwrap())
        .collect();
    assert_eq!(seqs.len(), 5);
    let (s1, s3) = (seqs[1], seqs[3]);
    assert_eq!(sessions(all), ["s0", "s1", "s2", "s3", "s4"]);
    for (f, want) in [
        (
            Box::new(|q: &mut sallyport_core::api::AuditQuery| q.node = Some("even".into()))
                as Box<dyn Fn(&mut sallyport_core::api::AuditQuery)>,
            vec!["s0", "s2", "s4"],
        ),
        (Box::new(|q| q.session = Some("s3".into())), vec!["s3"]),
        // The newest two below s3's seq, oldest first.
        (
            Box::new(move |q| {
                q.before = Some(s3);
                q.limit = Some(2);
            }),
            vec!["s1", "s2"],
        ),
        // The oldest two above s1's seq.
        (
            Box::new(move |q| {
                q.after = Some(s1);
                q.limit = Some(2);
            }),
            vec!["s2", "s3"],
        ),
        // From the very start (`after` 0, how a download begins): the oldest two, not the
        // newest.
        (
            Box::new(|q| {
                q.after = Some(0);
                q.limit = Some(2);
            }),
            vec!["s0", "s1"],
        ),
        (Box::new(|q| q.until = Some(1)), vec![]),
        (
            Box::new(|q| q.until = Some(sallyport_core::unix_now() + 60)),
            vec!["s0", "s1", "s2", "s3", "s4"],
        ),
    ] {
        assert_eq!(sessions(auth.audit_search(&q(&*f)).await.unwrap()), want);
    }

    // A role saved over the revision it was read at; a stale revision is a conflict.
    let role = auth.get_role("auditor").await.unwrap().unwrap();
    let read = role.revision();
    let mut edited = role.clone();
    edited.metadata.description = Some("edited".into());
    auth.replace_role(&edited, &read, "test").await.unwrap();
    let mut again = role.clone();
    again.metadata.description = Some("stale".into());
    assert!(matches!(
        auth.replace_role(&again, &read, "test").await,
        Err(AuthError::Conflict(m)) if m.contains("changed")
    ));
    let now = auth.get_role("auditor").await.unwrap().unwrap();
    assert_eq!(now.metadata.description.as_deref(), Some("edited"));
    assert_eq!(now.revision(), edited.revision());

    assert!(auth.audit_verify().await.unwrap().ok);
}

#[tokio::test]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    suite(&format!(
        "sqlite:{}?mode=rwc",
        dir.path().join("s.db").display()
    ))
    .await;
}

#[tokio::test]
async fn postgres() {
    let db = common::PgDatabase::create("sp_backend");
    suite(&db.url).await;
}
