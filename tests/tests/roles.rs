//! Roles as YAML resources through `sallyctl`: create, get, edit, rm, users update, access
//! check — with the validation errors an admin would see.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Command;

use sallyport_tests::*;

fn repo_file(rel: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
        .display()
        .to_string()
}

#[test]
fn create_get_and_round_trip() {
    let c = Cluster::start();
    let envs = repo_file("config/roles/environments.yaml");
    let out = c.sallyctl(&["create", &envs]).ok().stdout;
    assert!(
        out.contains("role engineering created") && out.contains("role oncall created"),
        "{out}"
    );
    c.sallyctl(&["create", &envs])
        .fails_with("role engineering already exists; use `sallyctl create -f`");
    let out = c.sallyctl(&["create", "-f", &envs]).ok().stdout;
    assert!(out.contains("role engineering updated"), "{out}");
    for f in [
        "config/roles/auditor.yaml",
        "config/roles/kube-developer.yaml",
    ] {
        c.sallyctl(&["create", &repo_file(f)]).ok();
    }

    let text = c.sallyctl(&["get", "roles"]).ok().stdout;
    for name in [
        "access",
        "editor",
        "auditor",
        "engineering",
        "oncall",
        "security-auditor",
        "kube-developer",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "{name} missing:\n{text}"
        );
    }
    // What `get --format yaml` prints is a file `create -f` takes back unchanged.
    let yaml = c
        .sallyctl(&["get", "role/engineering", "--format", "yaml"])
        .ok()
        .stdout;
    assert!(yaml.contains("max_session_ttl: 8h"), "{yaml}");
    let f = c.dir.path().join("engineering.yaml");
    std::fs::write(&f, &yaml).unwrap();
    c.sallyctl(&["create", "-f", &f.display().to_string()]).ok();
    assert_eq!(
        c.sallyctl(&["get", "role/engineering", "--format", "yaml"])
            .ok()
            .stdout,
        yaml
    );
    let json: serde_json::Value = serde_json::from_str(
        &c.sallyctl(&["get", "role/oncall", "--format", "json"])
            .ok()
            .stdout,
    )
    .unwrap();
    assert_eq!(json["spec"]["options"]["record_session"]["ssh"], "strict");
    c.sallyctl(&["get", "role/nope"])
        .fails_with("role nope does not exist");
}

#[test]
fn invalid_roles_are_refused_with_file_line_column_and_field() {
    let c = Cluster::start();
    let cases = [
        (
            "spec:\n  allow:\n    rules: [{resources: [role], verbs: [craete]}]\n",
            "unknown verb \"craete\"",
            "line 7 column 41",
        ),
        (
            "spec:\n  allow:\n    node_labels: {env: '^prod-($'}\n",
            "bad regular expression",
            "line 7 column",
        ),
        (
            "spec:\n  options: {max_session_ttl: 8 hours}\n",
            "invalid duration",
            "line 6 column",
        ),
        (
            "spec:\n  allow:\n    nodes_labels: {env: prod}\n",
            "unknown field `nodes_labels`",
            "line 7 column 5",
        ),
        (
            "spec:\n  allow:\n    kubernetes_resources: [{kind: pods, verbs: [get]}]\n",
            "unknown kubernetes kind",
            "line 7 column",
        ),
    ];
    for (spec, want, at) in cases {
        let f = c.dir.path().join("bad-role.yaml");
        std::fs::write(
            &f,
            format!("kind: role\nversion: v1\nmetadata:\n  name: bad\n{spec}"),
        )
        .unwrap();
        let r = c.sallyctl(&["create", &f.display().to_string()]);
        let r = r
            .fails_with(want)
            .fails_with(&f.display().to_string())
            .fails_with(at);
        assert_eq!(r.code, 1);
    }
    c.sallyctl(&["get", "role/bad"])
        .fails_with("does not exist");
    // A multi-document file with one bad document saves nothing.
    let f = c.dir.path().join("two.yaml");
    std::fs::write(
        &f,
        "kind: role\nversion: v1\nmetadata: {name: good}\n---\nkind: widget\n",
    )
    .unwrap();
    c.sallyctl(&["create", &f.display().to_string()])
        .fails_with("line 5: unknown kind \"widget\"");
    c.sallyctl(&["get", "role/good"])
        .fails_with("does not exist");
}

#[test]
fn users_update_roles_and_role_deletion_guard() {
    let c = Cluster::start();
    c.sallyctl(&["create", &repo_file("config/roles/environments.yaml")])
        .ok();
    let home = c.user("alice", "access", "alice");
    c.sallyctl(&["rm", "role/access"])
        .fails_with("role access is held by user alice");
    let out = c
        .sallyctl(&[
            "users",
            "update",
            "alice",
            "--set-roles",
            "engineering",
            "--set-logins",
            "alice,deploy",
        ])
        .ok();
    assert!(
        out.stdout
            .contains("roles engineering; logins alice,deploy"),
        "{}",
        out.stdout
    );
    c.sallyctl(&["users", "update", "alice", "--set-roles", "nope"])
        .fails_with("role nope does not exist");
    c.sallyctl(&["users", "update", "alice"])
        .fails_with("nothing to update");
    // The next login picks the change up: principals from the new role and logins.
    c.login(&home, "alice", "correct horse battery").ok();
    let s: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["status", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    assert_eq!(s["roles"], serde_json::json!(["engineering"]));
    assert_eq!(
        s["logins"],
        serde_json::json!(["alice", "deploy", "ubuntu"])
    );
    let valid = s["valid_until"].as_str().unwrap().to_string();
    let hours = Command::new("date")
        .args(["-d", &valid, "+%s"])
        .output()
        .unwrap();
    let left: i64 = String::from_utf8_lossy(&hours.stdout)
        .trim()
        .parse::<i64>()
        .unwrap()
        - std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
    assert!(
        left <= 8 * 3600 && left > 8 * 3600 - 120,
        "engineering's max_session_ttl 8h caps the certificate: {left}"
    );
    c.sallyctl(&["rm", "role/access"]).ok();
    c.sallyctl(&["get", "role/access"])
        .fails_with("does not exist");
    let events = c
        .sallyctl(&["audit", "search", "--type", "role.delete"])
        .ok()
        .stdout;
    assert!(events.contains("\"access\""), "{events}");
    // The name it had before the catalogue (`role.deleted`) finds it too, so saved queries
    // keep working; a name that never was an event is an error, not an empty answer.
    let old = c
        .sallyctl(&["audit", "search", "--type", "role.deleted"])
        .ok()
        .stdout;
    assert_eq!(old, events);
    c.sallyctl(&["audit", "search", "--type", "role.removed"])
        .fails_with("\"role.removed\" is not an audit event type; the types are: user.create, ");
}

#[test]
fn access_check_explains_decisions() {
    let c = Cluster::start();
    c.sallyctl(&["create", &repo_file("config/roles/environments.yaml")])
        .ok();
    c.sallyctl(&["create", &repo_file("config/roles/kube-developer.yaml")])
        .ok();
    c.add_user("alice", "engineering", "alice");
    c.add_user("kim", "kube-developer", "");
    c.sallyctl(&[
        "nodes",
        "add",
        "--name",
        "web1",
        "--addr",
        "127.0.0.1:22",
        "--labels",
        "env=staging,team=web",
    ])
    .ok();
    c.sallyctl(&[
        "nodes",
        "add",
        "--name",
        "db1",
        "--addr",
        "127.0.0.1:22",
        "--labels",
        "env=prod,team=db",
    ])
    .ok();
    c.sallyctl(&["nodes", "add", "--name", "web1", "--addr", "127.0.0.1:22"])
        .fails_with("already exists");

    let check = |args: &[&str]| {
        let mut all = vec!["access", "check"];
        all.extend_from_slice(args);
        c.sallyctl(&all)
    };
    let ok = check(&["--user", "alice", "--node", "web1", "--login", "alice"]).ok();
    assert!(
        ok.stdout
            .starts_with("allowed: role engineering allows login alice"),
        "{}",
        ok.stdout
    );
    let denied = check(&["--user", "alice", "--node", "db1", "--login", "alice"]);
    assert_eq!(denied.code, 1);
    assert!(
        denied
            .stdout
            .contains("denied: role engineering denies nodes with labels env=prod"),
        "{}",
        denied.stdout
    );
    check(&["--user", "alice", "--node", "web1", "--login", "root"])
        .fails_with("role engineering denies login root");
    check(&["--user", "alice", "--node", "web1", "--login", "postgres"])
        .fails_with("no role allows login postgres");
    check(&["--user", "alice", "--node", "nowhere", "--login", "alice"])
        .fails_with("node nowhere is not registered");
    let kube = check(&[
        "--user",
        "kim",
        "--kube-cluster",
        "c1",
        "--kube-labels",
        "env=staging",
        "--kube-resource",
        "pod/staging-web/web-1",
        "--verb",
        "exec",
    ])
    .ok();
    assert!(
        kube.stdout
            .contains("allowed: role kube-developer allows `exec`"),
        "{}",
        kube.stdout
    );
    check(&[
        "--user",
        "kim",
        "--kube-labels",
        "env=staging",
        "--kube-resource",
        "secret/staging-web/db",
        "--verb",
        "get",
    ])
    .fails_with("role kube-developer denies `get`");
    check(&["--user", "kim", "--kube-resource", "pod/x", "--verb", "get"])
        .fails_with("kind/namespace/name");

    // Nodes a user's roles do not reach are not even listed to them.
    let home = c.user("eve", "engineering", "eve");
    let ls = c.sallyctl_as(&home, &["nodes", "ls"]).ok().stdout;
    // By the name column: a node's random id may hold "db1" too (17db161e-…).
    let names: Vec<&str> = ls
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["web1"], "{ls}");
}

#[test]
fn edit_validates_before_saving() {
    let c = Cluster::start();
    c.sallyctl(&["create", &repo_file("config/roles/environments.yaml")])
        .ok();
    let run_edit = |editor: &str| {
        run(
            Command::new(bin("sallyctl"))
                .arg("--data-dir")
                .arg(c.data_dir())
                .args(["edit", "role/engineering"])
                .env("EDITOR", editor)
                .env("TMPDIR", c.dir.path()),
            "",
        )
    };
    run_edit("sed -i s/max_session_ttl:\\ 8h/max_session_ttl:\\ 4h/").ok();
    let yaml = c
        .sallyctl(&["get", "role/engineering", "--format", "yaml"])
        .ok()
        .stdout;
    assert!(yaml.contains("max_session_ttl: 4h"), "{yaml}");
    let bad = run_edit("sed -i s/max_session_ttl:\\ 4h/max_session_ttl:\\ soon/");
    let bad = bad
        .fails_with("invalid duration")
        .fails_with("nothing was saved; your edit is kept in");
    let kept = bad
        .stderr
        .split("kept in ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string();
    assert!(
        std::fs::read_to_string(&kept).unwrap().contains("soon"),
        "the edit is not lost"
    );
    let yaml = c
        .sallyctl(&["get", "role/engineering", "--format", "yaml"])
        .ok()
        .stdout;
    assert!(
        yaml.contains("max_session_ttl: 4h"),
        "nothing was saved: {yaml}"
    );
    run_edit("true").ok().stdout.contains("no changes");
}

#[test]
fn roles_api_is_guarded_and_tokens_never_show_secrets() {
    let c = Cluster::start();
    let home = c.user("ann", "access", "ann");
    let f = repo_file("config/roles/auditor.yaml");
    c.sallyctl_as(&home, &["create", &f])
        .fails_with("access denied: role access lacks `create` on `role`");
    c.sallyctl_as(&home, &["get", "roles"])
        .fails_with("lacks `list` on `role`");
    let token = c.add_user("pending", "access", "");
    let tokens = c
        .sallyctl(&["get", "tokens", "--format", "json"])
        .ok()
        .stdout;
    assert!(
        tokens.contains("\"pending\"") && tokens.contains("\"signup\""),
        "{tokens}"
    );
    assert!(
        !tokens.contains(&token),
        "a token's secret is never shown again"
    );
}

#[test]
fn deny_login_patterns_are_refused_rather_than_denying_nothing() {
    let c = Cluster::start();
    let f = c.dir.path().join("deny.yaml");
    std::fs::write(
        &f,
        "kind: role\nversion: v1\nmetadata: {name: no-ro}\nspec:\n  deny:\n    logins: ['ro*']\n",
    )
    .unwrap();
    let r = c
        .sallyctl(&["create", &f.display().to_string()])
        .fails_with("spec.deny.logins")
        .fails_with("\"ro*\": denied logins are names, or `*` for every login, not patterns");
    assert_eq!(r.code, 1);
    c.sallyctl(&["get", "role/no-ro"])
        .fails_with("does not exist");
}
