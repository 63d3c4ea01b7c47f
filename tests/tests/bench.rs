//! `sally bench ssh` against a real cluster: the counts and JSON fields a script reads, the
//! errors of sessions the proxy refuses, the concurrency cap's skips, and bad flags.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sallyport_tests::*;

fn json(r: &Run) -> serde_json::Value {
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {r:?}"))
}

#[test]
fn sally_bench_ssh_reports_sessions_errors_and_latency() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("bea", "access", "root");

    // 4 a second for 2 seconds: 8 sessions, each its own connection, all ok.
    let r = c
        .sally(
            &home,
            &[
                "bench",
                "ssh",
                "--rate",
                "4",
                "--duration",
                "2s",
                "--format",
                "json",
                "root@local1",
                "echo",
                "hi",
            ],
            "",
        )
        .ok();
    let j = json(&r);
    assert_eq!(j["scheduled"], 8, "{j}");
    assert_eq!(j["ok"], 8, "{j}");
    assert_eq!(j["errors"], 0, "{j}");
    assert_eq!(j["skipped"], 0, "{j}");
    assert_eq!(j["rate"], 4, "{j}");
    assert_eq!(j["error_messages"], serde_json::json!([]), "{j}");
    assert!(j["sessions_per_sec"].as_f64().unwrap() > 0.0, "{j}");
    let lat = |k: &str| j["latency_ms"][k].as_f64().unwrap();
    assert!(lat("p50") > 0.0, "{j}");
    assert!(
        lat("p50") <= lat("p90") && lat("p90") <= lat("p99") && lat("p99") <= lat("max"),
        "{j}"
    );
    // Each session reached the node: eight session starts audited for bea.
    let starts = || {
        c.events("session.start")
            .into_iter()
            .filter(|e| e["user"] == "bea")
            .count()
    };
    assert!(
        eventually(Duration::from_secs(10), || starts() == 8),
        "{} session starts audited, not 8",
        starts()
    );

    // The text report says the same.
    let r = c
        .sally(
            &home,
            &[
                "bench",
                "ssh",
                "--rate",
                "2",
                "--duration",
                "1s",
                "root@local1",
                "true",
            ],
            "",
        )
        .ok();
    assert!(r.stdout.contains(" sessions/s"), "{r:?}");
    assert!(
        r.stdout.contains("2 scheduled, 2 ok, 0 errors, 0 skipped"),
        "{r:?}"
    );
    assert!(r.stdout.contains("p99 "), "{r:?}");

    // A login the roles do not allow: every session is an error, with the proxy's reason, and
    // no latency (only sessions that succeeded have one).
    let r = c
        .sally(
            &home,
            &[
                "bench",
                "ssh",
                "--rate",
                "2",
                "--duration",
                "1s",
                "--format",
                "json",
                "nobody@local1",
                "true",
            ],
            "",
        )
        .ok();
    let j = json(&r);
    assert_eq!(j["ok"], 0, "{j}");
    assert_eq!(j["errors"], 2, "{j}");
    assert_eq!(j["error_messages"][0]["count"], 2, "{j}");
    assert!(
        j["error_messages"][0]["message"]
            .as_str()
            .unwrap()
            .contains("no role allows login nobody"),
        "{j}"
    );
    assert!(j["latency_ms"]["p50"].is_null(), "{j}");

    // A command that fails is an error too, with its status.
    let r = c
        .sally(
            &home,
            &[
                "bench",
                "ssh",
                "--rate",
                "1",
                "--duration",
                "1s",
                "--format",
                "json",
                "root@local1",
                "exit 3",
            ],
            "",
        )
        .ok();
    let j = json(&r);
    assert_eq!(j["errors"], 1, "{j}");
    assert!(
        j["error_messages"][0]["message"]
            .as_str()
            .unwrap()
            .contains("exited with status 3"),
        "{j}"
    );

    // The concurrency cap: one session in flight at most, each taking 2 s, 10 due in a
    // second: the first runs, the nine others are skipped (not errors).
    let r = c
        .sally(
            &home,
            &[
                "bench",
                "ssh",
                "--rate",
                "10",
                "--duration",
                "1s",
                "--concurrency",
                "1",
                "--format",
                "json",
                "root@local1",
                "sleep",
                "2",
            ],
            "",
        )
        .ok();
    let j = json(&r);
    assert_eq!(j["scheduled"], 10, "{j}");
    assert_eq!(j["ok"], 1, "{j}");
    assert_eq!(j["skipped"], 9, "{j}");
    assert_eq!(j["errors"], 0, "{j}");
    assert!(j["latency_ms"]["p50"].as_f64().unwrap() >= 2000.0, "{j}");
}

#[test]
fn sally_bench_ssh_refuses_bad_flags() {
    let c = Cluster::start();
    let home = c.user("ben", "access", "root");
    let bench = |extra: &[&str]| {
        let mut args = vec!["bench", "ssh"];
        args.extend_from_slice(extra);
        c.sally(&home, &args, "")
    };
    let r = bench(&["--rate", "0", "root@local1", "true"]).fails_with("--rate");
    assert_eq!(r.code, 2, "{r:?}");
    bench(&["--rate", "fast", "root@local1", "true"]).fails_with("--rate");
    bench(&["--concurrency", "0", "root@local1", "true"]).fails_with("--concurrency");
    let r = bench(&["--duration", "soon", "root@local1", "true"]).fails_with("--duration");
    assert_eq!(r.code, 1, "{r:?}");
    bench(&["--duration", "0s", "root@local1", "true"]).fails_with("--duration");
    // A command is required.
    let r = bench(&["root@local1"]).fails_with("<COMMAND>");
    assert_eq!(r.code, 2, "{r:?}");
    // Not logged in: said, before any session.
    let nobody = tempfile::TempDir::new().unwrap();
    c.sally(nobody.path(), &["bench", "ssh", "root@local1", "true"], "")
        .fails_with("sally login");
}
