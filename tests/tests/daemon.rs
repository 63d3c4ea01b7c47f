//! The daemon itself: config errors, the data dir, restarts, the printed default config, and
//! PostgreSQL storage.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;
use std::time::Duration;

use sallyport_tests::*;

fn start_with_config(text: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(&cfg, text).unwrap();
    let r = run(
        Command::new(bin("sallyport"))
            .args(["start", "--config"])
            .arg(&cfg),
        "",
    );
    assert!(
        r.stderr.contains(&cfg.display().to_string()),
        "the file is named: {}",
        r.stderr
    );
    r
}

#[test]
fn malformed_config_is_refused_with_file_line_and_key() {
    start_with_config("version: v1\nauth_service:\n  enabled: true\n  listen_adr: 127.0.0.1:1\n")
        .fails_with("listen_adr")
        .fails_with("line 4");
    start_with_config("version: v1\nproxy_service:\n  web_listen_addr: not-an-address\n")
        .fails_with("web_listen_addr")
        .fails_with("line 3");
    start_with_config("version: v1\nauth_service:\n  authentication:\n    second_factor: sms\n")
        .fails_with("sms")
        .fails_with("line 4");
    start_with_config("version: v2\n").fails_with("version");
    start_with_config("version: v1\nsallyport:\n  storage: {type: postgres}\n")
        .fails_with("conn_string");
}

#[test]
fn unusable_data_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let r = run(
        Command::new(bin("sallyport"))
            .args(["start", "--data-dir"])
            .arg(file.join("data")),
        "",
    );
    r.fails_with("data dir").fails_with("cannot be created");
}

/// `sallyport configure`'s output starts as it is, with every listen address on port 0: the
/// banner says which ports the kernel gave, and everything that dials one of them (the local
/// agent, `sallyctl --data-dir`, the ports `/v1/webapi/ping` advertises) uses those.
#[test]
fn configure_prints_a_config_that_starts_on_port_0() {
    let out = run(Command::new(bin("sallyport")).arg("configure"), "")
        .ok()
        .stdout;
    assert!(out.contains("# "), "commented");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut text = out.replace("/var/lib/sallyport", &data.display().to_string());
    for port in ["3025", "3080", "3023", "3024", "3026"] {
        text = text.replace(&format!("127.0.0.1:{port}"), "127.0.0.1:0");
    }
    let cfg = dir.path().join("sallyport.yaml");
    std::fs::write(&cfg, text).unwrap();
    struct Daemon(std::process::Child);
    impl Drop for Daemon {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut daemon = Daemon(
        Command::new(bin("sallyport"))
            .args(["start", "--config"])
            .arg(&cfg)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = daemon.0.stdout.take().unwrap();
    let banner: Vec<String> = std::io::BufRead::lines(std::io::BufReader::new(stdout))
        .map_while(Result::ok)
        .take_while(|l| !l.starts_with("admin"))
        .collect();
    let text = banner.join("\n");
    assert!(text.contains("cluster  sallyport"), "{text}");
    assert!(text.contains("CA pin   sha256:"), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("kube ")),
        "kube missing: {text}"
    );
    let port = |name: &str| -> u16 {
        let line = text
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("{name} missing: {text}"));
        let port = line.trim().rsplit_once(':').unwrap().1.parse().unwrap();
        assert_ne!(port, 0, "{name} printed port 0: {text}");
        port
    };
    let (auth, web, ssh, tunnel) = (port("auth"), port("web"), port("ssh"), port("tunnel"));
    let ping = run(
        Command::new("curl").args([
            "-sk",
            "--max-time",
            "10",
            &format!("https://127.0.0.1:{web}/v1/webapi/ping"),
        ]),
        "",
    )
    .ok()
    .stdout;
    let ping: serde_json::Value = serde_json::from_str(&ping).unwrap();
    assert_eq!(ping["ssh_port"], ssh, "{ping}");
    assert_eq!(ping["tunnel_port"], tunnel, "{ping}");
    // The local admin identity names the port auth got.
    let sallyctl = |args: &[&str]| {
        run(
            Command::new(bin("sallyctl"))
                .arg("--data-dir")
                .arg(&data)
                .args(args),
            "",
        )
    };
    sallyctl(&["status"]).ok();
    let identity = std::fs::read_to_string(data.join("admin-identity.json")).unwrap();
    assert!(
        identity.contains(&format!("\"127.0.0.1:{auth}\"")),
        "{identity}"
    );
    // The local agent joined through the web port and keeps its tunnel on the tunnel port.
    assert!(
        eventually(Duration::from_secs(30), || {
            let out = sallyctl(&["nodes", "ls", "--format", "json"]);
            serde_json::from_str::<serde_json::Value>(&out.stdout)
                .ok()
                .and_then(|v| v.as_array().map(|n| n.iter().any(|n| n["online"] == true)))
                .unwrap_or(false)
        }),
        "the local agent never came online"
    );
}

#[test]
fn restart_keeps_cas_users_and_tokens() {
    let mut c = Cluster::start();
    let token = c.add_user("alice", "access", "alice");
    c.signup(&token, "correct horse battery");
    let pending = c.add_user("bob", "access", "bob");
    let pin = c.pin.clone();
    let ca = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    c.stop();
    c.boot();
    assert_eq!(c.pin, pin, "the host TLS CA survived the restart");
    assert_eq!(
        c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout,
        ca
    );
    let home = c.dir.path().join("alice");
    c.login(&home, "alice", "correct horse battery").ok();
    c.signup(&pending, "another good password");
    c.sallyctl(&["audit", "verify"]).ok();
    let db = c.data_dir().join("sallyport.db");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&db).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let id = c.data_dir().join("admin-identity.json");
    assert_eq!(
        std::fs::metadata(&id).unwrap().permissions().mode() & 0o777,
        0o600
    );
}

/// The same flows on PostgreSQL (`scripts/test` starts it and sets SALLYPORT_TEST_POSTGRES to a
/// URL whose role may create databases).
#[test]
fn postgres_storage_end_to_end() {
    let db = pg::PgDatabase::create("sp_e2e");
    let mut c = Cluster::start_with(Options {
        postgres: Some(db.url.clone()),
        ..Options::default()
    });
    assert!(
        !c.data_dir().join("sallyport.db").exists(),
        "no SQLite file when PostgreSQL is configured"
    );
    let home = c.user("pat", "access,auditor", "pat");
    let pin = c.pin.clone();
    // A clean stop signs a checkpoint of the audit chain, in PostgreSQL like in SQLite.
    c.terminate();
    c.boot();
    assert_eq!(c.pin, pin);
    c.login(&home, "pat", "correct horse battery").ok();
    let v = c.sallyctl(&["audit", "verify"]).ok();
    assert!(
        v.stdout.contains("intact") && v.stdout.contains("anchored by 1 signed checkpoint ("),
        "{}",
        v.stdout
    );
    // Searches read the records' own fields (jsonb on PostgreSQL).
    let logins = c
        .sallyctl(&["audit", "search", "--type", "user.login", "--since", "1h"])
        .ok()
        .stdout;
    assert!(logins.lines().count() >= 2, "{logins}");
    let events = c
        .sallyctl_as(&home, &["audit", "search", "--user", "pat"])
        .ok()
        .stdout;
    assert!(
        events
            .lines()
            .filter(|l| l.contains("\"user.login\""))
            .count()
            >= 2,
        "{events}"
    );
    c.stop();
}

/// The all-in-one moved to PostgreSQL (`sallyport storage migrate`): the same cluster after
/// the move — CA pin, users and their passwords, the local agent's tunnel on the certificates it
/// already had, the audit chain intact with every record —, and a second copy into the now
/// non-empty database refused without touching it.
#[test]
fn the_all_in_one_migrates_to_postgres_and_stays_the_same_cluster() {
    let db = pg::PgDatabase::create("sp_migrate");
    let url = db.url.clone();
    let migrate = |config: &std::path::Path, data: Option<&std::path::Path>| {
        let mut cmd = Command::new(bin("sallyport"));
        cmd.args(["storage", "migrate", "--config"]).arg(config);
        if let Some(d) = data {
            cmd.arg("--data-dir").arg(d);
        }
        run(cmd.args(["--to", &url]), "")
    };

    let mut c = Cluster::start();
    let home = c.user("pat", "access,auditor", "pat");
    let pin = c.pin.clone();
    let ca = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    assert!(
        eventually(Duration::from_secs(30), || c
            .sally(&home, &["ls"], "")
            .stdout
            .contains("online")),
        "the local agent came online before the move"
    );
    let records = |c: &Cluster| -> Vec<String> {
        c.sallyctl(&["audit", "search", "--since", "1h", "--limit", "100000"])
            .ok()
            .stdout
            .lines()
            .map(String::from)
            .collect()
    };
    let before = records(&c);
    // Not while the daemon runs: what it wrote after the copy began would be lost.
    migrate(&c.config, None).fails_with("another sallyport is running on data dir");
    c.terminate();
    // Nor into another application's database, which is left as it was (a second try says the
    // same: no table of Sallyport's was made in it).
    let other = pg::PgDatabase::create("sp_migrate_other");
    other.sql("CREATE TABLE orders (id BIGINT)").unwrap();
    let elsewhere = |config: &std::path::Path| {
        run(
            Command::new(bin("sallyport"))
                .args(["storage", "migrate", "--config"])
                .arg(config)
                .args(["--to", &other.url]),
            "",
        )
    };
    for _ in 0..2 {
        elsewhere(&c.config).fails_with("holds tables that are not Sallyport's (orders)");
    }
    // A data directory without the database is named, and nothing is written.
    let empty = tempfile::tempdir().unwrap();
    migrate(&c.config, Some(empty.path())).fails_with("no SQLite database at");

    let out = migrate(&c.config, None).ok().stdout;
    assert!(
        out.contains("users")
            && out.contains("audit_events")
            && !out.contains(&pg::postgres_base()),
        "the copy says what it copied, never the password in the URL: {out}"
    );
    // From now on the cluster runs on PostgreSQL; the SQLite file is moved out of the way so
    // nothing can read it.
    let config = std::fs::read_to_string(&c.config).unwrap();
    assert!(config.contains("storage: {type: sqlite}"), "{config}");
    std::fs::write(
        &c.config,
        config.replace(
            "storage: {type: sqlite}",
            &format!("storage: {{type: postgres, conn_string: \"{url}\"}}"),
        ),
    )
    .unwrap();
    let sqlite = c.data_dir().join("sallyport.db");
    std::fs::rename(&sqlite, c.dir.path().join("sallyport.db.before")).unwrap();
    c.boot();
    assert!(!sqlite.exists(), "the daemon made no new SQLite database");
    assert_eq!(c.pin, pin, "the same host CA");
    assert_eq!(
        c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout,
        ca
    );
    c.login(&home, "pat", "correct horse battery").ok();
    assert!(
        eventually(Duration::from_secs(30), || c
            .sally(&home, &["ls"], "")
            .stdout
            .contains("online")),
        "the local agent's tunnel is back on the certificates it had"
    );
    let verified = c.sallyctl(&["audit", "verify"]).ok().stdout;
    assert!(verified.contains("intact"), "{verified}");
    let after = records(&c);
    assert!(
        before.len() > 3 && after.len() > before.len() && after[..before.len()] == before[..],
        "every record from before the move, as it was, then the new ones:\n{}\n---\n{}",
        before.join("\n"),
        after.join("\n")
    );

    // Copying again into the database that now holds the cluster is refused, and changes
    // nothing in it.
    c.terminate();
    std::fs::create_dir_all(c.dir.path().join("data-again")).unwrap();
    std::fs::copy(
        c.dir.path().join("sallyport.db.before"),
        c.dir.path().join("data-again/sallyport.db"),
    )
    .unwrap();
    migrate(&c.config, Some(&c.dir.path().join("data-again"))).fails_with("already holds data");
    c.boot();
    c.login(&home, "pat", "correct horse battery").ok();
    let last = records(&c);
    assert!(
        last.len() > after.len() && last[..after.len()] == after[..],
        "the refused copy added nothing, and the chain goes on where it was"
    );
    let verified = c.sallyctl(&["audit", "verify"]).ok().stdout;
    assert!(verified.contains("intact"), "{verified}");
    c.stop();
}

/// Logs are plain text in a file or a pipe (no ANSI colour codes); colour is for a terminal,
/// and NO_COLOR turns it off there too.
#[test]
fn logs_are_coloured_only_on_a_terminal() {
    use std::io::{BufRead, BufReader};
    let mut c = Cluster::start();
    c.stop();
    let dir = c.dir.path();

    // Stderr to a file, as `2>daemon.log` or a service manager does.
    let log = dir.join("daemon.log");
    let mut child = Command::new(bin("sallyport"))
        .args(["start", "--config"])
        .arg(&c.config)
        .arg("--data-dir")
        .arg(dir.join("data-file"))
        .env("SALLYPORT_LOG", "info")
        .env_remove("NO_COLOR")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let stdout = BufReader::new(child.stdout.take().unwrap());
    let banner: Vec<String> = stdout
        .lines()
        .map_while(Result::ok)
        .take_while(|l| !l.starts_with("CA pin"))
        .collect();
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("INFO"), "{banner:?} {text}");
    assert!(
        !text.contains("\x1b["),
        "colour codes in a log file: {text:?}"
    );

    // On a terminal (a pty from `script`), colour; with NO_COLOR, none.
    let on_terminal = |name: &str, no_color: Option<&str>| {
        let mut cmd = Command::new("script");
        cmd.args(["-q", "-e", "-c"])
            .arg(format!(
                "timeout -s TERM 6 {} start --config {} --data-dir {}",
                bin("sallyport").display(),
                c.config.display(),
                dir.join(name).display()
            ))
            .arg("/dev/null")
            .env("SALLYPORT_LOG", "info");
        match no_color {
            Some(v) => cmd.env("NO_COLOR", v),
            None => cmd.env_remove("NO_COLOR"),
        };
        let out = run(&mut cmd, "").stdout;
        assert!(out.contains("INFO"), "{out}");
        out
    };
    assert!(on_terminal("data-tty", None).contains("\x1b["));
    assert!(!on_terminal("data-no-color", Some("1")).contains("\x1b["));
}
