//! The web UI in a real browser: Debian's Chromium, driven by `tests/web/driver.mjs`
//! (playwright-core), against a cluster with a second factor, two nodes (`local1` env=dev,
//! `web2` env=prod) and two users: alice (role `access`: both nodes, login root) and bob
//! (a role reaching env=dev only). The driver checks, in this order: the sign-in page's weight
//! and load time on a cold cache; a wrong code announced and tied to its field; sign-in with
//! password and TOTP by keyboard only; axe-core on each page (no serious or critical finding);
//! the security headers and the not-found page; the cookie's flags; the nodes and the search;
//! the login chooser; `echo hi`; a UTF-8 character split across frames; a 1 MiB paste;
//! `stty size` before and after a resize; copy by Ctrl+Shift+C; the exit status and a new
//! session; the terminal page's weight on a cold cache; a refused login explained; sign-out
//! ending the session and a terminal in another tab; bob's nodes; a lock ending bob's terminal
//! and session; carol's sign-up from her link (QR code, key, first code) and sign-in.
//! Past the terminal: a session recorded there (`echo hi`) listed and played in the player
//! (its own CSP, 4x to the end where `hi` shows, Home and End by keyboard, its weight within
//! 200 KB plus the cast), idle skip turned off by its key keeping the speed, and a record past
//! 64 MiB offering the file and `sally play` without loading the cast; then erin (access, auditor, editor) sees the admin links in the
//! header, pages and filters the audit log and downloads what `sallyctl audit search` prints
//! for the same range, is shown `verbs: [craete]` at its line and column in the role editor,
//! saves, is refused a stale save (409), adds a user (the sign-up link once), lifts bob's lock,
//! locks frank, and adds a join token (the agent's command once); axe-core on each page.
//! Each step saves a screenshot in `<target>/web-screenshots/local/`. `sso_sign_in_in_chromium`
//! is single sign-on at a real OpenID provider (`driver.mjs sso`, `<target>/web-screenshots/sso/`).
//!
//! Cross-origin requests and upgrades (403) are `web_terminal`'s, not repeated here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sallyport_tests::oidc;
use sallyport_tests::*;

const PASSWORD: &str = "correct horse battery";
const CHROMIUM: &str = "/usr/lib/chromium/chromium";

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// `<target>/web-screenshots`, beside the test binary's profile directory.
fn screenshots() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // <target>/debug/deps/web-HASH
    let target = exe
        .ancestors()
        .nth(3)
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target"));
    target.join("web-screenshots")
}

/// Runs `driver.mjs MODE` against `c` with `env` added (each step's screenshot in
/// `<target>/web-screenshots/MODE/`); fails the test with the driver's output unless it
/// succeeds. Returns its stdout.
fn drive(mode: &str, c: &Cluster, env: &[(&str, String)]) -> String {
    let driver_dir = workspace().join("tests/web");
    assert!(
        std::path::Path::new(CHROMIUM).exists(),
        "{CHROMIUM} is missing: apt-get install chromium (scripts/test does)"
    );
    assert!(
        driver_dir.join("node_modules/playwright-core").exists(),
        "playwright-core is missing: (cd tests/web && npm ci) (scripts/test does)"
    );
    let shots = screenshots().join(mode);
    let _ = std::fs::remove_dir_all(&shots);
    let mut child = Command::new("node")
        .arg("driver.mjs")
        .arg(mode)
        .current_dir(&driver_dir)
        .env("SALLYPORT_URL", format!("https://{}", c.proxy))
        .env("SALLYPORT_CA_PIN", &c.pin)
        .env("SCREENSHOTS", &shots)
        .env("CHROMIUM", CHROMIUM)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run node");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(240);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let stdout = reader.join().unwrap();
    let stderr = err_reader.join().unwrap();
    println!("{stdout}");
    eprintln!("{stderr}");
    println!("screenshots: {}", shots.display());
    let status = status.expect("the browser driver ran past 240 s");
    assert!(
        status.success(),
        "the browser driver failed:\n{stderr}\nafter:\n{stdout}"
    );
    stdout
}

#[test]
fn web_ui_in_chromium() {
    let c = Cluster::start_with(Options {
        second_factor: true,
        ..Options::default()
    });
    c.wait_online("local1");
    let _web2 = c.agent("web2", "env=prod");
    c.create(
        "kind: role
version: v1
metadata: {name: dev-only}
spec:
  allow:
    logins: [root]
    node_labels: {env: dev}
",
    )
    .ok();
    let alice = c.add_user("alice", "access", "root");
    let alice = c.signup(&alice, PASSWORD).unwrap();
    let bob = c.add_user("bob", "dev-only", "");
    let bob = c.signup(&bob, PASSWORD).unwrap();
    let erin = c.add_user("erin", "access,auditor,editor", "root");
    let erin = c.signup(&erin, PASSWORD).unwrap();
    let users = serde_json::json!({
        "alice": {"password": PASSWORD, "totp_secret": alice},
        "bob": {"password": PASSWORD, "totp_secret": bob},
        "erin": {"password": PASSWORD, "totp_secret": erin},
    });
    let carol = c.add_user("carol", "access", "root");
    let stdout = drive(
        "local",
        &c,
        &[
            ("SALLYPORT_USERS", users.to_string()),
            ("SIGNUP_TOKEN", carol),
            (
                "SALLYCTL",
                serde_json::json!([
                    bin("sallyctl").display().to_string(),
                    "--data-dir",
                    c.data_dir().display().to_string(),
                ])
                .to_string(),
            ),
        ],
    );
    assert!(stdout.contains("step: tokens-added"), "{stdout}");
    // The refused login reached auth as one, and the terminal sessions were the browser's.
    let rejected = c.events("session.reject");
    assert!(
        rejected
            .iter()
            .any(|e| e.to_string().contains("nobody") && e["user"] == "alice"),
        "{rejected:?}"
    );
}

/// Single sign-on in Chromium, at the real provider (`sallyport_tests::oidc`), which runs as
/// another site (`localhost`; the proxy is 127.0.0.1), as real providers are. The driver
/// (`driver.mjs sso`) clicks "Sign in with corp", signs in on the provider's own login page and
/// consents, and must land on /web/nodes signed in as alice@example.com: the `Strict` session
/// cookie, set at the end of a redirect chain that began at the provider, is sent when the
/// browser lands (the OIDC pitfall, proved in the browser that has it). A terminal on local1
/// runs as root. bob's claims map to no role: the page says so, and he has no session.
#[test]
fn sso_sign_in_in_chromium() {
    let c = Cluster::start();
    oidc::roles_file(&c);
    let p = oidc::provider_with(&c, &[("ISSUER_HOST", "localhost")]);
    oidc::connector(&c, "corp", &p.issuer);
    c.wait_online("local1");
    let stdout = drive(
        "sso",
        &c,
        &[
            ("SSO_CONNECTOR", "corp".into()),
            ("SSO_ISSUER", p.issuer.clone()),
            ("SSO_USER", "alice".into()),
            ("SSO_USER_NAME", "alice@example.com".into()),
            ("SSO_NOBODY", "bob".into()),
        ],
    );
    assert!(stdout.contains("step: sso-nobody-refused"), "{stdout}");
    // Auth saw both: alice's web sign-in and bob's refusal, each by OIDC.
    let logins = c.events("user.login");
    assert!(
        logins.iter().any(|e| e["method"] == "oidc"
            && e["success"] == true
            && e["user"] == "alice@example.com"),
        "{logins:?}"
    );
    assert!(
        logins.iter().any(|e| e["method"] == "oidc"
            && e["success"] == false
            && e.to_string().contains("map to no Sallyport role")),
        "{logins:?}"
    );
    // The terminal was a recorded session of alice's.
    let started = c.events("session.start");
    assert!(
        started.iter().any(|e| e["user"] == "alice@example.com"),
        "{started:?}"
    );
    drop(p);
}
