//! `docker-compose.yml` and `config/compose/`: the compose file is valid for Debian's
//! `docker-compose` (no container runs here: nothing can be pulled), every config it mounts is
//! accepted by `sallyport configure --check`, and the topology's own configs and bootstrap
//! script, run as processes on loopback against PostgreSQL, bring up two auth instances
//! sharing one audit checkpoint key, two joined proxies and an agent.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn compose_dir() -> PathBuf {
    repo().join("config/compose")
}

/// `docker-compose -f FILE config -q` in `dir`.
fn compose_config(dir: &Path, file: &str) -> Run {
    run(
        Command::new("docker-compose")
            .current_dir(dir)
            .args(["-f", file, "config", "-q"]),
        "",
    )
}

#[test]
fn compose_file_is_valid_and_a_typo_in_it_is_not() {
    compose_config(&repo(), "docker-compose.yml").ok();
    // The check has teeth: a misspelt key and an unknown start condition are refused.
    let text = std::fs::read_to_string(repo().join("docker-compose.yml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (from, to, needle) in [
        (
            "    restart: unless-stopped",
            "    restrat: unless-stopped",
            "restrat",
        ),
        (
            "condition: service_completed_successfully",
            "condition: service_done",
            "service_done",
        ),
    ] {
        assert!(text.contains(from), "{from:?} is in docker-compose.yml");
        std::fs::write(
            dir.path().join("docker-compose.yml"),
            text.replacen(from, to, 1),
        )
        .unwrap();
        compose_config(dir.path(), "docker-compose.yml").fails_with(needle);
    }
}

/// Every config docker-compose.yml mounts (`/etc/sallyport/NAME`) is in config/compose/, and
/// every YAML file there is one `sallyport start` accepts.
#[test]
fn every_compose_config_is_accepted_by_sallyport() {
    let compose = std::fs::read_to_string(repo().join("docker-compose.yml")).unwrap();
    let mounted: Vec<&str> = compose
        .split("/etc/sallyport/")
        .skip(1)
        .filter_map(|s| s.split(|c: char| c.is_whitespace() || c == '"').next())
        .filter(|s| !s.is_empty() && !s.starts_with(':'))
        .collect();
    assert!(mounted.contains(&"auth.yaml"), "{mounted:?}");
    for name in &mounted {
        assert!(
            compose_dir().join(name).is_file(),
            "docker-compose.yml uses /etc/sallyport/{name}, which config/compose/ lacks"
        );
    }
    let mut yamls: Vec<PathBuf> = std::fs::read_dir(compose_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    yamls.sort();
    let out = run(
        Command::new(bin("sallyport"))
            .args(["configure", "--check"])
            .args(&yamls),
        "",
    )
    .ok();
    for y in &yamls {
        assert!(
            out.stdout.contains(&format!("{}: ok", y.display())),
            "{}",
            out.stdout
        );
    }
    // The bootstrap script is at least valid shell.
    run(
        Command::new("sh")
            .arg("-n")
            .arg(compose_dir().join("bootstrap.sh")),
        "",
    )
    .ok();
}

#[test]
fn configure_check_refuses_a_bad_file_with_its_name_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.yaml");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(&good, "version: v1\n").unwrap();
    std::fs::write(
        &bad,
        "version: v1\nproxy_service:\n  enabled: true\n  tunnel_public_adr: proxy1:3024\n",
    )
    .unwrap();
    let r = run(
        Command::new(bin("sallyport"))
            .args(["configure", "--check"])
            .arg(&good)
            .arg(&bad),
        "",
    )
    .fails_with("tunnel_public_adr")
    .fails_with("line 4")
    .fails_with(&bad.display().to_string());
    assert_eq!(r.code, 1);
    assert!(!r.stdout.contains("bad.yaml: ok"), "{}", r.stdout);
    let missing = dir.path().join("missing.yaml");
    run(
        Command::new(bin("sallyport"))
            .args(["configure", "--check"])
            .arg(&missing),
        "",
    )
    .fails_with("cannot read config");
    // Without --check, configure still prints the default config.
    let out = run(Command::new(bin("sallyport")).arg("configure"), "").ok();
    assert!(out.stdout.starts_with("# Sallyport configuration"));
}

/// A `sallyport start` of the topology, killed when dropped, with its banner.
struct Service {
    _child: Bg,
    banner: String,
}

impl Service {
    fn start(config: &Path, extra: &[&str]) -> Service {
        let mut child = Command::new(bin("sallyport"))
            .args(["start", "--config"])
            .arg(config)
            .args(extra)
            .env("SALLYPORT_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let child = Bg(child);
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut text = String::new();
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                text.push_str(&line);
                text.push('\n');
                // Services print "CA pin" last; an agent prints "node ... joined".
                if line.starts_with("CA pin") || line.contains(" joined cluster ") {
                    let _ = tx.send(text.clone());
                }
            }
        });
        let banner = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("{} did not start", config.display()));
        Service {
            _child: child,
            banner,
        }
    }

    /// The address after `key` in the banner (`auth`, `web`, `tunnel`).
    fn addr(&self, key: &str) -> String {
        self.banner
            .lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))
            .map(|v| v.trim().trim_start_matches("https://").to_string())
            .unwrap_or_else(|| panic!("no {key} in\n{}", self.banner))
    }
}

/// config/compose/NAME for loopback: `data_dir` in `data`, each `(from, to)` replaced.
fn rewrite(name: &str, data: &Path, subs: &[(String, String)]) -> PathBuf {
    let mut text = std::fs::read_to_string(compose_dir().join(name)).unwrap();
    text = text.replace(
        "data_dir: /var/lib/sallyport",
        &format!("data_dir: {}", data.display()),
    );
    for (from, to) in subs {
        assert!(text.contains(from.as_str()), "{from:?} is in {name}");
        text = text.replace(from.as_str(), to);
    }
    let path = data.with_extension("yaml");
    std::fs::write(&path, text).unwrap();
    path
}

fn ctl(data: &Path, args: &[&str]) -> Run {
    run(
        Command::new(bin("sallyctl"))
            .arg("--data-dir")
            .arg(data)
            .args(args),
        "",
    )
}

fn json(r: Run) -> serde_json::Value {
    serde_json::from_str(&r.ok().stdout).unwrap()
}

/// The compose topology as processes: auth.yaml twice on one PostgreSQL database, bootstrap.sh
/// against the first, proxy1.yaml and proxy2.yaml joined with its tokens, node.yaml through
/// proxy1 — the configs as shipped but for addresses, data dirs and the database.
#[test]
fn compose_topology_runs_from_its_own_configs_and_bootstrap() {
    let base = std::env::var("SALLYPORT_TEST_POSTGRES").expect(
        "set SALLYPORT_TEST_POSTGRES=postgres://user:pass@127.0.0.1:5432 (scripts/test does)",
    );
    let db = format!("sp_compose_{}", std::process::id());
    for sql in [
        format!("DROP DATABASE IF EXISTS {db}"),
        format!("CREATE DATABASE {db}"),
    ] {
        run(
            Command::new("psql").arg(format!("{base}/postgres")).args([
                "-v",
                "ON_ERROR_STOP=1",
                "-c",
                &sql,
            ]),
            "",
        )
        .ok();
    }
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n);
    let s = |a: &str, b: &str| (a.to_string(), b.to_string());
    // MinIO's bucket becomes a directory: the same shared store, through `file://`.
    let store = s(
        r#"recordings: {uri: "s3://recordings", endpoint: "http://minio:9000", region: us-east-1}"#,
        &format!("recordings: {{uri: \"file://{}\"}}", d("store").display()),
    );
    std::fs::create_dir_all(d("store")).unwrap();
    let auth_subs = vec![
        s(
            "postgres://sallyport:sallyport@postgres:5432/sallyport",
            &format!("{base}/{db}"),
        ),
        s("listen_addr: 0.0.0.0:3025", "listen_addr: 127.0.0.1:0"),
        s("diag_addr: 0.0.0.0:3000", "diag_addr: 127.0.0.1:0"),
        // A checkpoint at every record, so that there are some for auth2 to check.
        s(
            "  cluster_name: compose\n",
            "  cluster_name: compose\n  audit: {checkpoint_every: 1}\n",
        ),
        store.clone(),
    ];
    let auth1 = Service::start(&rewrite("auth.yaml", &d("auth1"), &auth_subs), &[]);

    // bootstrap.sh, as the compose service runs it, with its paths moved here.
    let (join, keys) = (d("join"), d("auth-key"));
    std::fs::create_dir_all(&join).unwrap();
    std::fs::create_dir_all(&keys).unwrap();
    let id = |flag: &str| {
        String::from_utf8(Command::new("id").arg(flag).output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string()
    };
    let path = format!(
        "{}:{}",
        bin("sallyctl").parent().unwrap().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let boot = || {
        run(
            Command::new("sh")
                .arg(compose_dir().join("bootstrap.sh"))
                .env("PATH", &path)
                .env("DATA_DIR", d("auth1"))
                .env("JOIN_DIR", &join)
                .env("KEY_DIR", &keys)
                .env("OWNER", format!("{}:{}", id("-u"), id("-g"))),
            "",
        )
        .ok()
    };
    boot();
    let read = |p: PathBuf| std::fs::read_to_string(p).unwrap().trim().to_string();
    let pin = read(join.join("ca-pin"));
    assert_eq!(pin, auth1.addr("CA pin"));
    for f in ["ca-pin", "proxy1.token", "proxy2.token", "node1.token"] {
        let mode = std::fs::metadata(join.join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    let key = keys.join("audit-checkpoint.key");
    assert_eq!(
        std::fs::read(&key).unwrap(),
        std::fs::read(d("auth1").join("audit-checkpoint.key")).unwrap()
    );
    assert_eq!(
        std::fs::metadata(&key).unwrap().permissions().mode() & 0o777,
        0o600
    );
    // Run again (every `docker compose up` does): fresh tokens, the shared key untouched.
    let first = read(join.join("proxy1.token"));
    std::fs::write(&key, std::fs::read(&key).unwrap()).unwrap();
    let before = std::fs::metadata(&key).unwrap().modified().unwrap();
    boot();
    assert_ne!(read(join.join("proxy1.token")), first);
    assert_eq!(std::fs::metadata(&key).unwrap().modified().unwrap(), before);

    // auth2: auth1's checkpoint key copied in first, as its compose command does.
    std::fs::create_dir_all(d("auth2")).unwrap();
    std::fs::copy(&key, d("auth2").join("audit-checkpoint.key")).unwrap();
    std::fs::set_permissions(
        d("auth2").join("audit-checkpoint.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let auth2 = Service::start(&rewrite("auth.yaml", &d("auth2"), &auth_subs), &[]);
    let auths = format!("{},{}", auth1.addr("auth"), auth2.addr("auth"));

    // The proxies, each door on a port of its own, joined with bootstrap's tokens.
    let mut proxies = vec![];
    for (name, ports) in [
        ("proxy1", [3080, 3023, 3024, 3026]),
        ("proxy2", [4080, 4023, 4024, 4026]),
    ] {
        let mut subs = vec![
            s(r#""auth1:3025,auth2:3025""#, &auths),
            s("diag_addr: 0.0.0.0:3000", "diag_addr: 127.0.0.1:0"),
            store.clone(),
        ];
        let tunnel = free_port();
        for p in ports {
            let to = if p == ports[2] { tunnel } else { free_port() };
            subs.push(s(&format!("0.0.0.0:{p}"), &format!("127.0.0.1:{to}")));
        }
        subs.push(s(
            &format!("tunnel_public_addr: {name}:{}", ports[2]),
            &format!("tunnel_public_addr: 127.0.0.1:{tunnel}"),
        ));
        let cfg = rewrite(&format!("{name}.yaml"), &d(name), &subs);
        let token = read(join.join(format!("{name}.token")));
        let p = Service::start(&cfg, &["--token", &token, "--ca-pin", &pin]);
        proxies.push((name, p, tunnel));
    }
    let online = |name: &str| {
        let v = json(ctl(&d("auth1"), &["proxies", "ls", "--format", "json"]));
        v.as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == name && p["online"] == true)
    };
    for (name, _, tunnel) in &proxies {
        assert!(
            eventually(Duration::from_secs(30), || online(name)),
            "{name} online"
        );
        let v = json(ctl(&d("auth2"), &["proxies", "ls", "--format", "json"]));
        let p = v
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == *name)
            .cloned()
            .unwrap_or_default();
        assert_eq!(p["addrs"]["tunnel"], format!("127.0.0.1:{tunnel}"), "{v}");
    }

    // The agent: node.yaml, joined through proxy1 with bootstrap's node token.
    let web1 = proxies[0].1.addr("web");
    let node = rewrite(
        "node.yaml",
        &d("node1"),
        &[
            s(
                "proxy_server: proxy1:3080",
                &format!("proxy_server: {web1}"),
            ),
            s("diag_addr: 0.0.0.0:3000", "diag_addr: 127.0.0.1:0"),
        ],
    );
    let token = read(join.join("node1.token"));
    let _node = Service::start(&node, &["--token", &token, "--ca-pin", &pin]);
    let node_online = || {
        let v = json(ctl(&d("auth2"), &["nodes", "ls", "--format", "json"]));
        v.as_array()
            .unwrap()
            .iter()
            .any(|n| n["hostname"] == "node1" && n["online"] == true)
    };
    assert!(
        eventually(Duration::from_secs(30), node_online),
        "node1 online"
    );

    // One audit chain, anchored with one key: auth2 verifies what auth1 signed.
    for auth in ["auth1", "auth2"] {
        let out = ctl(&d(auth), &["audit", "verify"]).ok();
        assert!(
            out.stdout.contains("audit log intact"),
            "{auth}: {}",
            out.stdout
        );
        let status = ctl(&d(auth), &["status"]).ok();
        assert!(
            !status.stdout.contains("STOPPED"),
            "{auth}: {}",
            status.stdout
        );
    }
    // Why the key is shared: an instance with a key of its own would read every checkpoint the
    // others signed as forged, so it stops at start and says what to copy.
    let out = Command::new(bin("sallyport"))
        .args(["start", "--config"])
        .arg(rewrite("auth.yaml", &d("auth3"), &auth_subs))
        .env("SALLYPORT_LOG", "warn")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("copy audit-checkpoint.key"), "{said}");
    drop(auth2);
}
