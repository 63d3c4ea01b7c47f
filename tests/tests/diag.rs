//! The diagnostics listener as an operator's Prometheus and load balancer see it: `/metrics`
//! scraped while tunnels connect and sessions run and are refused, `/readyz` turning 503 when
//! the database or the proxy goes away, and no listener at all unless one is configured.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::{Agent, Cluster, Options, eventually, http_get, pg};

fn diag_cluster(o: Options) -> Cluster {
    Cluster::start_with(Options {
        diag_addr: Some("127.0.0.1:0".into()),
        ..o
    })
}

/// `/metrics`, checked to be the Prometheus text format: every line a `# HELP`/`# TYPE`
/// comment or a sample `name{labels} value`.
fn scrape(diag: &str) -> String {
    let (status, text) = http_get(diag, "/metrics");
    assert_eq!(status, 200, "{text}");
    for line in text.lines() {
        if let Some(comment) = line.strip_prefix("# ") {
            assert!(
                comment.starts_with("HELP sallyport_") || comment.starts_with("TYPE sallyport_"),
                "{line}"
            );
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("not a sample: {line:?}"));
        assert!(value.parse::<f64>().is_ok(), "value of {line:?}");
        let (name, labels) = series.split_once('{').unwrap_or((series, "}"));
        assert!(
            name.starts_with("sallyport_")
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "name of {line:?}"
        );
        let labels = labels
            .strip_suffix('}')
            .unwrap_or_else(|| panic!("labels of {line:?}"));
        for pair in labels.split("\",").filter(|p| !p.is_empty()) {
            let (key, value) = pair
                .split_once("=\"")
                .unwrap_or_else(|| panic!("label {pair:?} of {line:?}"));
            assert!(
                key.chars().all(|c| c.is_ascii_lowercase() || c == '_'),
                "{line:?}"
            );
            assert!(!value.contains('\n'), "{line:?}");
        }
    }
    text
}

/// The value of one series (`name{labels}` exactly as printed); 0 when it is not there yet.
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or(0.0)
}

/// The sum of every series of `name` whose labels contain `having`.
fn total(text: &str, name: &str, having: &str) -> f64 {
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, v) = rest.rsplit_once(' ')?;
            labels.contains(having).then(|| v.parse::<f64>().ok())?
        })
        .sum()
}

const ACTIVE_SSH: &str = r#"sallyport_sessions_active{door="ssh"}"#;
const STARTED_SSH: &str = r#"sallyport_sessions_started_total{door="ssh"}"#;
const DENIED_SSH: &str = r#"sallyport_sessions_rejected_total{door="ssh",reason="denied"}"#;

#[test]
fn metrics_follow_tunnels_sessions_refusals_and_calls_to_auth() {
    let c = diag_cluster(Options::default());
    let diag = c.diag.clone().expect("a `diag` line in the banner");
    c.wait_online("local1");
    // The all-in-one's own agent holds one tunnel.
    assert!(
        eventually(Duration::from_secs(30), || value(
            &scrape(&diag),
            r#"sallyport_tunnels_connected{kind="node"}"#
        ) == 1.0),
        "{}",
        scrape(&diag)
    );
    assert_eq!(
        value(
            &scrape(&diag),
            r#"sallyport_tunnels_connected{kind="kube"}"#
        ),
        0.0
    );
    assert_eq!(http_get(&diag, "/healthz"), (200, "ok\n".into()));
    assert_eq!(http_get(&diag, "/readyz"), (200, "ready\n".into()));

    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let before = scrape(&diag);
    let grants = |t: &str| {
        total(
            t,
            "sallyport_auth_request_duration_seconds_count",
            r#"method="POST",route="/v1/sessions",status="2xx""#,
        )
    };
    let client_grants = |t: &str| {
        total(
            t,
            "sallyport_auth_client_request_duration_seconds_count",
            r#"method="POST",route="/v1/sessions",status="2xx""#,
        )
    };

    // A session: active while it runs, started once it did.
    let (mut ssh, first) = c.ssh_running(&cfg, &["root@local1", "echo up; cat"]);
    assert_eq!(first, "up");
    assert!(
        eventually(Duration::from_secs(10), || value(
            &scrape(&diag),
            ACTIVE_SSH
        ) == value(&before, ACTIVE_SSH)
            + 1.0),
        "{}",
        scrape(&diag)
    );
    drop(ssh.stdin.take());
    assert!(ssh.wait().unwrap().success());
    assert!(
        eventually(Duration::from_secs(10), || value(
            &scrape(&diag),
            ACTIVE_SSH
        ) == value(&before, ACTIVE_SSH)),
        "{}",
        scrape(&diag)
    );
    let after = scrape(&diag);
    assert_eq!(
        value(&after, STARTED_SSH),
        value(&before, STARTED_SSH) + 1.0
    );
    // Its grant was timed on both sides of the call, under the route's pattern.
    assert!(grants(&after) > grants(&before), "{after}");
    assert!(client_grants(&after) > client_grants(&before), "{after}");
    assert!(
        value(&after, "sallyport_recording_written_bytes_total")
            > value(&before, "sallyport_recording_written_bytes_total"),
        "{after}"
    );

    // A login the roles do not allow: refused, and counted as such.
    c.ssh(&cfg, &["bob@local1", "true"], "")
        .fails_with("no role allows login bob");
    let refused = scrape(&diag);
    assert_eq!(
        value(&refused, DENIED_SSH),
        value(&before, DENIED_SSH) + 1.0
    );
    assert_eq!(value(&refused, STARTED_SSH), value(&after, STARTED_SSH));

    // Concrete paths carry names (a session id, a node); only patterns are labels.
    assert!(
        refused.contains(r#"route="/v1/sessions/{id}/end""#),
        "{refused}"
    );
    for name in ["alice", "bob", "local1", "root"] {
        assert!(
            !refused.contains(name),
            "{name} leaked into the metrics:\n{refused}"
        );
    }

    // Every certificate the process holds, a year from now (less the seconds since start).
    for cert in [
        "auth_tls",
        "proxy_tls",
        "proxy_ssh_host",
        "agent_tls",
        "agent_ssh_host",
    ] {
        let left = value(
            &refused,
            &format!(r#"sallyport_certificate_expiry_seconds{{certificate="{cert}"}}"#),
        );
        assert!(
            (364.0 * 86400.0..=365.0 * 86400.0).contains(&left),
            "{cert}: {left}"
        );
    }
    // The queues that hold audit records are there, and so is the upload backlog the
    // recording store's uploader sets.
    for queue in [
        "proxy_failed_auth",
        "proxy_session_events",
        "proxy_kube_requests",
        "auth_audit_writer",
    ] {
        assert!(
            refused.contains(&format!(
                r#"sallyport_audit_queue_depth{{queue="{queue}"}} "#
            )),
            "{queue}"
        );
    }
    assert!(refused.contains("sallyport_recording_upload_backlog_files 0\n"));
    assert!(refused.contains("sallyport_recording_upload_backlog_bytes 0\n"));
    // Anything else on the listener is not found.
    assert_eq!(http_get(&diag, "/").0, 404);
}

/// `/v1/webapi/ping` is open to anyone, and each ask costs auth two database reads: the proxy
/// asks auth one ask at a time, so callers that ping together share answers (200 pings, 50 at a
/// time, cost auth far fewer than 200 asks), every caller still gets the whole answer, and no
/// caller gets one older than its own ping (a user added just before is seen at once).
#[test]
fn pings_together_share_auths_answers_and_none_is_stale() {
    let c = diag_cluster(Options::default());
    let diag = c.diag.clone().expect("a `diag` line in the banner");
    let asked = |t: &str| {
        total(
            t,
            "sallyport_auth_client_request_duration_seconds_count",
            r#"method="GET",route="/v1/ping""#,
        )
    };
    let url = format!("https://{}/v1/webapi/ping", c.proxy);
    let ping = || {
        let out = Command::new("curl")
            .args(["-sk", &url])
            .output()
            .expect("curl");
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("a JSON answer")
    };
    let before = asked(&scrape(&diag));
    let mut args = vec!["-sk", "--parallel", "--parallel-max", "50"];
    args.extend(std::iter::repeat_n(url.as_str(), 200));
    let out = Command::new("curl").args(&args).output().expect("curl");
    assert!(out.status.success(), "{out:?}");
    let answers = String::from_utf8_lossy(&out.stdout);
    let whole = answers
        .split_inclusive('}')
        .filter(|a| a.contains("\"cluster_name\"") && a.contains("\"ssh_port\""))
        .count();
    assert_eq!(
        whole, 200,
        "every caller gets auth's answer and the doors: {answers}"
    );
    let during = asked(&scrape(&diag)) - before;
    assert!(
        (1.0..=100.0).contains(&during),
        "auth was asked {during} times for 200 pings"
    );
    // Nothing older than the caller's own ping: a user added just before is there.
    assert_eq!(ping()["local_users"], false);
    c.add_user("carol", "access", "root");
    assert_eq!(ping()["local_users"], true);
}

#[test]
fn no_listener_unless_one_is_configured() {
    let c = Cluster::start();
    assert!(c.diag.is_none(), "{}", c.stdout);
    assert!(!c.stdout.contains("diag"), "{}", c.stdout);
    // The daemon listens on its five service ports and nothing else.
    let pid = c.pid().unwrap();
    let out = Command::new("ss").args(["-ltnpH"]).output().unwrap();
    let listening: BTreeSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!("pid={pid},")))
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect();
    let services: BTreeSet<String> = [
        c.auth.clone(),
        c.proxy.clone(),
        format!("127.0.0.1:{}", c.ssh_port),
        c.tunnel.clone(),
        c.kube.clone(),
    ]
    .into();
    assert_eq!(listening, services);
}

/// PostgreSQL goes away under a running all-in-one: not ready (the load balancer stops sending
/// it people), with the reason, while still alive (no restart would help).
#[test]
fn not_ready_when_the_database_is_gone() {
    let db = pg::PgDatabase::create("sp_diag");
    let c = diag_cluster(Options {
        postgres: Some(db.url.clone()),
        ..Options::default()
    });
    let diag = c.diag.clone().unwrap();
    assert_eq!(http_get(&diag, "/readyz"), (200, "ready\n".into()));

    assert!(db.drop_now(), "the database could not be dropped");
    let mut last = (0, String::new());
    assert!(
        eventually(Duration::from_secs(30), || {
            last = http_get(&diag, "/readyz");
            last.0 == 503
        }),
        "{last:?}"
    );
    let (_, why) = &last;
    assert!(why.starts_with("not ready: database: "), "{why}");
    assert!(
        why.contains(&db.name),
        "the reason names what is missing: {why}"
    );
    assert_eq!(why.lines().count(), 1, "{why}");
    assert!(
        !why.contains("sallyport_test@"),
        "no connection string: {why}"
    );
    // Alive, and still measured.
    assert_eq!(http_get(&diag, "/healthz"), (200, "ok\n".into()));
    scrape(&diag);
}

/// An agent process on its own (`--diag-addr` on the command line): ready while its tunnel to
/// the proxy is up, not ready while the proxy is gone.
#[test]
fn an_agent_is_ready_while_its_tunnel_is_up() {
    let mut c = Cluster::start();
    let dir = c.dir.path().join("agent-db1");
    let token = c.join_token();
    let mut child = c
        .agent_command("db1", "env=prod", Some(&token), &dir)
        .args(["--diag-addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let diag = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            Some(
                l.strip_prefix("diag")?
                    .trim()
                    .strip_prefix("http://")?
                    .to_string(),
            )
        })
        .expect("the agent prints where diagnostics listen");
    // Keep reading what the agent prints, so that it never writes into a closed pipe.
    std::thread::spawn(move || lines.for_each(drop));
    let _agent = Agent::new("db1", "env=prod", dir, child);
    c.wait_online("db1");
    assert!(eventually(Duration::from_secs(10), || {
        http_get(&diag, "/readyz") == (200, "ready\n".into())
    }));
    let text = scrape(&diag);
    assert_eq!(
        value(&text, r#"sallyport_agent_tunnel_up{kind="node"}"#),
        1.0
    );
    let left = value(
        &text,
        r#"sallyport_certificate_expiry_seconds{certificate="agent_tls"}"#,
    );
    assert!(left > 300.0 * 86400.0, "{text}");
    // An agent is not a proxy: no proxy certificates, no tunnels of its own.
    assert!(!text.contains("proxy_tls"), "{text}");

    c.stop();
    let mut last = (0, String::new());
    assert!(
        eventually(Duration::from_secs(30), || {
            last = http_get(&diag, "/readyz");
            last.0 == 503
        }),
        "{last:?}"
    );
    assert_eq!(
        last.1,
        "not ready: node tunnel: not connected to the proxy; reconnecting\n"
    );
    assert_eq!(
        value(&scrape(&diag), r#"sallyport_agent_tunnel_up{kind="node"}"#),
        0.0
    );
    assert_eq!(http_get(&diag, "/healthz"), (200, "ok\n".into()));
}
