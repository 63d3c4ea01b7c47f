//! `sally kube` end to end: `ls`, `login` (the kubeconfig it writes, read back by kubectl),
//! `credentials` (what kubectl runs before every request: cached, no network, nothing on stdout
//! but the credential) and `sally logout` taking it all away again. A cluster is registered the
//! way a kube agent's join registers it; no agent dials in, so it stays offline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sallyport_tests::*;

const KUBECTL: &str = "/usr/lib/google-cloud-sdk/bin/kubectl.1.32";

/// `sally` under `home`, with `KUBECONFIG` as given (never the test runner's own).
fn sally(home: &Path, kubeconfig: Option<&str>, args: &[&str]) -> Run {
    let mut cmd = Command::new(bin("sally"));
    cmd.env("SALLY_HOME", home)
        .env("HOME", home)
        .env_remove("KUBECONFIG")
        .args(args);
    if let Some(k) = kubeconfig {
        cmd.env("KUBECONFIG", k);
    }
    run(&mut cmd, "")
}

fn tool(program: &str, args: &[&str]) -> String {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Registers Kubernetes cluster `name` as a kube agent's join does: a kube token, and the
/// proxy's join endpoint with a TLS and a host key.
fn join_kube_cluster(c: &Cluster, name: &str, labels: serde_json::Value) {
    let out = c
        .sallyctl(&["tokens", "add", "--type=kube", "--format", "json"])
        .ok();
    let token: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let dir = c.dir.path().join(format!("kube-agent-{name}"));
    std::fs::create_dir_all(&dir).unwrap();
    let host = dir.join("host");
    let host = host.to_str().unwrap();
    tool("ssh-keygen", &["-q", "-t", "ed25519", "-N", "", "-f", host]);
    let tls = dir.join("tls.pem");
    let tls = tls.to_str().unwrap();
    tool(
        "openssl",
        &["genpkey", "-algorithm", "ed25519", "-out", tls],
    );
    let spki_pem = tool("openssl", &["pkey", "-in", tls, "-pubout"]);
    let spki: String = spki_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    let body = serde_json::json!({
        "token": token["token"],
        "nodename": name,
        "labels": labels,
        "tls_spki": spki,
        "ssh_host_key": std::fs::read_to_string(format!("{host}.pub")).unwrap(),
    });
    let url = format!("https://{}/v1/webapi/join", c.proxy);
    let out = Command::new("curl")
        .args([
            "-sSk",
            "--fail-with-body",
            "-H",
            "content-type: application/json",
        ])
        .args(["-d", &body.to_string(), &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "join: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What kubectl would read from `sally kube credentials`; asserts the run was clean.
fn credentials(home: &Path, proxy: &str, cluster: &str) -> serde_json::Value {
    let r = sally(
        home,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            proxy,
            "--cluster",
            cluster,
        ],
    )
    .ok();
    assert_eq!(r.stderr, "", "nothing but the credential");
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

#[track_caller]
fn assert_not_logged_in(r: Run) {
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(r.stdout, "", "kubectl must read nothing");
    assert_eq!(r.stderr.lines().count(), 1, "one line: {:?}", r.stderr);
    assert!(r.stderr.contains("sally login"), "{:?}", r.stderr);
}

fn cache_file(home: &Path, proxy: &str, user: &str, cluster: &str) -> PathBuf {
    home.join("keys")
        .join(proxy.replace(':', "_"))
        .join(format!("{user}-kube"))
        .join(format!("{cluster}-x509.pem"))
}

#[test]
fn credentials_without_a_login_print_nothing_and_name_sally_login() {
    let c = Cluster::start();
    let nobody = c.dir.path().join("nobody");
    let r = sally(
        &nobody,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            &c.proxy,
            "--cluster",
            "dev",
        ],
    );
    assert_not_logged_in(r);

    let home = c.user("alice", "access", "");
    // Logged in, but to another proxy than the one the kubeconfig names.
    assert_not_logged_in(sally(
        &home,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            "127.0.0.1:1",
            "--cluster",
            "dev",
        ],
    ));
    // Logged in, and the login expired (the profile says when).
    let profile = home.join("profile.json");
    let mut p: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    p["valid_until"] = "2001-01-01T00:00:00Z".into();
    std::fs::write(&profile, p.to_string()).unwrap();
    assert_not_logged_in(sally(
        &home,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            &c.proxy,
            "--cluster",
            "dev",
        ],
    ));
    // Logged out.
    sally(&home, None, &["logout"]).ok();
    assert_not_logged_in(sally(
        &home,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            &c.proxy,
            "--cluster",
            "dev",
        ],
    ));
}

#[test]
fn with_no_cluster_ls_is_empty_and_login_points_at_ls() {
    let c = Cluster::start();
    let home = c.user("alice", "access", "");
    let r = sally(&home, None, &["kube", "ls", "--format", "json"]).ok();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&r.stdout).unwrap(),
        serde_json::json!([])
    );
    let r = sally(&home, None, &["kube", "ls"]).ok();
    assert!(r.stdout.starts_with("Cluster"), "{}", r.stdout);
    for column in ["Labels", "Status"] {
        assert!(r.stdout.contains(column), "{}", r.stdout);
    }
    let kubeconfig = home.join("kubeconfig");
    sally(
        &home,
        Some(kubeconfig.to_str().unwrap()),
        &["kube", "login", "nosuch"],
    )
    .fails_with("sally kube ls");
    assert!(!kubeconfig.exists(), "a failed login writes nothing");
    // Not logged in at all: `sally login`.
    sally(&c.dir.path().join("nobody"), None, &["kube", "ls"]).fails_with("sally login");
}

#[test]
fn a_cluster_is_listed_and_certified_from_a_cache_that_needs_no_network() {
    let mut c = Cluster::start();
    join_kube_cluster(&c, "dev", serde_json::json!({"env": "dev"}));
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: ssh-only}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    let alice = c.user("alice", "access", "");
    let bob = c.user("bob", "ssh-only", "");

    let r = sally(&alice, None, &["kube", "ls", "--format", "json"]).ok();
    let list: serde_json::Value = serde_json::from_str(&r.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["name"], "dev");
    assert_eq!(list[0]["labels"], serde_json::json!({"env": "dev"}));
    assert_eq!(list[0]["online"], false);
    assert!(list[0]["id"].is_string());
    let r = sally(&alice, None, &["kube", "ls"]).ok();
    let row = r.stdout.lines().nth(1).unwrap_or_default().to_string();
    for cell in ["dev", "env=dev", "offline"] {
        assert!(row.contains(cell), "{}", r.stdout);
    }

    // A cluster the roles do not reach is not listed, and gets no certificate.
    let r = sally(&bob, None, &["kube", "ls", "--format", "json"]).ok();
    assert_eq!(r.stdout.trim(), "[]");
    let r = sally(
        &bob,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            &c.proxy,
            "--cluster",
            "dev",
        ],
    )
    .fails_with("no Kubernetes cluster dev");
    assert_eq!(r.code, 1);
    assert_eq!(r.stdout, "");

    // The credential: a certificate for alice's login key, that key, and its expiry.
    let cred = credentials(&alice, &c.proxy, "dev");
    assert_eq!(cred["apiVersion"], "client.authentication.k8s.io/v1");
    assert_eq!(cred["kind"], "ExecCredential");
    let status = &cred["status"];
    let key = std::fs::read_to_string(
        alice
            .join("keys")
            .join(c.proxy.replace(':', "_"))
            .join("alice.key.pem"),
    )
    .unwrap();
    assert_eq!(status["clientKeyData"], key.as_str());
    let cert = status["clientCertificateData"].as_str().unwrap();
    let cache = cache_file(&alice, &c.proxy, "alice", "dev");
    assert_eq!(std::fs::read_to_string(&cache).unwrap(), cert);
    let mode = std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let pem = alice.join("kube-cert.pem");
    std::fs::write(&pem, cert).unwrap();
    let pem = pem.to_str().unwrap();
    let subject = tool("openssl", &["x509", "-in", pem, "-noout", "-subject"]);
    assert!(subject.contains("CN = alice"), "{subject}");
    let expiry = status["expirationTimestamp"].as_str().unwrap();
    assert!(expiry.ends_with('Z') && expiry.contains('T'), "{expiry}");
    // The certificate's own expiry, to the second.
    let end = tool("openssl", &["x509", "-in", pem, "-noout", "-enddate"]);
    let end = tool(
        "date",
        &[
            "-u",
            "-d",
            end.trim().trim_start_matches("notAfter="),
            "+%Y-%m-%dT%H:%M:%SZ",
        ],
    );
    assert_eq!(end.trim(), expiry);

    // Served from the cache: the same certificate, even with the whole cluster down.
    c.stop();
    let again = credentials(&alice, &c.proxy, "dev");
    assert_eq!(again, cred);
    // Parallel runs, as kubectl's own concurrent requests make them, agree.
    let runs: Vec<_> = (0..8)
        .map(|_| {
            let (home, proxy) = (alice.clone(), c.proxy.clone());
            std::thread::spawn(move || credentials(&home, &proxy, "dev"))
        })
        .collect();
    for r in runs {
        assert_eq!(r.join().unwrap(), cred);
    }
    // A damaged cache is not used: auth is asked again, and it is down. (A certificate about
    // to expire is the unit tests' case: it takes a login shorter than a test.)
    std::fs::write(&cache, "damaged").unwrap();
    let r = sally(
        &alice,
        None,
        &[
            "kube",
            "credentials",
            "--proxy",
            &c.proxy,
            "--cluster",
            "dev",
        ],
    );
    assert_eq!(r.code, 1, "{r:?}");
    assert_eq!(r.stdout, "");
    assert!(r.stderr.contains("cannot reach"), "{}", r.stderr);
}

/// The kubeconfig of someone who already uses kubectl: another cluster, user and context,
/// preferences and a tool's extension.
const THEIRS: &str = "apiVersion: v1
kind: Config
preferences: {colors: true}
clusters:
- name: kind-kind
  cluster: {server: 'https://127.0.0.1:6443', insecure-skip-tls-verify: true}
users:
- name: kind-admin
  user: {token: '0777'}
contexts:
- name: kind
  context: {cluster: kind-kind, user: kind-admin, namespace: team}
current-context: kind
extensions:
- name: other-tool
  extension: {answer: 42}
";

fn kubectl(kubeconfig: &str, args: &[&str]) -> String {
    let out = Command::new(KUBECTL)
        .env("KUBECONFIG", kubeconfig)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn kube_login_merges_into_the_first_kubeconfig_and_logout_takes_it_out() {
    let c = Cluster::start();
    join_kube_cluster(&c, "dev", serde_json::json!({"env": "dev"}));
    let home = c.user("alice", "access", "");
    let first = c.dir.path().join("first-config");
    let second = c.dir.path().join("second-config");
    std::fs::write(&first, THEIRS).unwrap();
    let list = format!("{}:{}", first.display(), second.display());

    let r = sally(&home, Some(&list), &["kube", "login", "dev"]).ok();
    assert_eq!(
        r.stdout.trim(),
        "Logged in to Kubernetes cluster dev. kubectl now uses context test-dev."
    );
    assert!(!second.exists(), "only the first file is written");
    let mode = std::fs::metadata(&first).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // kubectl reads it: theirs as it was, ours beside it, ours current.
    let first_s = first.to_str().unwrap();
    let view = kubectl(first_s, &["config", "view", "--raw", "-o", "json"]);
    let v: serde_json::Value = serde_json::from_str(&view).unwrap();
    assert_eq!(v["current-context"], "test-dev");
    let named = |list: &str, name: &str| {
        v[list]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {list}: {view}"))
    };
    assert_eq!(named("users", "kind-admin")["user"]["token"], "0777");
    assert_eq!(named("contexts", "kind")["context"]["namespace"], "team");
    assert_eq!(
        named("clusters", "kind-kind")["cluster"]["insecure-skip-tls-verify"],
        true
    );
    let ping = tool(
        "curl",
        &["-sk", &format!("https://{}/v1/webapi/ping", c.proxy)],
    );
    let ping: serde_json::Value = serde_json::from_str(&ping).unwrap();
    let kube_port = ping["kube_port"].as_u64().unwrap();
    let cluster = named("clusters", "test-dev");
    assert_eq!(
        cluster["cluster"]["server"],
        format!("https://127.0.0.1:{kube_port}/kube/dev").as_str()
    );
    assert!(cluster["cluster"]["certificate-authority-data"].is_string());
    let exec = &named("users", "test-dev")["user"]["exec"];
    assert_eq!(exec["apiVersion"], "client.authentication.k8s.io/v1");
    let sally_path = std::fs::canonicalize(bin("sally")).unwrap();
    assert_eq!(exec["command"], sally_path.to_str().unwrap());
    assert_eq!(
        exec["args"],
        serde_json::json!([
            "kube",
            "credentials",
            "--proxy",
            c.proxy,
            "--cluster",
            "dev"
        ])
    );
    assert_eq!(
        exec["env"],
        serde_json::json!([{"name": "SALLY_HOME", "value": home.to_str().unwrap()}])
    );
    assert_eq!(exec["interactiveMode"], "Never");
    assert_eq!(
        named("contexts", "test-dev")["context"],
        serde_json::json!({"cluster": "test-dev", "user": "test-dev"})
    );
    let text = std::fs::read_to_string(&first).unwrap();
    assert!(
        text.contains("other-tool") && text.contains("answer: 42"),
        "{text}"
    );

    // The command kubectl runs works as written, with only the environment it sets.
    let args: Vec<&str> = exec["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let out = Command::new(exec["command"].as_str().unwrap())
        .env_clear()
        .env("SALLY_HOME", &home)
        .args(&args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cred: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cred["kind"], "ExecCredential");

    // Again: replaced, not repeated.
    sally(&home, Some(&list), &["kube", "login", "dev"]).ok();
    let v: serde_json::Value = serde_json::from_str(&kubectl(
        first_s,
        &["config", "view", "--raw", "-o", "json"],
    ))
    .unwrap();
    for list in ["clusters", "users", "contexts"] {
        assert_eq!(v[list].as_array().unwrap().len(), 2, "{list}: {v}");
    }

    // Logout: ours out, theirs as they were, no current context, no cached certificate.
    let r = sally(&home, Some(&list), &["logout"]).ok();
    assert!(r.stdout.contains("Logged out"), "{}", r.stdout);
    let v: serde_json::Value = serde_json::from_str(&kubectl(
        first_s,
        &["config", "view", "--raw", "-o", "json"],
    ))
    .unwrap();
    for (list, theirs) in [
        ("clusters", "kind-kind"),
        ("users", "kind-admin"),
        ("contexts", "kind"),
    ] {
        let names: Vec<&str> = v[list]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|e| e["name"].as_str())
            .collect();
        assert_eq!(names, [theirs], "{list}");
    }
    assert_eq!(v["current-context"].as_str().unwrap_or(""), "");
    assert!(!cache_file(&home, &c.proxy, "alice", "dev").exists());
    assert!(!second.exists());
}

#[test]
fn kube_login_creates_the_default_kubeconfig() {
    let c = Cluster::start();
    join_kube_cluster(&c, "dev", serde_json::json!({}));
    let home = c.user("alice", "access", "");
    sally(&home, None, &["kube", "login", "dev"]).ok();
    let config = home.join(".kube").join("config");
    let mode = std::fs::metadata(&config).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let current = kubectl(config.to_str().unwrap(), &["config", "current-context"]);
    assert_eq!(current.trim(), "test-dev");
}
