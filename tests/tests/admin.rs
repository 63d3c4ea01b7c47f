//! `sallyctl`: the local admin identity, users, CA export, and the admin API's rules — as the
//! local admin and as logged-in users reaching auth through the proxy.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use sallyport_tests::*;

#[test]
fn status_and_users() {
    let c = Cluster::start();
    let s: serde_json::Value =
        serde_json::from_str(&c.sallyctl(&["status", "--format", "json"]).ok().stdout).unwrap();
    assert_eq!(s["cluster_name"], "test");
    assert_eq!(
        s["ca_pins"][0],
        c.pin.as_str(),
        "status shows the pin the banner printed"
    );
    assert_eq!(s["roles"], 3, "the presets access, editor, auditor");
    assert_eq!(s["users"], 0);

    let out = c
        .sallyctl(&[
            "users",
            "add",
            "alice",
            "--roles",
            "access,auditor",
            "--logins",
            "root,alice",
        ])
        .ok()
        .stdout;
    assert!(out.contains("sally signup --proxy"), "{out}");
    c.sallyctl(&["users", "add", "alice", "--roles", "access"])
        .fails_with("user alice already exists");
    c.sallyctl(&["users", "add", "zed", "--roles", "nope"])
        .fails_with("role nope does not exist");
    c.sallyctl(&["users", "add", "bad/name", "--roles", "access"])
        .fails_with("invalid user name");
    c.sallyctl(&[
        "users",
        "add",
        "mo",
        "--roles",
        "access",
        "--logins=-oProxyCommand=x",
    ])
    .fails_with("invalid login name");

    let ls: serde_json::Value =
        serde_json::from_str(&c.sallyctl(&["users", "ls", "--format", "json"]).ok().stdout)
            .unwrap();
    let alice = &ls[0];
    assert_eq!(alice["name"], "alice");
    assert_eq!(alice["type"], "local");
    assert_eq!(alice["status"], "pending");
    assert_eq!(alice["roles"], serde_json::json!(["access", "auditor"]));
    c.sallyctl(&["users", "rm", "alice"]).ok();
    c.sallyctl(&["users", "rm", "alice"])
        .fails_with("does not exist");
    let text = c.sallyctl(&["users", "ls"]).ok().stdout;
    assert!(!text.contains("alice"), "{text}");
}

#[test]
fn ca_exports_are_what_openssh_and_openssl_read() {
    let c = Cluster::start();
    let dir = c.dir.path();
    let user = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    std::fs::write(dir.join("ca.pub"), &user).unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-l", "-f"])
        .arg(dir.join("ca.pub"))
        .output()
        .unwrap();
    assert!(out.status.success(), "ssh-keygen reads the user CA");
    let host = c.sallyctl(&["auth", "export", "--type=host"]).ok().stdout;
    assert!(host.starts_with("@cert-authority *.test"), "{host}");
    assert!(host.contains("ssh-ed25519 "), "{host}");
    for kind in ["tls-user", "tls-host"] {
        let pem = c
            .sallyctl(&["auth", "export", &format!("--type={kind}")])
            .ok()
            .stdout;
        std::fs::write(dir.join("ca.pem"), &pem).unwrap();
        let out = Command::new("openssl")
            .args(["x509", "-noout", "-subject", "-in"])
            .arg(dir.join("ca.pem"))
            .output()
            .unwrap();
        let subject = String::from_utf8_lossy(&out.stdout);
        assert!(subject.contains("Sallyport"), "{kind}: {subject}");
    }
    c.sallyctl(&["auth", "export", "--type=bogus"])
        .fails_with("invalid value");
}

#[test]
fn admin_api_is_authorized_by_role_rules() {
    let c = Cluster::start();
    let access = c.user("ann", "access", "ann");
    let editor = c.user("ed", "editor", "");
    let auditor = c.user("audrey", "auditor", "");

    // A plain user cannot administer, and is told which role lacks what.
    c.sallyctl_as(&access, &["users", "add", "x", "--roles", "access"])
        .fails_with("access denied: role access lacks `create` on `user`");
    c.sallyctl_as(&access, &["users", "ls"])
        .fails_with("lacks `list` on `user`");
    c.sallyctl_as(&access, &["audit", "search"])
        .fails_with("lacks `list` on `event`");
    // CA public keys are public to every authenticated user.
    c.sallyctl_as(&access, &["auth", "export", "--type=user"])
        .ok();

    // The editor administers everything, through the proxy, with its own identity.
    let out = c
        .sallyctl_as(
            &editor,
            &[
                "users", "add", "newbie", "--roles", "access", "--format", "json",
            ],
        )
        .ok();
    assert!(out.stdout.contains("\"token\""));
    let created: Vec<serde_json::Value> = c
        .sallyctl(&["audit", "search", "--type", "user.create"])
        .ok()
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        created
            .iter()
            .any(|e| e["user"] == "ed" && e["name"] == "newbie"),
        "audited as ed: {created:?}"
    );

    // The auditor reads events but cannot change users.
    c.sallyctl_as(&auditor, &["audit", "search"]).ok();
    c.sallyctl_as(&auditor, &["audit", "verify"]).ok();
    c.sallyctl_as(&auditor, &["users", "rm", "ann"])
        .fails_with("role auditor lacks `delete` on `user`");

    // A removed user's still-valid certificate no longer opens the admin API.
    c.sallyctl(&["users", "rm", "ed"]).ok();
    c.sallyctl_as(&editor, &["users", "ls"])
        .fails_with("user ed no longer exists");

    // Without any identity, sallyctl says how to get one.
    let nobody = c.dir.path().join("nobody");
    c.sallyctl_as(&nobody, &["status"])
        .fails_with("no identity");
}

#[test]
fn auth_port_refuses_clients_without_a_cluster_certificate() {
    let c = Cluster::start();
    // A TLS client with no certificate: the handshake itself is refused by auth.
    let out = Command::new("openssl")
        .args(["s_client", "-connect", &c.auth, "-brief"])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!text.contains("\"cluster_name\""), "{text}");
    let get = Command::new("openssl")
        .args(["s_client", "-connect", &c.auth, "-quiet"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = get.wait_with_output().unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("HTTP/1.1 200"));
}
