//! Failed authentication at every door is audited as `auth.fail` (door, address, what was
//! presented, reason), and a flood is not a flood of records: one event at once, then one a
//! minute per (door, address, reason) carrying the `count`. Driven with OpenSSH's `ssh` and
//! `ssh-keygen` (a user certificate from a CA that is not the cluster's), `openssl s_client`
//! at the agents' door, and `curl` at auth's own API and the SSO callback.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sallyport_tests::*;

/// How long until an aggregation window (60 s) closes and its count is audited.
const WINDOW_CLOSES: Duration = Duration::from_secs(100);

fn keygen(args: &[&str]) {
    run(Command::new("ssh-keygen").args(args), "").ok();
}

/// The SHA256 fingerprint `ssh-keygen -l` prints for a public key file.
fn fingerprint(public: &Path) -> String {
    let out = run(Command::new("ssh-keygen").arg("-lf").arg(public), "").ok();
    out.stdout.split_whitespace().nth(1).unwrap().to_string()
}

/// `auth.fail` events of `door`.
fn failed(c: &Cluster, door: &str) -> Vec<serde_json::Value> {
    c.events("auth.fail")
        .into_iter()
        .filter(|e| e["door"] == door)
        .collect()
}

fn count_sum(events: &[serde_json::Value]) -> u64 {
    events.iter().map(|e| e["count"].as_u64().unwrap()).sum()
}

/// Runs `n` copies of `f` on `threads` threads.
fn flood(n: usize, threads: usize, f: impl Fn(usize) + Sync) {
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || {
                for i in (t..n).step_by(threads) {
                    f(i);
                }
            });
        }
    });
}

#[test]
fn a_certificate_from_another_ca_is_audited_at_the_ssh_door_and_a_flood_is_counted() {
    // The door's own throttles out of the way: every attempt reaches authentication.
    let c = Cluster::start_with(Options {
        proxy_service: [
            "max_unauthenticated_connections: 1024",
            "max_unauthenticated_per_address: 1024",
            "max_connection_rate_per_address: 1000",
        ]
        .map(String::from)
        .to_vec(),
        ..Options::default()
    });
    let dir = c.dir.path();
    let (ca, key) = (dir.join("wrong_ca"), dir.join("mallory"));
    for k in [&ca, &key] {
        keygen(&["-q", "-t", "ed25519", "-N", "", "-f", k.to_str().unwrap()]);
    }
    keygen(&[
        "-q",
        "-s",
        ca.to_str().unwrap(),
        "-I",
        "mallory-key-id",
        "-n",
        "root",
        "-V",
        "-5m:+1h",
        dir.join("mallory.pub").to_str().unwrap(),
    ]);
    let ca_fp = fingerprint(&dir.join("wrong_ca.pub"));
    let key_fp = fingerprint(&dir.join("mallory.pub"));
    let attempt = || {
        run(
            Command::new("ssh")
                .args(["-F", "/dev/null", "-i"])
                .arg(&key)
                .arg("-o")
                .arg(format!("CertificateFile={}-cert.pub", key.display()))
                .args([
                    "-o",
                    "IdentitiesOnly=yes",
                    "-o",
                    "IdentityAgent=none",
                    "-o",
                    "BatchMode=yes",
                    "-o",
                    "StrictHostKeyChecking=no",
                    "-o",
                    "UserKnownHostsFile=/dev/null",
                    "-p",
                    &c.ssh_port.to_string(),
                    "root@127.0.0.1",
                    "true",
                ]),
            "",
        )
    };
    attempt().fails_with("Permission denied");
    // One event, at once, with what was presented and why it was refused.
    assert!(
        eventually(Duration::from_secs(10), || !failed(&c, "ssh").is_empty()),
        "no auth.fail event for the ssh door"
    );
    let first = failed(&c, "ssh");
    assert_eq!(first.len(), 1, "{first:?}");
    let e = &first[0];
    assert_eq!(e["presented"]["ca_fingerprint"], ca_fp.as_str(), "{e}");
    assert_eq!(e["presented"]["key_fingerprint"], key_fp.as_str(), "{e}");
    assert_eq!(e["presented"]["cert_key_id"], "mallory-key-id", "{e}");
    assert_eq!(e["presented"]["cert_type"], "user", "{e}");
    assert!(
        e["reason"]
            .as_str()
            .unwrap()
            .starts_with("certificate refused"),
        "{e}"
    );
    assert!(
        e["remote_addr"].as_str().unwrap().starts_with("127.0.0.1:"),
        "{e}"
    );
    assert_eq!(e["presented"]["login"], "root", "{e}");
    assert!(e["user"].is_null(), "a login is not a Sallyport user: {e}");
    assert_eq!(e["count"], 1, "{e}");

    // 49 more: no more records until the minute closes, then one carrying their count.
    flood(49, 7, |_| {
        let _ = attempt();
    });
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(failed(&c, "ssh").len(), 1, "{:?}", failed(&c, "ssh"));
    assert!(
        eventually(WINDOW_CLOSES, || failed(&c, "ssh").len() == 2),
        "the counted failures were never audited"
    );
    let all = failed(&c, "ssh");
    assert_eq!(count_sum(&all), 50, "{all:?}");
    assert_eq!(all[1]["count"], 49, "{all:?}");
    assert_eq!(all[1]["presented"]["ca_fingerprint"], ca_fp.as_str());
    let v = c.sallyctl(&["audit", "verify"]).ok();
    assert!(v.stdout.contains("intact"), "{v:?}");
}

#[test]
fn refusals_at_the_tunnel_and_api_doors_and_wrong_passwords_are_audited_once_each() {
    let c = Cluster::start_with(Options {
        max_login_attempts: 100,
        ..Options::default()
    });
    let dir = c.dir.path();
    // The agents' door: a certificate from a CA that is not the cluster's host CA.
    let tunnel = c.tunnel.clone();
    let (key, cert) = (dir.join("rogue.key"), dir.join("rogue.pem"));
    run(
        Command::new("openssl").args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=rogue-node/O=node",
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ]),
        "",
    )
    .ok();
    let _ = run(
        Command::new("openssl").args([
            "s_client",
            "-connect",
            &tunnel,
            "-alpn",
            "sallyport-tunnel",
            "-cert",
            cert.to_str().unwrap(),
            "-key",
            key.to_str().unwrap(),
        ]),
        "",
    );
    assert!(
        eventually(Duration::from_secs(10), || !failed(&c, "tunnel").is_empty()),
        "no auth.fail event for the tunnel door"
    );
    let t = &failed(&c, "tunnel")[0];
    assert!(
        t["reason"]
            .as_str()
            .unwrap()
            .contains("TLS handshake refused"),
        "{t}"
    );
    assert!(t["remote_addr"].as_str().unwrap().starts_with("127.0.0.1:"));

    // Auth's own API, with the certificate of a user removed since it was issued.
    let gone = c.user("ivy", "access", "ivy");
    c.sallyctl(&["users", "rm", "ivy"]).ok();
    c.sallyctl_as(&gone, &["users", "ls"])
        .fails_with("user ivy no longer exists");
    let api = failed(&c, "api");
    assert_eq!(api.len(), 1, "{api:?}");
    assert_eq!(api[0]["reason"], "user ivy no longer exists");
    assert_eq!(api[0]["presented"]["cert_subject_cn"], "ivy");
    assert_eq!(
        api[0]["presented"]["cert_issuer_cn"]
            .as_str()
            .map(|s| !s.is_empty()),
        Some(true)
    );
    assert_eq!(api[0]["count"], 1);

    // Twenty wrong passwords for a real user: unsuccessful `user.login` events (not also
    // `auth.fail`), the first at once and the rest counted into one.
    let home = c.user("hal", "access", "hal");
    flood(20, 4, |_| {
        c.login(&home, "hal", "not the password")
            .fails_with("invalid user name or password");
    });
    let wrong = || -> Vec<serde_json::Value> {
        c.events("user.login")
            .into_iter()
            .filter(|e| e["success"] == false && e["user"] == "hal")
            .collect()
    };
    assert_eq!(wrong().len(), 1, "{:?}", wrong());
    assert_eq!(wrong()[0]["reason"], "wrong password");
    assert_eq!(wrong()[0]["door"], "api");
    assert_eq!(
        failed(&c, "api").len(),
        1,
        "a login refusal is not audited twice"
    );
    assert!(
        eventually(WINDOW_CLOSES, || count_sum(&wrong()) == 20),
        "{:?}",
        wrong()
    );
    assert_eq!(wrong().len(), 2, "{:?}", wrong());
}

#[test]
fn forged_sso_callbacks_do_not_flood_the_audit_log() {
    let c = Cluster::start();
    let before = c.sallyctl(&["audit", "search"]).ok().stdout.lines().count();
    flood(200, 8, |_| {
        let r = run(
            Command::new("curl").args([
                "-sk",
                &format!(
                    "https://{}/v1/webapi/oidc/callback?state=forged&code=x",
                    c.proxy
                ),
            ]),
            "",
        );
        assert!(r.stdout.contains("unknown, expired"), "{r:?}");
    });
    let after = c.sallyctl(&["audit", "search"]).ok().stdout.lines().count();
    assert!(after - before <= 2, "{} new audit records", after - before);
    let forged = || -> Vec<serde_json::Value> {
        c.events("user.login")
            .into_iter()
            .filter(|e| e["method"] == "oidc" && e["success"] == false)
            .collect()
    };
    assert!(
        eventually(WINDOW_CLOSES, || count_sum(&forged()) == 200),
        "{:?}",
        forged()
    );
    let events = forged();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(events[1]["count"], 199);
    assert_eq!(
        events[1]["reason"],
        "unknown, expired or reused login state"
    );
}

#[test]
fn failures_still_being_counted_are_audited_at_shutdown() {
    let mut c = Cluster::start();
    flood(5, 1, |_| {
        run(
            Command::new("curl").args([
                "-sk",
                &format!(
                    "https://{}/v1/webapi/oidc/callback?state=forged&code=x",
                    c.proxy
                ),
            ]),
            "",
        );
    });
    let pid = c.pid().unwrap().to_string();
    run(Command::new("kill").args(["-TERM", &pid]), "").ok();
    assert!(
        eventually(Duration::from_secs(20), || !Path::new(&format!(
            "/proc/{pid}/exe"
        ))
        .exists()
            || std::fs::read_to_string(format!("/proc/{pid}/status"))
                .is_ok_and(|s| s.contains("State:\tZ"))),
        "the daemon did not stop on SIGTERM"
    );
    c.stop();
    c.boot();
    let forged: Vec<serde_json::Value> = c
        .events("user.login")
        .into_iter()
        .filter(|e| e["method"] == "oidc")
        .collect();
    assert_eq!(
        forged
            .iter()
            .map(|e| e["count"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![1, 4],
        "{forged:?}"
    );
}
