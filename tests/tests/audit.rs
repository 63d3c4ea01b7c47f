//! The audit log: search filters, and the hash chain finding edits and deletions.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

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

/// A cluster whose audit checkpoints come at `every` records and `interval`.
fn anchored_cluster(every: u32, interval: &str) -> Cluster {
    Cluster::start_with(Options {
        auth_service: vec![format!(
            "audit: {{checkpoint_every: {every}, checkpoint_interval: {interval}}}"
        )],
        ..Options::default()
    })
}

/// The attacker who knows the chain's public formula: rewrites record `seq` (replacing `old`
/// with `new` in it), re-hashes every record after it and moves the chain head to match.
const REHASH: &str = r#"
import hashlib, json, sqlite3, sys
db, seq, old, new = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = sqlite3.connect(db)
def digest(rec):
    body = json.dumps({k: v for k, v in rec.items() if k != "hash"}, sort_keys=True,
                      separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256((rec["prev_hash"] + "\n" + body).encode()).hexdigest()
prev = None
for s, text in c.execute("SELECT seq, record FROM audit_events ORDER BY seq").fetchall():
    rec = json.loads(text)
    assert digest(rec) == rec["hash"], "the formula is known"
    if s == seq:
        rec = json.loads(text.replace(old, new))
    if s >= seq:
        rec["prev_hash"] = prev
        rec["hash"] = digest(rec)
        c.execute("UPDATE audit_events SET record = ?, hash = ? WHERE seq = ?",
                  (json.dumps(rec, separators=(",", ":"), ensure_ascii=False), rec["hash"], s))
    prev = rec["hash"]
    last = s
# Then, optionally, filler records of the writer's own appended past the head, chained.
for i in range(int(sys.argv[5]) if len(sys.argv) > 5 else 0):
    last += 1
    rec = {"event": "user.login", "time": "2026-01-01T00:00:00Z", "uid": "filler-%d" % last,
           "cluster_name": "test", "user": "filler", "v": 1, "success": True, "seq": last,
           "prev_hash": prev}
    rec["hash"] = digest(rec)
    c.execute("INSERT INTO audit_events (seq, time, event_type, user_name, record, hash) VALUES (?, 0, ?, ?, ?, ?)",
              (last, rec["event"], rec["user"], json.dumps(rec, separators=(",", ":")), rec["hash"]))
    prev = rec["hash"]
c.execute("UPDATE cluster_state SET value = ? WHERE key = 'audit_head'", ("%d:%s" % (last, prev),))
c.commit()
"#;

fn rehash(c: &Cluster, seq: i64, old: &str, new: &str) {
    rehash_and_append(c, seq, old, new, 0);
}

/// As [`rehash`], then appends `filler` chained records of the writer's own past the head.
fn rehash_and_append(c: &Cluster, seq: i64, old: &str, new: &str, filler: usize) {
    let out = std::process::Command::new("python3")
        .args(["-c", REHASH])
        .arg(c.data_dir().join("sallyport.db"))
        .args([&seq.to_string(), old, new, &filler.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn verify_fails(c: &Cluster, needle: &str, first_bad: i64) {
    let r = c.sallyctl(&["audit", "verify"]);
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert!(
        r.stdout.contains("audit log TAMPERED: ")
            && r.stdout.contains(needle)
            && r.stdout
                .contains(&format!("(first bad record: {first_bad})")),
        "{needle:?} / first bad record {first_bad} not in {}",
        r.stdout
    );
}

/// The number in "N not yet anchored" of a verify that passed.
fn pending(c: &Cluster) -> u64 {
    let out = c.sallyctl(&["audit", "verify"]).ok().stdout;
    assert!(out.contains("records, chain intact;"), "{out}");
    let before = out.split(" not yet anchored").next().unwrap();
    before.rsplit(' ').next().unwrap().parse().unwrap()
}

#[test]
fn checkpoints_are_signed_with_a_key_outside_the_database() {
    let mut c = anchored_cluster(1000, "1h");
    c.wait_online("local1");
    c.add_user("k1", "access", "");
    // Nothing is due yet: every record is reported as not anchored.
    let out = c.sallyctl(&["audit", "verify"]).ok().stdout;
    assert!(
        out.contains("records, chain intact; 0 anchored by 0 signed checkpoints (key SHA256:"),
        "{out}"
    );
    assert!(pending(&c) >= 3, "{out}");
    // A search says so too, on stderr: its JSON lines stay what scripts parse.
    let r = c.sallyctl(&["audit", "search"]).ok();
    let first = r.stdout.lines().next().unwrap();
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(first).unwrap()["seq"],
        1
    );
    let n = r.stdout.lines().count();
    assert_eq!(
        r.stderr.trim(),
        format!(
            "warning: records from seq 1 on ({n} of these) are not yet anchored by a signed checkpoint: they link to the chain head, but a database writer could still rewrite them until auth signs one (within its checkpoint_interval)"
        )
    );

    // The key is a 0600 OpenSSH Ed25519 key in the data dir, and nowhere in the database.
    let key = c.data_dir().join("audit-checkpoint.key");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let fp = run(
        std::process::Command::new("ssh-keygen")
            .arg("-lf")
            .arg(&key),
        "",
    )
    .ok()
    .stdout;
    assert!(fp.contains("(ED25519)"), "{fp}");
    let fp = fp.split_whitespace().nth(1).unwrap().to_string();
    assert!(out.contains(&format!("(key {fp})")), "{out}");
    let secret = std::fs::read_to_string(&key).unwrap();
    let secret_body = secret.lines().nth(1).unwrap();
    let db = std::fs::read(c.data_dir().join("sallyport.db")).unwrap();
    assert!(
        !String::from_utf8_lossy(&db).contains(secret_body),
        "the key is not in the database"
    );

    // A clean shutdown anchors what is pending, and a restart keeps the key.
    c.terminate();
    c.boot();
    c.wait_online("local1");
    let out = c.sallyctl(&["audit", "verify", "--key", &fp]).ok().stdout;
    assert!(out.contains("anchored by 1 signed checkpoint ("), "{out}");

    // An auditor checks a checkpoint with OpenSSH alone, from the message's documented form.
    let dir = c.dir.path();
    let row = std::process::Command::new("python3")
        .args(["-c", "import sqlite3,sys,json; c=sqlite3.connect(sys.argv[1]); print(json.dumps(c.execute('SELECT seq, hash, time, prev_seq, signature FROM audit_checkpoints').fetchone()))"])
        .arg(c.data_dir().join("sallyport.db"))
        .output()
        .unwrap();
    let row: serde_json::Value = serde_json::from_slice(&row.stdout).unwrap();
    let message = format!(
        "sallyport audit checkpoint v1\ncluster test\nseq {}\nhash {}\ntime {}\nprevious {}\n",
        row[0],
        row[1].as_str().unwrap(),
        row[2],
        row[3]
    );
    std::fs::write(dir.join("checkpoint.sig"), row[4].as_str().unwrap()).unwrap();
    let public = run(
        std::process::Command::new("ssh-keygen")
            .arg("-yf")
            .arg(&key),
        "",
    )
    .ok()
    .stdout;
    std::fs::write(dir.join("allowed_signers"), format!("audit {public}")).unwrap();
    let checked = run(
        std::process::Command::new("ssh-keygen")
            .args([
                "-Y",
                "verify",
                "-I",
                "audit",
                "-n",
                "sallyport-audit-checkpoint",
                "-f",
            ])
            .arg(dir.join("allowed_signers"))
            .arg("-s")
            .arg(dir.join("checkpoint.sig")),
        &message,
    );
    assert!(
        format!("{}{}", checked.stdout, checked.stderr)
            .contains("Good \"sallyport-audit-checkpoint\" signature for audit"),
        "{} {}",
        checked.stdout,
        checked.stderr
    );

    // A pinned key that is not the one in use is refused.
    c.sallyctl(&["audit", "verify", "--key", "SHA256:AAAA"])
        .fails_with("audit log NOT VERIFIED: its checkpoints are checked with key");

    // At most an interval after a record is written, it is anchored.
    let config = std::fs::read_to_string(&c.config).unwrap();
    std::fs::write(
        &c.config,
        config.replace("checkpoint_interval: 1h", "checkpoint_interval: 1s"),
    )
    .unwrap();
    c.stop();
    c.boot();
    c.add_user("k2", "access", "");
    assert!(eventually(Duration::from_secs(10), || pending(&c) == 0));
}

#[test]
fn a_rewritten_and_rehashed_chain_fails_against_its_checkpoints() {
    let c = anchored_cluster(1, "1h");
    c.wait_online("local1");
    for name in ["r1", "r2", "r3", "r4"] {
        c.add_user(name, "access", "");
    }
    assert_eq!(pending(&c), 0, "a checkpoint at every record");

    // The database writer rewrites who was created and re-hashes the rest of the chain: the
    // chain alone is consistent again, but record `seq` no longer has the hash auth signed.
    let seq = seq_of(&c, "r2");
    rehash(&c, seq, "\"r2\"", "\"zz\"");
    verify_fails(
        &c,
        &format!(
            "record {seq} was changed and the chain re-hashed: record {seq} does not have the hash checkpoint {seq} signed at"
        ),
        seq,
    );

    // Making the checkpoints agree needs the key: a checkpoint edited to fit is found.
    c.sqlite(
        "UPDATE audit_checkpoints SET hash = (SELECT hash FROM audit_events e WHERE e.seq = audit_checkpoints.seq);",
    );
    verify_fails(
        &c,
        &format!("checkpoint {seq} is not signed by the checkpoint key SHA256:"),
        seq,
    );
}

#[test]
fn removed_checkpoints_and_a_cut_tail_are_found() {
    let c = anchored_cluster(1, "1h");
    c.wait_online("local1");
    for name in ["t1", "t2", "t3", "t4"] {
        c.add_user(name, "access", "");
    }
    let mid = seq_of(&c, "t2");
    let last = seq_of(&c, "t4");
    assert_eq!(pending(&c), 0);

    // One checkpoint removed from the middle.
    c.sqlite(&format!(
        "CREATE TABLE saved AS SELECT * FROM audit_checkpoints;
         DELETE FROM audit_checkpoints WHERE seq = {mid};"
    ));
    verify_fails(
        &c,
        &format!(
            "checkpoint {} follows checkpoint {mid}, which is missing: checkpoints were removed from the database",
            mid + 1
        ),
        mid,
    );
    c.sqlite("DELETE FROM audit_checkpoints; INSERT INTO audit_checkpoints SELECT * FROM saved;");
    assert_eq!(pending(&c), 0);

    // The tail cut below a checkpoint, the chain head moved to match.
    let cut = mid;
    c.sqlite(&format!(
        "DELETE FROM audit_events WHERE seq > {cut};
         UPDATE cluster_state SET value = (SELECT seq || ':' || hash FROM audit_events WHERE seq = {cut})
           WHERE key = 'audit_head';"
    ));
    verify_fails(
        &c,
        &format!(
            "the log ends at record {cut} but checkpoint {} signed record {}",
            cut + 1,
            cut + 1
        ),
        cut + 1,
    );
    // ...and the checkpoints after it removed too: auth remembers the last one it signed.
    c.sqlite(&format!("DELETE FROM audit_checkpoints WHERE seq > {cut};"));
    verify_fails(
        &c,
        &format!(
            "is missing from the database, whose last checkpoint is {cut}: checkpoints were removed and the log cut back to record {cut}"
        ),
        cut + 1,
    );
    assert!(last > cut);
}

/// One value from the cluster's SQLite database.
fn query(c: &Cluster, sql: &str) -> String {
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchone()[0])",
        ])
        .arg(c.data_dir().join("sallyport.db"))
        .arg(sql)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The seq of the last checkpoint auth signed, from its own copy in the data dir.
fn remembered_seq(c: &Cluster) -> i64 {
    let text = std::fs::read_to_string(c.data_dir().join("audit-checkpoint.last")).unwrap();
    serde_json::from_str::<serde_json::Value>(&text).unwrap()["seq"]
        .as_i64()
        .unwrap()
}

/// Long enough for auth's background signer (interval 1s) to have run twice.
const SIGNER_RAN: Duration = Duration::from_secs(3);

#[test]
fn auth_does_not_sign_over_removed_checkpoints() {
    let c = anchored_cluster(1, "1s");
    c.wait_online("local1");
    for name in ["w1", "w2", "w3", "w4"] {
        c.add_user(name, "access", "");
    }
    assert_eq!(pending(&c), 0);
    let seq = seq_of(&c, "w2");

    // The writer removes every checkpoint, rewrites a record and re-hashes the chain to GENESIS,
    // then gives auth time to sign again. It must not: its last checkpoint is gone.
    c.sqlite("DELETE FROM audit_checkpoints;");
    rehash(&c, seq, "\"w2\"", "\"zz\"");
    std::thread::sleep(SIGNER_RAN);
    assert_eq!(query(&c, "SELECT COUNT(*) FROM audit_checkpoints"), "0");
    let removed =
        "is missing from the database, whose last checkpoint is 0: checkpoints were removed";
    verify_fails(&c, removed, 1);
    // ...and `sallyctl status` says that anchoring stopped, without running verify.
    let status = c.sallyctl(&["status"]).ok().stdout;
    assert!(
        status.contains(&format!(
            "Audit anchor:  STOPPED: not signing an audit checkpoint: checkpoint {}, the last this server signed, is missing from the database: checkpoints were removed; run `sallyctl audit verify`",
            remembered_seq(&c)
        )),
        "{status}"
    );

    // Nor once the log has grown past the checkpoint auth remembers, by filler or by itself.
    rehash_and_append(&c, i64::MAX, "", "", 3);
    c.add_user("w5", "access", "");
    std::thread::sleep(SIGNER_RAN);
    assert_eq!(query(&c, "SELECT COUNT(*) FROM audit_checkpoints"), "0");
    verify_fails(&c, removed, 1);
}

#[test]
fn auth_does_not_sign_over_a_cut_tail_with_filler() {
    let c = anchored_cluster(1, "1s");
    c.wait_online("local1");
    for name in ["f1", "f2", "f3", "f4"] {
        c.add_user(name, "access", "");
    }
    assert_eq!(pending(&c), 0);
    let cut = seq_of(&c, "f2");
    let head = remembered_seq(&c);

    // The tail and its checkpoints cut, then chained filler appended past where the log ended,
    // so that nothing is "past the end" any more.
    c.sqlite(&format!(
        "DELETE FROM audit_events WHERE seq > {cut};
         DELETE FROM audit_checkpoints WHERE seq > {cut};
         UPDATE cluster_state SET value = (SELECT seq || ':' || hash FROM audit_events WHERE seq = {cut})
           WHERE key = 'audit_head';"
    ));
    rehash_and_append(
        &c,
        i64::MAX,
        "",
        "",
        usize::try_from(head - cut + 2).unwrap(),
    );
    std::thread::sleep(SIGNER_RAN);
    assert_eq!(
        query(&c, "SELECT MAX(seq) FROM audit_checkpoints"),
        cut.to_string(),
        "no checkpoint signed over the filler"
    );
    verify_fails(&c, &format!("checkpoint {head} (signed at "), cut + 1);
    verify_fails(
        &c,
        &format!(
            "is missing from the database, whose last checkpoint is {cut}: checkpoints were removed"
        ),
        cut + 1,
    );
}

#[test]
fn search_results_are_checked_against_the_signed_chain() {
    let c = anchored_cluster(1, "1h");
    c.wait_online("local1");
    for name in ["s1", "s2", "s3", "s4"] {
        c.add_user(name, "access", "");
    }
    assert_eq!(pending(&c), 0);
    let creates = |name: &str| {
        query(
            &c,
            &format!(
                "SELECT seq FROM audit_events WHERE json_extract(record, '$.event') = 'user.create' AND json_extract(record, '$.name') = '{name}'"
            ),
        )
        .parse::<i64>()
        .unwrap()
    };
    let (s2, s4) = (creates("s2"), creates("s4"));
    // Anchored results: no warning. The newest one's span is now checked and kept.
    let r = c
        .sallyctl(&["audit", "search", "--type", "user.create", "--limit", "1"])
        .ok();
    assert_eq!(r.stdout.lines().count(), 1);
    assert!(r.stderr.is_empty(), "{}", r.stderr);

    // Each record still hashes to its own `hash` after a re-hash; the signed span does not.
    rehash(&c, s2, "\"s2\"", "\"zz\"");
    c.sallyctl(&["audit", "search", "--type", "user.create", "--limit", "3"])
        .fails_with(&format!(
            "audit record {s2} does not match the signed checkpoint {s2} (record {s2} does not have the signed hash): the database was changed and the chain re-hashed; run `sallyctl audit verify`"
        ));
    // A span checked before and kept is no way around it.
    c.sallyctl(&["audit", "search", "--type", "user.create", "--limit", "1"])
        .fails_with(&format!(
            "audit record {s4} is not the one in the checked chain: it was changed in the database; run `sallyctl audit verify`"
        ));
    // Nor is the part no checkpoint covers yet: it must lead from the last one to the head.
    let head_signed = remembered_seq(&c);
    c.add_user("s5", "access", "");
    let head: i64 = query(&c, "SELECT MAX(seq) FROM audit_events")
        .parse()
        .unwrap();
    assert!(head > s4);
    c.sallyctl(&["audit", "search", "--type", "user.create", "--limit", "1"])
        .fails_with(&format!(
            "the audit records after checkpoint {head_signed} do not lead to the chain head (record {} does not follow record {head_signed}): they were changed in the database; run `sallyctl audit verify`",
            head_signed + 1
        ));
}

#[test]
fn search_answers_from_the_records_not_the_side_columns() {
    let c = Cluster::start();
    let _home = c.user("alice", "access", "alice");
    c.login(&_home, "alice", "wrong password")
        .fails_with("invalid");
    assert_eq!(
        events(&c, &["--type", "user.login", "--user", "alice"]).len(),
        2
    );

    // The database writer relabels alice's logins in the columns verify never read.
    c.sqlite(
        "UPDATE audit_events SET user_name = 'mallory', event_type = 'node.join', time = 0
         WHERE user_name = 'alice';",
    );
    assert!(events(&c, &["--user", "mallory"]).is_empty());
    assert!(events(&c, &["--type", "node.join", "--user", "mallory"]).is_empty());
    let logins = events(
        &c,
        &["--type", "user.login", "--user", "alice", "--since", "1h"],
    );
    assert_eq!(logins.len(), 2, "{logins:?}");
    assert!(logins.iter().all(|e| e["user"] == "alice"));

    // A record edited in place is not handed out as evidence.
    let seq = logins[0]["seq"].as_i64().unwrap();
    c.sqlite(&format!(
        "UPDATE audit_events SET record = replace(record, '\"success\":true', '\"success\":false') WHERE seq = {seq};"
    ));
    c.sallyctl(&["audit", "search", "--user", "alice"]).fails_with(&format!(
        "audit record {seq} fails its hash check: it was changed in the database; run `sallyctl audit verify`"
    ));
}

/// Runs `cmd` with its standard output closed before it writes, as `| head -1` leaves it once
/// it has its line.
fn with_stdout_closed(cmd: &mut std::process::Command) -> std::process::Output {
    use std::process::Stdio;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    child.wait_with_output().unwrap()
}

#[test]
fn clients_end_quietly_on_a_closed_pipe() {
    let c = Cluster::start();
    let home = c.user("alice", "access", "alice");
    let sally = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bin("sally"));
        cmd.env("SALLY_HOME", &home).env("HOME", &home).args(args);
        cmd
    };
    let mut sallyctl = std::process::Command::new(bin("sallyctl"));
    sallyctl
        .arg("--data-dir")
        .arg(c.data_dir())
        .args(["audit", "search"]);
    let mut configure = std::process::Command::new(bin("sallyport"));
    configure.arg("configure");
    for (name, mut cmd) in [
        ("sally recordings ls", sally(&["recordings", "ls"])),
        (
            "sally recordings ls --format json",
            sally(&["recordings", "ls", "--format", "json"]),
        ),
        ("sally status", sally(&["status"])),
        ("sallyctl audit search", sallyctl),
        ("sallyport configure", configure),
    ] {
        let out = with_stdout_closed(&mut cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(0) && stderr.is_empty(),
            "{name}: {:?} {stderr}",
            out.status
        );
    }
}

/// The events and fields `docs/audit.md` documents (its table is generated from
/// `core/src/audit/catalogue.rs`, and a unit test keeps the two equal): event → fields, and
/// the fields every record has.
fn documented() -> (std::collections::BTreeMap<String, Vec<String>>, Vec<String>) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/audit.md");
    let text = std::fs::read_to_string(&path).unwrap();
    let ticked = |cell: &str| -> Vec<String> {
        cell.split("<br>")
            .filter_map(|item| item.trim().strip_prefix('`')?.split('`').next())
            .map(str::to_string)
            .collect()
    };
    let (mut events, mut common) = (std::collections::BTreeMap::new(), vec![]);
    let mut section = 0;
    for line in text.lines() {
        if line.starts_with("Every record also has these fields") {
            section = 1;
        } else if line.starts_with("Renamed events") {
            section = 2;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(name) = cells[0]
            .strip_prefix("| `")
            .and_then(|c| c.strip_suffix('`'))
        else {
            continue;
        };
        match section {
            0 if cells.len() == 3 => {
                events.insert(name.to_string(), ticked(cells[2].trim_end_matches(" |")));
            }
            1 => common.push(name.to_string()),
            _ => {}
        }
    }
    (events, common)
}

/// Every record a cluster writes is an event `docs/audit.md` documents, with only the fields it
/// documents for that event: the auditors' reference cannot fall behind what is written.
#[test]
fn every_record_is_documented_in_docs_audit_md() {
    let (documented, common) = documented();
    assert!(documented.len() > 20 && common.contains(&"hash".to_string()));
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    c.login(&home, "alice", "wrong password")
        .fails_with("invalid");
    let cfg = c.ssh_config(&home, "alice");
    c.ssh(&cfg, &["root@local1", "true"], "").ok();
    c.ssh(&cfg, &["nobody@local1", "true"], "")
        .fails_with("no role allows login nobody");
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: ops}\nspec:\n  allow:\n    logins: [ops]\n",
    )
    .ok();
    c.sallyctl(&["rm", "role/ops"]).ok();
    c.sallyctl(&["lock", "--user", "alice", "--ttl", "1h"]).ok();
    c.sallyctl(&["tokens", "add", "--type", "node"]).ok();
    c.sallyctl(&["nodes", "add", "--name", "web9", "--addr", "127.0.0.1:22"])
        .ok();
    c.sallyctl(&["nodes", "rm", "web9"]).ok();
    let all = events(&c, &[]);
    let mut seen = std::collections::BTreeSet::new();
    for e in &all {
        let name = e["event"].as_str().unwrap();
        let Some(fields) = documented.get(name) else {
            panic!("{name} is not in docs/audit.md: {e}");
        };
        for key in e.as_object().unwrap().keys() {
            assert!(
                fields.contains(key) || common.contains(key),
                "{name}: field {key} is not in docs/audit.md: {e}"
            );
        }
        seen.insert(name);
    }
    for want in [
        "user.create",
        "user.signup",
        "user.login",
        "session.start",
        "exec",
        "session.end",
        "session.reject",
        "role.create",
        "role.delete",
        "lock.create",
        "token.create",
        "node.create",
        "node.delete",
        "node.join",
    ] {
        assert!(seen.contains(want), "no {want} among {seen:?}");
    }
}
