//! Single sign-on with OpenID Connect against a real provider: the npm package `oidc-provider`
//! (tests/oidc/provider.mjs) on loopback, with `tests/oidc/browser.py` doing the browser's part
//! (its login form, consent, the redirects). The provider runs with the library's defaults, as
//! real providers do (claims such as `email` and `groups` only at UserInfo); the variant with
//! claims in the ID token and no UserInfo comes after. The same fixture's "hostile" issuer speaks
//! the same protocol but signs ID tokens wrong on purpose, one defect at a time: each must be
//! refused with a clear message and nothing issued.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::oidc::*;
use sallyport_tests::*;

/// `sally login --auth=NAME --browser=none`, with browser.py signing in as `who`.
/// Returns sally's result and what the browser visited.
fn sso_login(c: &Cluster, home: &Path, connector: &str, who: &str) -> (Run, String) {
    let mut sally = Command::new(bin("sally"))
        .env("SALLY_HOME", home)
        .env("HOME", home)
        .env("SALLY_LOGIN_TIMEOUT", "30")
        .args(["login", "--proxy", &c.proxy, "--browser=none"])
        .args(if connector.is_empty() {
            vec![]
        } else {
            vec!["--auth", connector]
        })
        .args(["--ca-pin", &c.pin])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(sally.stdout.take().unwrap());
    let mut url = String::new();
    out.read_line(&mut url).unwrap();
    let url = url.trim().to_string();
    let visited = if url.starts_with("http") {
        let b = run(
            Command::new("python3")
                .arg(oidc_dir().join("browser.py"))
                .arg(&url)
                .arg(who),
            "",
        );
        b.stderr
    } else {
        String::new()
    };
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let o = sally.wait_with_output().unwrap();
    (
        Run {
            code: o.status.code().unwrap_or(-1),
            stdout: format!("{url}\n{rest}"),
            stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        },
        visited,
    )
}

#[test]
fn sso_login_through_a_real_provider_maps_claims_to_roles() {
    let c = Cluster::start();
    roles_file(&c);
    let p = provider(&c);
    connector(&c, "corp", &p.issuer);
    // The secret is never shown back.
    for format in ["yaml", "json", "text"] {
        let shown = c
            .sallyctl(&["get", "connectors", "--format", format])
            .ok()
            .stdout;
        assert!(shown.contains("corp"), "{shown}");
        assert!(!shown.contains("test-client-secret"), "{shown}");
    }
    c.wait_online("local1");
    let home = c.dir.path().join("home-sso");
    let (r, visited) = sso_login(&c, &home, "corp", "alice");
    let r = r.ok();
    assert!(
        visited.contains("/interaction/"),
        "the provider's own login form was used: {visited}"
    );
    let status: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["status", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    assert_eq!(status["user"], "alice@example.com", "{r:?}");
    let roles: Vec<&str> = status["roles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(roles, vec!["sso-ops", "db-readers"]);
    // Traits from claims reach the roles: email.local(external.email) is a login.
    let logins = status["logins"].to_string();
    assert!(
        logins.contains("root") && logins.contains("alice"),
        "{logins}"
    );
    // The certificates work.
    assert_eq!(
        c.sally(&home, &["ssh", "root@local1", "echo via-sso"], "")
            .ok()
            .stdout,
        "via-sso\n"
    );
    // An sso user, visible to admins; audited with the method, connector and claims.
    let users = c.sallyctl(&["users", "ls"]).ok().stdout;
    assert!(
        users
            .lines()
            .any(|l| l.contains("alice@example.com") && l.contains("sso")),
        "{users}"
    );
    let logins: Vec<serde_json::Value> = c
        .sallyctl(&["audit", "search", "--type", "user.login"])
        .ok()
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let ok = logins
        .iter()
        .find(|e| e["method"] == "oidc" && e["success"] == true)
        .expect("an oidc login event");
    assert_eq!(ok["connector"], "corp");
    assert!(ok["claims"].to_string().contains("admins"), "{ok}");

    // The provider's callback can be used once only.
    let callback = visited
        .lines()
        .filter_map(|l| l.strip_prefix("visit "))
        .find(|u| u.contains("/v1/webapi/oidc/callback"))
        .expect("the browser passed the proxy's callback")
        .to_string();
    let replay = run(Command::new("curl").args(["-sk", &callback]), "");
    assert!(replay.stdout.contains("already used"), "{replay:?}");
    let unknown = run(
        Command::new("curl").args([
            "-sk",
            &format!(
                "https://{}/v1/webapi/oidc/callback?code=x&state=forged",
                c.proxy
            ),
        ]),
        "",
    );
    assert!(unknown.stdout.contains("unknown, expired"), "{unknown:?}");

    // Claims that map to no role: refused, saying so, and nothing issued.
    let home_bob = c.dir.path().join("home-bob");
    let (r, _) = sso_login(&c, &home_bob, "corp", "bob");
    let r = r.fails_with("map to no Sallyport role");
    assert!(!home_bob.join("profile.json").exists(), "{r:?}");

    // Connectors are removed with `rm oidc/NAME`.
    c.sallyctl(&["rm", "oidc/corp"]).ok();
    let (r, _) = sso_login(&c, &c.dir.path().join("home-gone"), "corp", "alice");
    r.fails_with("no SSO connector named corp");
    drop(p);
}

#[test]
fn bad_id_tokens_and_a_provider_that_is_down_are_refused() {
    let c = Cluster::start();
    roles_file(&c);
    let p = provider(&c);
    connector(&c, "evil", &p.hostile);
    let scenario = |name: &str| {
        run(
            Command::new("curl").args([
                "-s",
                "-X",
                "POST",
                &format!("{}/scenario/{name}", p.hostile),
            ]),
            "",
        )
        .ok();
    };
    // The hostile issuer itself works when it signs correctly; with one connector and no local
    // users, `--auth` may be left out.
    scenario("ok");
    let (r, _) = sso_login(&c, &c.dir.path().join("home-ok"), "", "alice");
    r.ok();
    // A key rotation: the new kid is not in the cached JWKS, which is fetched again.
    scenario("rotated");
    let (r, _) = sso_login(&c, &c.dir.path().join("home-rotated"), "evil", "alice");
    r.ok();
    for (name, message) in [
        ("wrong-aud", "another client (audience)"),
        ("expired", "has expired"),
        ("bad-signature", "signature is not valid"),
        ("wrong-nonce", "nonce does not match"),
        ("wrong-issuer", "another issuer"),
        ("alg-none", "ID token"),
        (
            "wrong-azp",
            "issued to another client (azp \"someone-else\")",
        ),
        (
            "several-aud-no-azp",
            "several audiences but no authorized party (azp)",
        ),
        (
            "userinfo-other-sub",
            "UserInfo is about another subject (mallory) than the ID token (alice)",
        ),
    ] {
        scenario(name);
        let home = c.dir.path().join(format!("home-{name}"));
        let (r, _) = sso_login(&c, &home, "evil", "alice");
        let r = r.fails_with(message);
        assert!(
            !home.join("profile.json").exists(),
            "{name}: nothing is issued: {r:?}"
        );
    }
    let failures = c
        .sallyctl(&["audit", "search", "--type", "user.login"])
        .ok()
        .stdout;
    assert!(failures.contains("nonce does not match"), "{failures}");
    // A provider that is down.
    connector(&c, "corp", &p.issuer);
    drop(p);
    let (r, _) = sso_login(&c, &c.dir.path().join("home-down"), "corp", "alice");
    r.fails_with("cannot be reached");
}

/// The other kind of provider: claims in the ID token itself and no UserInfo endpoint.
#[test]
fn claims_in_the_id_token_without_userinfo_are_read_too() {
    let c = Cluster::start();
    roles_file(&c);
    let p = provider_with(&c, &[("CLAIMS_IN_ID_TOKEN", "1")]);
    let discovery = run(
        Command::new("curl").args([
            "-s",
            &format!("{}/.well-known/openid-configuration", p.issuer),
        ]),
        "",
    )
    .ok()
    .stdout;
    assert!(!discovery.contains("userinfo_endpoint"), "{discovery}");
    connector(&c, "corp", &p.issuer);
    let home = c.dir.path().join("home-sso");
    sso_login(&c, &home, "corp", "alice").0.ok();
    let status: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["status", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    assert_eq!(status["user"], "alice@example.com");
    assert_eq!(
        status["roles"],
        serde_json::json!(["sso-ops", "db-readers"])
    );
}

fn sso_users(c: &Cluster) -> String {
    c.sallyctl(&["users", "ls"]).ok().stdout
}

/// SSO users are named by an address the provider vouches for and keyed on (connector, issuer,
/// `sub`): another account, connector or provider that presents the same address, or the same
/// person under a new address, does not become an existing user.
#[test]
fn sso_users_are_keyed_on_the_identity_the_provider_vouches_for() {
    let c = Cluster::start();
    roles_file(&c);
    let p = provider(&c);
    connector(&c, "corp", &p.issuer);
    let home = |n: &str| c.dir.path().join(format!("home-{n}"));
    sso_login(&c, &home("alice"), "corp", "alice").0.ok();
    assert!(sso_users(&c).contains("alice@example.com"));

    // An address the provider has not verified names no one; no user is written.
    let (r, _) = sso_login(&c, &home("carol"), "corp", "carol");
    r.fails_with(
        "your identity provider has not verified the email address \"carol@example.com\" (email_verified is not true)",
    );
    assert!(!home("carol").join("profile.json").exists());
    assert!(!sso_users(&c).contains("carol"), "{}", sso_users(&c));

    // Another account at the same provider with alice's address.
    let refused = "user alice@example.com is already linked to another identity; ask an admin";
    let (r, _) = sso_login(&c, &home("mallory"), "corp", "mallory");
    r.fails_with(refused);
    assert!(!home("mallory").join("profile.json").exists());
    // A second connector to the same provider, and a connector to another provider, each
    // presenting alice's address (the other provider even with the same `sub`).
    connector(&c, "corp2", &p.issuer);
    let (r, _) = sso_login(&c, &home("corp2"), "corp2", "alice");
    r.fails_with(refused);
    connector(&c, "other", &p.hostile);
    let (r, _) = sso_login(&c, &home("other"), "other", "alice");
    r.fails_with(refused);
    for h in ["corp2", "other"] {
        assert!(!home(h).join("profile.json").exists(), "{h}");
    }
    // alice herself still signs in, as herself.
    sso_login(&c, &home("alice-again"), "corp", "alice").0.ok();

    // alice's address changes at the provider: the same identity under a new name is refused
    // (her locks, sessions and recordings are under the old name) until an admin removes the
    // old user.
    p.set_user(
        "alice",
        r#"{"email": "alice.smith@example.com", "groups": ["admins"]}"#,
    );
    let (r, _) = sso_login(&c, &home("renamed"), "corp", "alice");
    r.fails_with("your identity at connector corp belongs to user alice@example.com, but the provider now names you alice.smith@example.com; ask an admin to remove user alice@example.com");
    assert!(!sso_users(&c).contains("alice.smith"), "{}", sso_users(&c));
    c.sallyctl(&["users", "rm", "alice@example.com"]).ok();
    sso_login(&c, &home("renamed-ok"), "corp", "alice").0.ok();
    let users = sso_users(&c);
    assert!(users.contains("alice.smith@example.com"), "{users}");
    assert!(
        !users.lines().any(|l| l.contains("alice@example.com")),
        "{users}"
    );

    // Every refusal is audited with its reason.
    let failures = c
        .sallyctl(&["audit", "search", "--type", "user.login"])
        .ok()
        .stdout;
    for needle in ["not verified", "already linked", "now names you"] {
        assert!(failures.contains(needle), "{needle}: {failures}");
    }
}

/// Starts an SSO login as `sally login` does (through the proxy); returns the HTTP status and
/// the state of the provider URL it answered, or the error it answered.
fn start_login(c: &Cluster) -> (u16, String) {
    let body = serde_json::json!({
        "connector": "corp",
        "client_redirect_url": "http://127.0.0.1:9/cb",
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJiJzgCeQmvH/xHCTAp5H4/vSEDIXhl0bEkVWYbkXg9w",
        "client_key": "0123456789abcdef0123456789abcdef",
    });
    let r = run(
        Command::new("curl").args([
            "-sk",
            "-w",
            "\n%{http_code}",
            "-H",
            "content-type: application/json",
            "--data-binary",
            &body.to_string(),
            &format!("https://{}/v1/webapi/oidc/login/start", c.proxy),
        ]),
        "",
    )
    .ok();
    let (answer, status) = r.stdout.rsplit_once('\n').unwrap();
    let v: serde_json::Value = serde_json::from_str(answer).unwrap();
    let said = match v["auth_url"].as_str() {
        Some(u) => u
            .split(['?', '&'])
            .find_map(|kv| kv.strip_prefix("state="))
            .expect("a state in the provider URL")
            .to_string(),
        None => v["error"].as_str().unwrap_or(answer).to_string(),
    };
    (status.parse().unwrap(), said)
}

/// Calls the proxy's SSO callback with `query`; returns the status and where it sends the
/// browser.
fn call_back(c: &Cluster, query: &str) -> (u16, String) {
    let r = run(
        Command::new("curl").args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{redirect_url}",
            &format!("https://{}/v1/webapi/oidc/callback?{query}", c.proxy),
        ]),
        "",
    )
    .ok();
    let (status, location) = r.stdout.split_once(' ').unwrap();
    (status.parse().unwrap(), location.to_string())
}

/// Anyone can start a login and come back with its (valid) state and an error or a made-up
/// code: those failures name nobody, so they are counted like forged states (one record at
/// once and one when the minute closes, per address and reason), not one record each; and the
/// logins waiting at the provider are bounded per address, so starts cannot grow the table.
#[test]
fn started_logins_called_back_with_errors_are_counted_and_bounded() {
    let c = Cluster::start_with(Options {
        // The door's own throttles out of the way: every request reaches auth.
        proxy_service: [
            "max_unauthenticated_connections: 1024",
            "max_unauthenticated_per_address: 1024",
            "max_connection_rate_per_address: 1000",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    });
    roles_file(&c);
    let p = provider(&c);
    connector(&c, "corp", &p.issuer);
    let records = || c.sallyctl(&["audit", "search"]).ok().stdout.lines().count();
    let before = records();
    for i in 0..100 {
        let (status, state) = start_login(&c);
        assert_eq!(status, 200, "{i}: {state}");
        let (status, location) = call_back(
            &c,
            &format!("state={state}&error=access_denied&error_description=no-{i}"),
        );
        assert_eq!(status, 302);
        assert!(
            location.starts_with("http://127.0.0.1:9/cb?error=the+identity+provider+refused"),
            "{location}"
        );
    }
    // A made-up code costs one exchange at the provider, which refuses it.
    for i in 0..10 {
        let (_, state) = start_login(&c);
        let (status, location) = call_back(&c, &format!("state={state}&code=made-up-{i}"));
        assert_eq!(status, 302);
        assert!(
            location.contains("error=the+provider+refused+the+code+exchange"),
            "{location}"
        );
    }
    // One record at once per reason.
    assert!(
        records() - before <= 2,
        "{} new records",
        records() - before
    );
    let failed = |reason: &str| -> Vec<serde_json::Value> {
        c.events("user.login")
            .into_iter()
            .filter(|e| e["method"] == "oidc" && e["success"] == false && e["reason"] == reason)
            .collect()
    };
    let counts = |reason: &str| -> Vec<u64> {
        failed(reason)
            .iter()
            .map(|e| e["count"].as_u64().unwrap())
            .collect()
    };
    let refused = "the identity provider answered with an error";
    let exchange = "the provider refused the code exchange";
    assert!(
        eventually(Duration::from_secs(100), || counts(refused) == [1, 99]
            && counts(exchange) == [1, 9]),
        "{:?} {:?}",
        failed(refused),
        failed(exchange)
    );
    let last = failed(refused).pop().unwrap();
    assert_eq!(last["connector"], "corp");
    assert_eq!(last["door"], "api");
    assert!(
        last["error"]
            .as_str()
            .unwrap()
            .contains("access_denied (no-"),
        "{last}"
    );
    assert_eq!(records() - before, 4);

    // Logins waiting at the provider: at most 20 from one address.
    let mut waiting = vec![];
    for i in 0..20 {
        let (status, state) = start_login(&c);
        assert_eq!(status, 200, "{i}: {state}");
        waiting.push(state);
    }
    let (status, said) = start_login(&c);
    assert_eq!(status, 429);
    assert_eq!(
        said,
        "too many SSO logins started from 127.0.0.1 are waiting for the identity provider (20, at most 20); finish one, or try again when they expire (10 minutes)"
    );
    // `sally login` says so.
    let (r, _) = sso_login(&c, &c.dir.path().join("home-capped"), "corp", "alice");
    r.fails_with(
        "too many SSO logins started from 127.0.0.1 are waiting for the identity provider",
    );
    // One comes back (here with an error): a start is taken again.
    call_back(&c, &format!("state={}&error=access_denied", waiting[0]));
    assert_eq!(start_login(&c).0, 200);
    assert_eq!(start_login(&c).0, 429);
    drop(p);
}

/// browser.py from `url` as `who`, with `env`; returns (stdout, stderr).
fn browse(url: &str, who: &str, env: &[(&str, &str)]) -> (String, String) {
    let r = run(
        Command::new("python3")
            .arg(oidc_dir().join("browser.py"))
            .arg(url)
            .arg(who)
            .envs(env.iter().copied()),
        "",
    );
    (r.stdout, r.stderr)
}

/// `GET url` on the proxy with `cookie` (none when empty): status and body.
fn get_with_cookie(c: &Cluster, url: &str, cookie: &str) -> (u16, String) {
    let mut args = vec!["-sk", "-o", "-", "-w", "\n%{http_code}"];
    let header = format!("Cookie: {cookie}");
    if !cookie.is_empty() {
        args.extend(["-H", header.as_str()]);
    }
    let url = if url.starts_with("https://") {
        url.to_string()
    } else {
        format!("https://{}{url}", c.proxy)
    };
    args.push(&url);
    let out = run(Command::new("curl").args(&args), "").stdout;
    let (body, code) = out.rsplit_once('\n').unwrap_or((&out, "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

fn cookies_of(stderr: &str) -> String {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("cookie "))
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn a_browser_signs_in_with_sso_to_a_web_session_only_in_the_browser_that_started() {
    let c = Cluster::start();
    roles_file(&c);
    let p = provider(&c);
    connector(&c, "corp", &p.issuer);
    let start = format!(
        "https://{}/v1/webapi/oidc/web/start?connector=corp",
        c.proxy
    );

    // The whole way, as a browser goes: provider, callback, the proxy's finishing page.
    let (out, err) = browse(&start, "alice", &[("COOKIES", "1")]);
    assert!(
        out.starts_with("200") && out.contains("Signed in"),
        "{out}\n{err}"
    );
    assert!(out.contains("url=/web/nodes"), "the page moves on: {out}");
    assert!(
        err.contains("/v1/webapi/oidc/web/finish?response="),
        "{err}"
    );
    let cookies = cookies_of(&err);
    assert!(cookies.contains("__Host-sallyport_session="), "{cookies}");
    let (code, body) = get_with_cookie(&c, "/v1/webapi/web/session", &cookies);
    assert_eq!(code, 200, "{body}");
    let s: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["user"], "alice@example.com");
    assert!(s["roles"].to_string().contains("sso-ops"), "{s}");
    let logins = c.events("user.login");
    assert!(
        logins.iter().any(|e| e["method"] == "oidc"
            && e["success"] == true
            && e["user"] == "alice@example.com"),
        "{logins:?}"
    );

    // Stopped before the finishing page: another browser (an attacker who got the link, or who
    // wants to sign the victim in as themselves) cannot use it, and trying burns nothing...
    let (out, err) = browse(
        &start,
        "alice",
        &[("STOP_AT", "/v1/webapi/oidc/web/finish"), ("COOKIES", "1")],
    );
    let finish = out
        .lines()
        .find_map(|l| l.strip_prefix("stop "))
        .unwrap_or_else(|| panic!("{out}\n{err}"))
        .to_string();
    let (code, page) = get_with_cookie(&c, &finish, "");
    assert_eq!(code, 403, "{page}");
    assert!(page.contains("not started in this browser"), "{page}");
    let (code, _) = get_with_cookie(&c, &finish, "__Host-sallyport_sso=forged");
    assert_eq!(code, 403);
    // A link any site can send the browser (its Lax binding cookie goes along): a made-up
    // response or error uses nothing up, and shows no text of the link's without a sign-in.
    let cookies = cookies_of(&err);
    assert!(cookies.contains("__Host-sallyport_sso="), "{cookies}");
    let made_up = format!(
        "https://{}/v1/webapi/oidc/web/finish?response=made-up",
        c.proxy
    );
    let (code, page) = get_with_cookie(&c, &made_up, &cookies);
    assert_eq!(code, 401, "{page}");
    let spoof = "/v1/webapi/oidc/web/finish?error=Call+IT+at+555";
    let (code, page) = get_with_cookie(&c, spoof, "");
    assert_eq!(code, 403);
    assert!(!page.contains("Call IT"), "{page}");
    // ...and the browser that started finishes it, once.
    let (code, page) = get_with_cookie(&c, &finish, &cookies);
    assert_eq!(code, 200, "{page}");
    let (code, page) = get_with_cookie(&c, &finish, &cookies);
    assert_eq!(code, 403, "one use: {page}");

    // A person the roles do not admit is told why on the page, and gets no session.
    let (out, err) = browse(&start, "bob", &[("COOKIES", "1")]);
    assert!(
        out.starts_with("401") && out.contains("map to no Sallyport role"),
        "{out}"
    );
    assert!(
        !cookies_of(&err).contains("__Host-sallyport_session="),
        "{err}"
    );
    // A sign-in started from another site's link is refused.
    let cross = run(
        Command::new("curl").args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "-H",
            "Sec-Fetch-Site: cross-site",
            &start,
        ]),
        "",
    );
    assert_eq!(cross.stdout, "403");
    // An unknown connector: a page that says so, no provider visited.
    let (code, page) = get_with_cookie(&c, "/v1/webapi/oidc/web/start?connector=nope", "");
    assert!(code == 404 || code == 400, "{code} {page}");
    assert!(page.contains("nope"), "{page}");
    drop(p);
}
