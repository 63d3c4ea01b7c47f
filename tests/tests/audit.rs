//! The audit log: search filters, and the hash chain finding edits and deletions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sallyport_tests::*;

fn events(c: &Cluster, args: &[&str]) -> Vec<serde_json::Value> {
    let mut all = vec!["audit", "search"];
    all.extend_from_slice(args);
    c.sallyctl(&all)
        .ok()
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn search_filters_and_record_shape() {
    let c = Cluster::start();
    let home = c.user("alice", "access", "alice");
    c.login(&home, "alice", "wrong password")
        .fails_with("invalid");
    let all = events(&c, &[]);
    assert!(all.len() >= 4, "{all:?}");
    for e in &all {
        for field in [
            "event",
            "time",
            "uid",
            "cluster_name",
            "seq",
            "hash",
            "prev_hash",
        ] {
            assert!(!e[field].is_null(), "{field} missing in {e}");
        }
        assert_eq!(e["cluster_name"], "test");
    }
    let logins = events(&c, &["--type", "user.login", "--user", "alice"]);
    assert_eq!(logins.len(), 2, "{logins:?}");
    assert_eq!(logins[0]["success"], true);
    assert_eq!(logins[1]["success"], false);
    assert!(
        logins[1]["error"]
            .as_str()
            .unwrap()
            .contains("invalid user name or password")
    );
    assert!(events(&c, &["--user", "nobody"]).is_empty());
    assert_eq!(events(&c, &["--since", "1h"]).len(), all.len());
    c.sallyctl(&["audit", "search", "--since", "yesterday"])
        .fails_with("--since");
    let text = c
        .sallyctl(&["audit", "search", "--format", "text"])
        .ok()
        .stdout;
    assert!(
        text.contains("user.login") && text.contains("FAILED"),
        "{text}"
    );
}

/// The seq of the `user.create` event for `name`.
fn seq_of(c: &Cluster, name: &str) -> i64 {
    events(c, &["--type", "user.create"])
        .iter()
        .find(|e| e["name"] == name)
        .unwrap()["seq"]
        .as_i64()
        .unwrap()
}

#[test]
fn verify_finds_edits_and_deletions() {
    let c = Cluster::start();
    c.wait_online("local1");
    for name in ["a1", "a2", "a3", "a4"] {
        c.add_user(name, "access", "");
    }
    let ok = c.sallyctl(&["audit", "verify"]).ok();
    assert!(ok.stdout.contains("records, chain intact"), "{}", ok.stdout);

    // An attacker with the database rewrites who did something.
    let seq = seq_of(&c, "a2");
    c.sqlite(&format!(
        "UPDATE audit_events SET record = replace(record, '\"a2\"', '\"zz\"') WHERE seq = {seq};"
    ));
    let r = c.sallyctl(&["audit", "verify"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stdout.contains(&format!("record {seq} was edited"))
            && r.stdout.contains(&format!("first bad record: {seq}")),
        "{}",
        r.stdout
    );
}

#[test]
fn verify_finds_removed_records_in_the_middle_and_at_the_end() {
    let c = Cluster::start();
    c.wait_online("local1");
    for name in ["b1", "b2", "b3", "b4"] {
        c.add_user(name, "access", "");
    }
    let last = seq_of(&c, "b4");
    c.sqlite(&format!("DELETE FROM audit_events WHERE seq = {last};"));
    let r = c.sallyctl(&["audit", "verify"]);
    assert_eq!(r.code, 1);
    assert!(r.stdout.contains("removed from the end"), "{}", r.stdout);

    let c = Cluster::start();
    c.wait_online("local1");
    for name in ["b1", "b2", "b3", "b4"] {
        c.add_user(name, "access", "");
    }
    let middle = seq_of(&c, "b2");
    c.sqlite(&format!("DELETE FROM audit_events WHERE seq = {middle};"));
    let r = c.sallyctl(&["audit", "verify"]);
    assert_eq!(r.code, 1);
    assert!(
        r.stdout.contains(&format!("record {middle} is missing")),
        "{}",
        r.stdout
    );
}
