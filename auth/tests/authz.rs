//! Who may call what: every route of the auth API × every kind of caller → the status it gets.
//!
//! In process, with `tower::ServiceExt::oneshot` on the real `api::router`, over a real backend
//! (SQLite in a temporary directory) and real certificates issued by the cluster's own CAs, set
//! on each request as `core::https` sets them after the handshake (`PeerCertificates`,
//! `RemoteAddr`). Nothing of ours is mocked: callers are resolved, locks checked and roles
//! evaluated exactly as in production.
//!
//! The table is checked against `sallyport_core::routes::AUTH`, the list the router is built
//! from (`api::handlers`, held equal to it by `api::tests`): a route without a row here fails.
//!
//! Requests for allowed callers name things that do not exist or carry a body the route refuses
//! after authorization, so no row changes what another row sees; the status they get (404, 400,
//! 422) shows they went past authorization, the 401/403 of the others that they did not.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use rustls::pki_types::CertificateDer;
use sallyport_auth::{AuthConfig, AuthServer};
use sallyport_core::api::{AddLock, AddUser};
use sallyport_core::https::{PeerCertificates, RemoteAddr};
use sallyport_core::routes::{self, Method, Route};
use sallyport_core::x509::{Subject, TlsCa, ed25519_spki, pem_to_der};
use time::OffsetDateTime;
use tower::ServiceExt;

/// The kinds of caller, in the order of the columns below.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// No client certificate at all.
    Anonymous,
    /// A user with the preset `access` role.
    Access,
    /// A user with the preset `auditor` role.
    Auditor,
    /// A user with the preset `editor` role.
    Editor,
    /// An editor with a lock on them.
    Locked,
    /// The local admin identity (`@admin`).
    Admin,
    /// A proxy's service certificate (host TLS CA, system role `proxy`).
    Proxy,
    /// A node agent's certificate (host TLS CA, system role `node`).
    Node,
    /// The `access` user's certificate from the real CA, expired.
    Expired,
    /// A certificate for the editor from a CA with the same name as the cluster's user CA
    /// but another key.
    WrongCa,
}

use Kind::*;

const KINDS: [Kind; 10] = [
    Anonymous, Access, Auditor, Editor, Locked, Admin, Proxy, Node, Expired, WrongCa,
];

/// Who may: every caller not named is refused (401 without a verified, current certificate
/// from this cluster; 403 otherwise, a locked user included).
#[derive(Clone, Copy)]
enum Who {
    /// Anyone, certificate or not.
    Anyone,
    /// Any caller with a verified certificate whose user is not locked.
    Verified,
    /// These kinds only.
    Only(&'static [Kind]),
}

const PROXY: Who = Who::Only(&[Proxy]);
const ADMINS: Who = Who::Only(&[Editor, Admin]);
const USERS: Who = Who::Only(&[Access, Auditor, Editor, Admin]);
const AUDITORS: Who = Who::Only(&[Auditor, Editor, Admin]);

struct Row {
    method: Method,
    path: &'static str,
    /// The pattern `path` is an instance of, from the route table.
    pattern: &'static str,
    body: Option<&'static str>,
    who: Who,
    /// What an allowed caller gets.
    allowed: StatusCode,
}

const OK: StatusCode = StatusCode::OK;
const BAD: StatusCode = StatusCode::BAD_REQUEST;
const UNAUTH: StatusCode = StatusCode::UNAUTHORIZED;
const FORBIDDEN: StatusCode = StatusCode::FORBIDDEN;
const MISSING: StatusCode = StatusCode::NOT_FOUND;
const UNPARSED: StatusCode = StatusCode::UNPROCESSABLE_ENTITY;

#[rustfmt::skip]
fn rows() -> Vec<Row> {
    use Method::{Delete, Get, Post, Put};
    use routes::auth as p;
    let row = |method, path, pattern, body, who, allowed| Row { method, path, pattern, body, who, allowed };
    let signup_finish = r#"{"token":"nope","password":"pw","otp_code":null}"#;
    let login = r#"{"user":"nobody","password":"pw","otp_code":null,"ssh_public_key":"x","ttl_secs":null}"#;
    let grant = r#"{"user":"nobody","login":"root","node":"nowhere","public_key":"x","remote_addr":"192.0.2.1:1"}"#;
    let end = r#"{"exit_code":0,"bytes_in":0,"bytes_out":0,"status":"complete"}"#;
    let role = r#"{"role":{"kind":"nothing","version":"v1","metadata":{"name":"r"}}}"#;
    let connector = r#"{"connector":{"kind":"oidc","version":"v1","metadata":{"name":"corp"},"spec":{"issuer_url":"not a url","client_id":"x","redirect_url":"x"}}}"#;
    let join = r#"{"token":"nope","nodename":"web9","tls_spki":"x","ssh_host_key":"x"}"#;
    vec![
        row(Get, p::PING, p::PING, None, Who::Anyone, OK),
        row(Get, p::STATUS, p::STATUS, None, ADMINS, OK),
        row(Get, "/v1/ca/user", p::CA, None, Who::Verified, OK),
        row(Post, p::SIGNUP_START, p::SIGNUP_START, Some(r#"{"token":"nope"}"#), PROXY, UNAUTH),
        row(Post, p::SIGNUP_FINISH, p::SIGNUP_FINISH, Some(signup_finish), PROXY, UNAUTH),
        row(Post, p::LOGIN, p::LOGIN, Some(login), PROXY, BAD),
        row(Post, p::OIDC_START, p::OIDC_START, Some("{}"), PROXY, UNPARSED),
        row(Post, p::OIDC_CALLBACK, p::OIDC_CALLBACK, Some("{}"), PROXY, BAD),
        row(Post, p::OIDC_FINISH, p::OIDC_FINISH, Some("[]"), PROXY, UNPARSED),
        row(Get, p::USERS, p::USERS, None, ADMINS, OK),
        row(Post, p::USERS, p::USERS, Some(r#"{"name":"@x","roles":[],"logins":[]}"#), ADMINS, BAD),
        row(Get, "/v1/users/nobody", p::USER, None, ADMINS, MISSING),
        row(Put, "/v1/users/nobody", p::USER, Some("{}"), ADMINS, MISSING),
        row(Delete, "/v1/users/nobody", p::USER, None, ADMINS, MISSING),
        row(Post, "/v1/users/nobody/reset", p::USER_RESET, None, ADMINS, MISSING),
        row(Get, p::AUDIT, p::AUDIT, None, AUDITORS, OK),
        row(Get, p::AUDIT_VERIFY, p::AUDIT_VERIFY, None, AUDITORS, OK),
        row(Post, p::AUTH_FAILURES, p::AUTH_FAILURES, Some("[]"), PROXY, OK),
        row(Get, p::ROLES, p::ROLES, None, ADMINS, OK),
        row(Post, p::ROLES, p::ROLES, Some(role), ADMINS, BAD),
        row(Get, "/v1/roles/nobody", p::ROLE, None, ADMINS, MISSING),
        row(Delete, "/v1/roles/nobody", p::ROLE, None, ADMINS, MISSING),
        row(Post, p::ACCESS_CHECK, p::ACCESS_CHECK, Some(r#"{"user":"nobody"}"#), ADMINS, MISSING),
        row(Get, p::CONNECTORS, p::CONNECTORS, None, ADMINS, OK),
        row(Post, p::CONNECTORS, p::CONNECTORS, Some(connector), ADMINS, BAD),
        row(Delete, "/v1/connectors/nobody", p::CONNECTOR, None, ADMINS, MISSING),
        row(Get, p::TOKENS, p::TOKENS, None, ADMINS, OK),
        row(Post, p::JOIN_TOKENS, p::JOIN_TOKENS, Some(r#"{"type":"signup","ttl_secs":60}"#), ADMINS, BAD),
        row(Post, p::JOIN, p::JOIN, Some(join), PROXY, UNAUTH),
        row(Get, p::PROXIES, p::PROXIES, None, ADMINS, OK),
        row(Delete, "/v1/proxies/nobody", p::PROXY, None, ADMINS, MISSING),
        // The one route for a caller without a certificate: a proxy joining with a token.
        row(Post, p::PROXY_JOIN, p::PROXY_JOIN, Some(r#"{"token":"nope","name":"p2","tls_spki":"x","ssh_host_key":"x"}"#), Who::Anyone, UNAUTH),
        row(Post, "/v1/proxies/proxy/heartbeat", p::PROXY_HEARTBEAT, Some(r#"{"addrs":{}}"#), PROXY, OK),
        row(Post, "/v1/proxies/proxy/presence", p::PROXY_PRESENCE, Some(r#"{"nodes":["nobody"]}"#), PROXY, OK),
        row(Post, "/v1/proxies/proxy/renew", p::PROXY_RENEW, Some(r#"{"token":"","name":"proxy","tls_spki":"x","ssh_host_key":"x"}"#), PROXY, BAD),
        row(Get, p::NODES, p::NODES, None, USERS, OK),
        row(Post, p::NODES, p::NODES, Some(r#"{"name":"localhost","addr":"x"}"#), ADMINS, BAD),
        row(Delete, "/v1/nodes/nobody", p::NODE, None, ADMINS, MISSING),
        row(Post, "/v1/nodes/nobody/presence", p::NODE_PRESENCE, Some(r#"{"online":true}"#), PROXY, MISSING),
        row(Post, "/v1/nodes/nobody/proxy-host-cert", p::NODE_PROXY_HOST_CERT, Some(r#"{"public_key":"x"}"#), PROXY, MISSING),
        row(Post, "/v1/nodes/nobody/host-key", p::NODE_HOST_KEY, Some(r#"{"host_key":"x"}"#), PROXY, MISSING),
        row(Post, "/v1/nodes/nobody/renew", p::NODE_RENEW, Some(r#"{"tls_spki":"x","ssh_host_key":"x"}"#), PROXY, MISSING),
        row(Get, p::SESSIONS, p::SESSIONS, None, USERS, OK),
        row(Post, p::SESSIONS, p::SESSIONS, Some(grant), PROXY, FORBIDDEN),
        // A proxy's own connections only (its certificate names it): ids it never registered
        // change nothing.
        row(Post, p::CONNECTIONS_CLOSED, p::CONNECTIONS_CLOSED, Some(r#"{"ids":[1,2]}"#), PROXY, OK),
        row(Post, "/v1/sessions/nope/end", p::SESSION_END, Some(end), PROXY, MISSING),
        row(Post, "/v1/sessions/nope/check", p::SESSION_CHECK, None, PROXY, MISSING),
        // An update for a session auth does not know changes nothing (as before the split).
        row(Post, "/v1/sessions/nope/update", p::SESSION_UPDATE, Some(end), PROXY, OK),
        row(Post, "/v1/sessions/nope/events", p::SESSION_EVENTS, Some("[]"), PROXY, MISSING),
        row(Get, "/v1/sessions/nope/recording", p::SESSION_RECORDING, None, USERS, MISSING),
        row(Get, "/v1/sessions/nope", p::SESSION, None, USERS, MISSING),
        row(Get, p::LOCKS, p::LOCKS, None, Who::Only(&[Editor, Admin, Proxy]), OK),
        row(Post, p::LOCKS, p::LOCKS, Some(r#"{"user":"nobody"}"#), ADMINS, MISSING),
        row(Delete, "/v1/locks/nope", p::LOCK, None, ADMINS, MISSING),
        row(Get, p::KUBE_CLUSTERS, p::KUBE_CLUSTERS, None, USERS, OK),
        // People only; a cluster that does not exist is refused like one the roles do not reach.
        row(Post, p::KUBE_CERTS, p::KUBE_CERTS, Some(r#"{"cluster":"nowhere"}"#), Who::Only(&[Access, Auditor, Editor]), FORBIDDEN),
        row(Post, p::KUBE_ACCESS, p::KUBE_ACCESS, Some(r#"{"user":"nobody","cluster":"nowhere"}"#), PROXY, MISSING),
        row(Post, p::KUBE_REQUESTS, p::KUBE_REQUESTS, Some("[]"), PROXY, OK),
        // Browsers' web sessions and SSO sign-ins, for any proxy: hashes that name nothing.
        row(Post, p::WEB_SESSIONS, p::WEB_SESSIONS, Some(r#"{"id_hash":"not hex"}"#), PROXY, UNPARSED),
        row(Get, "/v1/web-sessions/0000000000000000000000000000000000000000000000000000000000000000", p::WEB_SESSION, None, PROXY, MISSING),
        row(Post, "/v1/web-sessions/0000000000000000000000000000000000000000000000000000000000000000/touch", p::WEB_SESSION_TOUCH, Some(r#"{"last_input_ms":1}"#), PROXY, MISSING),
        row(Post, "/v1/web-sessions/0000000000000000000000000000000000000000000000000000000000000000/end", p::WEB_SESSION_END, Some(r#"{"code":4401,"message":"x"}"#), PROXY, MISSING),
        row(Post, p::WEB_SESSIONS_CHECK, p::WEB_SESSIONS_CHECK, Some(r#"{"id_hashes":["00"]}"#), PROXY, BAD),
        row(Post, p::WEB_SSO, p::WEB_SSO, Some(r#"{"binding_hash":"x","client_key":"k","key_pem":"k"}"#), PROXY, BAD),
        row(Get, "/v1/web-sso/0000000000000000000000000000000000000000000000000000000000000000", p::WEB_SSO_ONE, None, PROXY, MISSING),
        row(Delete, "/v1/web-sso/0000000000000000000000000000000000000000000000000000000000000000", p::WEB_SSO_ONE, None, PROXY, MISSING),
    ]
}

/// What `kind` gets from `row`.
fn expected(row: &Row, kind: Kind) -> StatusCode {
    let may = match row.who {
        Who::Anyone => true,
        Who::Verified => !matches!(kind, Anonymous | Expired | WrongCa | Locked),
        Who::Only(kinds) => kinds.contains(&kind),
    };
    if may {
        row.allowed
    } else if matches!(kind, Anonymous | Expired | WrongCa) {
        UNAUTH
    } else {
        FORBIDDEN
    }
}

struct Fixture {
    auth: Arc<AuthServer>,
    certs: Vec<(Kind, Vec<CertificateDer<'static>>)>,
    _dir: tempfile::TempDir,
}

fn signed(ca: &TlsCa, cn: &str, orgs: &[&str], seed: u8, expired: bool) -> CertificateDer<'static> {
    let now = OffsetDateTime::now_utc();
    let (not_before, not_after) = if expired {
        (
            now - time::Duration::hours(2),
            now - time::Duration::hours(1),
        )
    } else {
        (
            now - time::Duration::minutes(1),
            now + time::Duration::hours(1),
        )
    };
    signed_for(ca, cn, orgs, seed, not_before, not_after)
}

fn signed_for(
    ca: &TlsCa,
    cn: &str,
    orgs: &[&str],
    seed: u8,
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> CertificateDer<'static> {
    let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]);
    let pem = ca
        .sign(
            &ed25519_spki(&kp.public.0),
            &Subject {
                common_name: cn.into(),
                organizations: orgs.iter().map(|o| o.to_string()).collect(),
                dns_names: vec![],
                server: false,
                not_before,
                not_after,
            },
        )
        .unwrap();
    pem_to_der(&pem).unwrap()
}

fn service(auth: &AuthServer, cn: &str, role: &str, seed: u8) -> CertificateDer<'static> {
    let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[seed; 32]);
    let pem = auth
        .issue_service_cert(
            &ed25519_spki(&kp.public.0),
            cn,
            role,
            vec![],
            Duration::from_secs(3600),
            false,
        )
        .unwrap();
    pem_to_der(&pem).unwrap()
}

async fn fixture() -> Fixture {
    sallyport_core::install_crypto_provider();
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}?mode=rwc", dir.path().join("authz.db").display());
    let auth = AuthServer::open(AuthConfig::new("authz", &url))
        .await
        .unwrap();
    for (name, role) in [
        ("alice", "access"),
        ("audrey", "auditor"),
        ("eddie", "editor"),
        ("lou", "editor"),
    ] {
        auth.add_user(
            &AddUser {
                name: name.into(),
                roles: vec![role.into()],
                logins: vec![],
            },
            "test",
        )
        .await
        .unwrap();
    }
    auth.add_lock(
        &AddLock {
            user: "lou".into(),
            message: Some("under investigation".into()),
            ttl_secs: None,
        },
        "test",
    )
    .await
    .unwrap();
    auth.register_local_proxy(&Default::default())
        .await
        .unwrap();
    let user_ca = auth.authorities.tls_user_signer();
    let forger = TlsCa::generate("user", "authz").unwrap();
    let certs = vec![
        (Anonymous, vec![]),
        (
            Access,
            vec![signed(user_ca, "alice", &["access"], 1, false)],
        ),
        (
            Auditor,
            vec![signed(user_ca, "audrey", &["auditor"], 2, false)],
        ),
        (
            Editor,
            vec![signed(user_ca, "eddie", &["editor"], 3, false)],
        ),
        (Locked, vec![signed(user_ca, "lou", &["editor"], 4, false)]),
        (Admin, vec![signed(user_ca, "@admin", &[], 5, false)]),
        (Proxy, vec![service(&auth, "proxy", "proxy", 6)]),
        (Node, vec![service(&auth, "5f0c1a2e-node", "node", 7)]),
        (
            Expired,
            vec![signed(user_ca, "alice", &["access"], 8, true)],
        ),
        (
            WrongCa,
            vec![signed(&forger, "eddie", &["editor"], 9, false)],
        ),
    ];
    Fixture {
        auth,
        certs,
        _dir: dir,
    }
}

async fn call(f: &Fixture, row: &Row, chain: &[CertificateDer<'static>]) -> (StatusCode, String) {
    let mut req = Request::builder()
        .method(row.method.as_str())
        .uri(row.path)
        .header("content-type", "application/json")
        .body(
            row.body
                .map_or_else(Body::empty, |b| Body::from(b.to_string())),
        )
        .unwrap();
    req.extensions_mut()
        .insert(PeerCertificates(Arc::new(chain.to_vec())));
    req.extensions_mut()
        .insert(RemoteAddr("192.0.2.7:40000".parse().unwrap()));
    let resp = sallyport_auth::api::router(f.auth.clone())
        .oneshot(req)
        .await
        .unwrap();
    let status = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap_or_default();
    (status, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn every_route_has_a_row() {
    let covered: BTreeSet<Route> = rows()
        .iter()
        .map(|r| Route {
            method: r.method,
            pattern: r.pattern,
        })
        .collect();
    let listed: BTreeSet<Route> = routes::AUTH.iter().copied().collect();
    let missing: Vec<_> = listed.difference(&covered).collect();
    let extra: Vec<_> = covered.difference(&listed).collect();
    assert!(missing.is_empty(), "routes without a row: {missing:?}");
    assert!(extra.is_empty(), "rows for no route: {extra:?}");
    assert_eq!(covered.len(), rows().len(), "a route has two rows");
    let served: BTreeSet<Route> = sallyport_auth::api::handlers()
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert_eq!(served, listed, "the router serves what the table lists");
}

#[tokio::test]
async fn every_caller_on_every_route() {
    let f = fixture().await;
    let mut wrong = vec![];
    for row in rows() {
        for (kind, chain) in &f.certs {
            let want = expected(&row, *kind);
            let (got, body) = call(&f, &row, chain).await;
            if got != want {
                wrong.push(format!(
                    "{} {} as {kind:?}: got {got}, want {want}: {body}",
                    row.method, row.path
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} cells differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert_eq!(KINDS.len(), f.certs.len());
}

/// A removed proxy's certificate, still within its validity, is refused at once on every proxy
/// route, with what to do; nothing else is disturbed (people keep their access).
#[tokio::test]
async fn a_removed_proxy_is_refused_at_once() {
    let f = fixture().await;
    let cert = |k: Kind| f.certs.iter().find(|(c, _)| *c == k).unwrap().1.clone();
    let locks = Row {
        method: Method::Get,
        path: routes::auth::LOCKS,
        pattern: routes::auth::LOCKS,
        body: None,
        who: PROXY,
        allowed: OK,
    };
    let (got, body) = call(&f, &locks, &cert(Proxy)).await;
    assert_eq!(got, OK, "{body}");
    f.auth.remove_proxy("proxy", "test").await.unwrap();
    let (got, body) = call(&f, &locks, &cert(Proxy)).await;
    assert_eq!(got, UNAUTH, "{body}");
    assert!(
        body.contains("proxy proxy is not registered in this cluster"),
        "{body}"
    );
    assert!(body.contains("--type=proxy"), "{body}");
    let (got, body) = call(&f, &locks, &cert(Editor)).await;
    assert_eq!(got, OK, "{body}");
    // Audited as an admin's act.
    let events = f
        .auth
        .audit_search(&Default::default())
        .await
        .unwrap()
        .records;
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "proxy.delete" && e["name"] == "proxy"),
        "{events:?}"
    );
}

/// The refusals a person reads say why.
#[tokio::test]
async fn refusals_say_why() {
    let f = fixture().await;
    let status = Row {
        method: Method::Get,
        path: routes::auth::STATUS,
        pattern: routes::auth::STATUS,
        body: None,
        who: ADMINS,
        allowed: OK,
    };
    let cert = |k: Kind| f.certs.iter().find(|(c, _)| *c == k).unwrap().1.clone();
    for (kind, needle) in [
        (Anonymous, "a client certificate is required"),
        (Expired, "the client certificate of alice expired at"),
        (
            WrongCa,
            "the client certificate of eddie is not one this cluster issued",
        ),
        (Locked, "user lou is locked: under investigation"),
        (Access, "access denied"),
        (Node, "service 5f0c1a2e-node cannot `read` on `cluster`"),
    ] {
        let (_, body) = call(&f, &status, &cert(kind)).await;
        assert!(body.contains(needle), "{kind:?}: {body}");
    }
    // A refusal says its kind on the wire, so a door tells a lock from a denial without
    // reading the text.
    for (kind, code) in [(Locked, "locked"), (Access, "denied")] {
        let (got, body) = call(&f, &status, &cert(kind)).await;
        assert_eq!(got, FORBIDDEN, "{kind:?}: {body}");
        let body: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(body["code"], code, "{kind:?}: {body}");
    }
    let (_, body) = call(&f, &status, &cert(Anonymous)).await;
    assert!(
        !body.contains("\"code\""),
        "a 401 has no refusal code: {body}"
    );
    let login = Row {
        method: Method::Post,
        path: routes::auth::SESSIONS,
        pattern: routes::auth::SESSIONS,
        body: Some("{}"),
        who: PROXY,
        allowed: OK,
    };
    let (got, body) = call(&f, &login, &cert(Editor)).await;
    assert_eq!(got, FORBIDDEN);
    assert!(body.contains("eddie is not a proxy"), "{body}");

    // A proxy speaks for itself only: another proxy's heartbeat is refused.
    let other = Row {
        method: Method::Post,
        path: "/v1/proxies/someone-else/heartbeat",
        pattern: routes::auth::PROXY_HEARTBEAT,
        body: Some(r#"{"addrs":{}}"#),
        who: PROXY,
        allowed: OK,
    };
    let (got, body) = call(&f, &other, &cert(Proxy)).await;
    assert_eq!(got, FORBIDDEN, "{body}");
    assert!(body.contains("cannot act as proxy someone-else"), "{body}");
    // ... and so is its presence refresh: no proxy keeps another's agents online.
    let other = Row {
        method: Method::Post,
        path: "/v1/proxies/someone-else/presence",
        pattern: routes::auth::PROXY_PRESENCE,
        body: Some(r#"{"nodes":[]}"#),
        who: PROXY,
        allowed: OK,
    };
    let (got, body) = call(&f, &other, &cert(Proxy)).await;
    assert_eq!(got, FORBIDDEN, "{body}");
    assert!(body.contains("cannot act as proxy someone-else"), "{body}");

    // A caller without the right is refused before the body is read: a malformed role is 403
    // for them (it was 422, the parser's answer, before the rule was checked), 422 for an editor.
    let malformed = Row {
        method: Method::Post,
        path: routes::auth::ROLES,
        pattern: routes::auth::ROLES,
        body: Some("{"),
        who: ADMINS,
        allowed: StatusCode::BAD_REQUEST,
    };
    let (got, body) = call(&f, &malformed, &cert(Access)).await;
    assert_eq!(got, FORBIDDEN, "{body}");
    assert!(body.contains("access denied"), "{body}");
    let (got, _) = call(&f, &malformed, &cert(Editor)).await;
    assert!(got.is_client_error() && got != FORBIDDEN, "{got}");
}

/// A kubeconfig certificate (the user CA, with the extension naming its cluster) opens the kube
/// door and nothing of auth's API: not even what its user's login certificate may do.
#[tokio::test]
async fn a_kubeconfig_certificate_is_no_caller() {
    let f = fixture().await;
    let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[11; 32]);
    let now = OffsetDateTime::now_utc();
    let pem = f
        .auth
        .authorities
        .tls_user_signer()
        .sign_with(
            &ed25519_spki(&kp.public.0),
            &Subject {
                common_name: "eddie".into(),
                organizations: vec!["editor".into()],
                dns_names: vec![],
                server: false,
                not_before: now - time::Duration::minutes(1),
                not_after: now + time::Duration::hours(1),
            },
            Some(&sallyport_core::kube::KubeCertExt {
                kube_cluster: "prod".into(),
                kube_users: vec![],
                kube_groups: vec![],
            }),
        )
        .unwrap();
    let chain = vec![pem_to_der(&pem).unwrap()];
    let users = rows()
        .into_iter()
        .find(|r| r.path == routes::auth::USERS && r.method == Method::Get)
        .unwrap();
    let (status, body) = call(&f, &users, &chain).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert!(
        body.contains("kubeconfig certificate is for kubectl only"),
        "{body}"
    );
}

/// Only the proxy that holds a node's tunnel renews its certificates: another proxy (or the
/// same one once the tunnel is gone) is refused, and a renewal is audited.
#[tokio::test]
async fn only_the_proxy_holding_a_nodes_tunnel_renews_it() {
    use base64::Engine;
    let f = fixture().await;
    let token = f
        .auth
        .add_join_token(
            &sallyport_core::api::AddJoinToken {
                kind: sallyport_core::api::TokenKind::Node,
                ttl_secs: 600,
            },
            "test",
        )
        .await
        .unwrap();
    let kp = russh::keys::ssh_key::private::Ed25519Keypair::from_seed(&[42; 32]);
    let spki = base64::engine::general_purpose::STANDARD.encode(ed25519_spki(&kp.public.0));
    let host = sallyport_core::sshcert::generate_ed25519()
        .unwrap()
        .public_key()
        .to_openssh()
        .unwrap();
    let joined = f
        .auth
        .join(
            &sallyport_core::api::JoinRequest {
                token: token.token,
                nodename: "web7".into(),
                labels: Default::default(),
                tls_spki: spki.clone(),
                ssh_host_key: host.clone(),
                remote_addr: None,
            },
            "192.0.2.9",
        )
        .await
        .unwrap();
    let body = serde_json::json!({"tls_spki": spki, "ssh_host_key": host}).to_string();
    let path = routes::auth::node_renew(&joined.node_id);
    let renew = Row {
        method: Method::Post,
        path: Box::leak(path.into_boxed_str()),
        pattern: routes::auth::NODE_RENEW,
        body: Some(Box::leak(body.into_boxed_str())),
        who: PROXY,
        allowed: OK,
    };
    let cert = |k: Kind| f.certs.iter().find(|(c, _)| *c == k).unwrap().1.clone();
    // No tunnel of web7 on this proxy: refused.
    let (got, body) = call(&f, &renew, &cert(Proxy)).await;
    assert_eq!(got, FORBIDDEN, "{body}");
    assert!(body.contains("holds no tunnel of node"), "{body}");
    // Its tunnel reported here: renewed, and audited.
    f.auth
        .presence(
            &joined.node_id,
            "proxy",
            &sallyport_core::api::Presence {
                online: true,
                labels: None,
            },
        )
        .await
        .unwrap();
    let (got, body) = call(&f, &renew, &cert(Proxy)).await;
    assert_eq!(got, OK, "{body}");
    let events = f
        .auth
        .audit_search(&Default::default())
        .await
        .unwrap()
        .records;
    assert!(
        events
            .iter()
            .any(|e| e["event"] == "node.renew" && e["nodename"] == "web7"),
        "{events:?}"
    );
}

/// A chain's signatures are checked once a minute for the exact bytes that verified, never for
/// anything else: on one router (one verifier), the editor's certificate with one byte of its
/// signature changed is refused before and after the genuine one is taken, every time, and
/// the certificate from another CA likewise; the genuine one keeps working in between.
#[tokio::test]
async fn only_the_exact_chain_that_verified_is_taken_without_checking_again() {
    let f = fixture().await;
    let cert = |k: Kind| f.certs.iter().find(|(c, _)| *c == k).unwrap().1.clone();
    let router = sallyport_auth::api::router(f.auth.clone());
    let status = |chain: Vec<CertificateDer<'static>>| {
        let router = router.clone();
        async move {
            let mut req = Request::builder()
                .method("GET")
                .uri(routes::auth::STATUS)
                .body(Body::empty())
                .unwrap();
            req.extensions_mut()
                .insert(PeerCertificates(Arc::new(chain)));
            req.extensions_mut()
                .insert(RemoteAddr("192.0.2.7:40000".parse().unwrap()));
            let resp = router.oneshot(req).await.unwrap();
            let code = resp.status();
            let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
                .await
                .unwrap_or_default();
            (code, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let genuine = cert(Editor);
    let mut forged = genuine.clone();
    let mut leaf = forged[0].to_vec();
    let last = leaf.len() - 1;
    leaf[last] ^= 0x01;
    forged[0] = CertificateDer::from(leaf);
    for round in 0..2 {
        let (got, body) = status(forged.clone()).await;
        assert_eq!(got, UNAUTH, "round {round}, forged: {body}");
        assert!(
            body.contains("is not one this cluster issued"),
            "round {round}: {body}"
        );
        let (got, body) = status(genuine.clone()).await;
        assert_eq!(got, OK, "round {round}, genuine: {body}");
        let (got, body) = status(cert(WrongCa)).await;
        assert_eq!(got, UNAUTH, "round {round}, another CA: {body}");
    }
    // A chain taken lately is still refused the moment its leaf expires.
    let now = OffsetDateTime::now_utc();
    let soon = now + time::Duration::seconds(2);
    let user_ca = f.auth.authorities.tls_user_signer();
    let short = vec![signed_for(
        user_ca,
        "eddie",
        &["editor"],
        3,
        now - time::Duration::minutes(1),
        soon,
    )];
    let (got, body) = status(short.clone()).await;
    assert_eq!(got, OK, "before its expiry: {body}");
    tokio::time::sleep(std::time::Duration::from_millis(3200)).await;
    let (got, body) = status(short).await;
    assert_eq!(got, UNAUTH, "after its expiry: {body}");
    assert!(body.contains("expired at"), "{body}");
}
