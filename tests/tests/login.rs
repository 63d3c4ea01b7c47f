//! Sign-up and login end to end: the real `sallyport`, `sally` and `sallyctl` binaries, with
//! OpenSSH's `ssh-keygen` and `openssl` reading what we issue.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use sallyport_tests::*;

const PW: &str = "correct horse battery";

fn otp_cluster(max_attempts: u32) -> Cluster {
    Cluster::start_with(Options {
        second_factor: true,
        max_login_attempts: max_attempts,
        ..Options::default()
    })
}

fn login_otp(c: &Cluster, home: &std::path::Path, user: &str, password: &str, code: &str) -> Run {
    c.sally(
        home,
        &[
            "login", "--proxy", &c.proxy, "--user", user, "--ca-pin", &c.pin,
        ],
        &format!("{password}\n{code}\n"),
    )
}

#[test]
fn signup_and_login_with_totp_issue_certs_openssh_reads() {
    let c = otp_cluster(5);
    let token = c.add_user("alice", "access", "root,ubuntu");
    let secret = c.signup(&token, PW).expect("the cluster asks for TOTP");
    let home = c.dir.path().join("alice");
    // The sign-up spent the current step; the next step's code is inside the allowed skew.
    login_otp(&c, &home, "alice", PW, &totp_code(&secret, 1)).ok();

    let status = c.sally(&home, &["status", "--format", "json"], "").ok();
    let s: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(s["user"], "alice");
    assert_eq!(s["roles"], serde_json::json!(["access"]));
    assert_eq!(s["logins"], serde_json::json!(["root", "ubuntu"]));
    assert_eq!(s["proxy"], c.proxy.as_str());
    assert_eq!(s["cluster"], "test");
    for key in ["valid_until", "key_path", "ssh_cert_path", "tls_cert_path"] {
        assert!(s[key].is_string(), "{key} missing from {s}");
    }

    // OpenSSH reads the certificate: key id, principals, extensions, ~12h validity.
    let cert = s["ssh_cert_path"].as_str().unwrap();
    let out = Command::new("ssh-keygen")
        .args(["-L", "-f", cert])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("user certificate"), "{text}");
    assert!(text.contains("Key ID: \"alice\""), "{text}");
    let principals: Vec<&str> = text
        .split("Principals:")
        .nth(1)
        .unwrap()
        .split("Critical Options:")
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(principals, ["root", "ubuntu"]);
    for ext in [
        "permit-pty",
        "permit-port-forwarding",
        "sallyport-user@sallyport",
        "sallyport-roles@sallyport",
    ] {
        assert!(text.contains(ext), "{ext} missing: {text}");
    }
    // The signing CA is the one `sallyctl auth export --type=user` publishes.
    let ca = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    let ca_file = c.dir.path().join("user_ca.pub");
    std::fs::write(&ca_file, ca).unwrap();
    let fp = Command::new("ssh-keygen")
        .args(["-l", "-f"])
        .arg(&ca_file)
        .output()
        .unwrap();
    let fp = String::from_utf8_lossy(&fp.stdout)
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    assert!(
        text.contains(&format!("Signing CA: ED25519 {fp}")),
        "{text} vs {fp}"
    );
    let valid = s["valid_until"].as_str().unwrap();
    let hours_left = (time_of(valid) - now()) as f64 / 3600.0;
    assert!((11.9..=12.01).contains(&hours_left), "{hours_left}");

    // The X.509 certificate carries the same identity and chains to the user TLS CA.
    let tls = s["tls_cert_path"].as_str().unwrap();
    let subj = Command::new("openssl")
        .args(["x509", "-noout", "-subject", "-in", tls])
        .output()
        .unwrap();
    let subj = String::from_utf8_lossy(&subj.stdout);
    assert!(
        subj.contains("CN = alice") && subj.contains("O = access"),
        "{subj}"
    );
    let ca_pem = c.dir.path().join("tls_user_ca.pem");
    std::fs::write(
        &ca_pem,
        c.sallyctl(&["auth", "export", "--type=tls-user"])
            .ok()
            .stdout,
    )
    .unwrap();
    let verify = Command::new("openssl")
        .args(["verify", "-CAfile"])
        .arg(&ca_pem)
        .arg(tls)
        .output()
        .unwrap();
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );

    // Private keys are the owner's alone.
    for p in [
        s["key_path"].as_str().unwrap().to_string(),
        tls.replace("-x509.pem", ".key.pem"),
    ] {
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{p}");
    }
    let kh = std::fs::read_to_string(home.join("known_hosts")).unwrap();
    assert!(kh.starts_with("@cert-authority "), "{kh}");
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn time_of(rfc3339: &str) -> i64 {
    let out = Command::new("date")
        .args(["-d", rfc3339, "+%s"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The one answer to every wrong credential when a one-time code is asked for.
const BAD_OTP: &str = "invalid user name, password or one-time code";

#[test]
fn wrong_password_wrong_code_and_replayed_code_are_refused() {
    let c = otp_cluster(10);
    let token = c.add_user("bob", "access", "bob");
    let step = || sallyport_core::unix_now() / 30;
    let before = step();
    let secret = c.signup(&token, PW).unwrap();
    // The 30 s step the sign-up's code was of, when the sign-up did not straddle two.
    let signup_step = (step() == before).then_some(before);
    let home = c.dir.path().join("bob");
    // A wrong password, an unknown user, and the right password with a wrong code all get the
    // same answer: a password is never confirmed without the second factor.
    let wrong_password = login_otp(&c, &home, "bob", "not the password", "000000");
    let unknown = login_otp(&c, &home, "nobody", PW, "000000");
    let wrong_code = login_otp(&c, &home, "bob", PW, "000000");
    for r in [&wrong_password, &unknown, &wrong_code] {
        assert_ne!(r.code, 0);
        assert_eq!(
            r.stderr, wrong_password.stderr,
            "one answer for every wrong credential"
        );
        assert!(r.stderr.contains(BAD_OTP), "{r:?}");
    }
    // The shape of a code is checked before anything about the account.
    login_otp(&c, &home, "bob", PW, "12ab").fails_with("6 digits");
    // The code of the sign-up step was spent by the sign-up itself: a replay reads the same
    // (its own step's code, even when a new step began since).
    if let Some(at) = signup_step {
        login_otp(&c, &home, "bob", PW, &totp_code_at(&secret, at * 30)).fails_with(BAD_OTP);
    }
    let code = totp_code(&secret, 1);
    login_otp(&c, &home, "bob", PW, &code).ok();
    login_otp(&c, &home, "bob", PW, &code).fails_with(BAD_OTP);
    // Nothing failed was left behind as a usable profile for someone else.
    let s = c.sally(&home, &["status", "--format", "json"], "").ok();
    assert!(s.stdout.contains("\"bob\""));

    // Failed logins are audited, with the reason and without the secrets.
    let events = c
        .sallyctl(&["audit", "search", "--type", "user.login", "--user", "bob"])
        .ok()
        .stdout;
    let lines: Vec<serde_json::Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    // The audit (for admins only) says which part was wrong; the client was told the same.
    let failed: Vec<&serde_json::Value> = lines.iter().filter(|e| e["success"] == false).collect();
    for reason in [
        "wrong password",
        "wrong one-time code",
        "one-time code already used",
    ] {
        assert!(
            failed
                .iter()
                .any(|e| e["reason"] == reason && e["door"] == "api"),
            "{reason} missing: {events}"
        );
    }
    assert!(failed.iter().all(|e| e["error"] == BAD_OTP), "{events}");
    assert!(
        lines
            .iter()
            .any(|e| e["success"] == true && e["method"] == "local")
    );
    assert!(
        lines
            .iter()
            .all(|e| e["remote_addr"].as_str().unwrap().starts_with("127.0.0.1:"))
    );
    for secret_text in ["not the password", PW, &code] {
        assert!(!events.contains(secret_text), "audit leaked {secret_text}");
    }
}

#[test]
fn failed_logins_lock_the_account() {
    let c = otp_cluster(3);
    let token = c.add_user("carol", "access", "carol");
    let secret = c.signup(&token, PW).unwrap();
    let home = c.dir.path().join("carol");
    login_otp(&c, &home, "carol", "wrong-1", "123456").fails_with(BAD_OTP);
    login_otp(&c, &home, "carol", "wrong-2", "123456").fails_with(BAD_OTP);
    login_otp(&c, &home, "carol", "wrong-3", "123456").fails_with("locked after 3 failed logins");
    // Even the right password and code are refused while locked, with the reason.
    login_otp(&c, &home, "carol", PW, &totp_code(&secret, 1)).fails_with("account carol is locked");
    let ls = c.sallyctl(&["users", "ls"]).ok().stdout;
    assert!(
        ls.lines()
            .any(|l| l.starts_with("carol") && l.contains("locked")),
        "{ls}"
    );
    // The lock is held by the server: an unknown name behaves the same way.
    for _ in 0..3 {
        let _ = login_otp(&c, &home, "ghost", "x", "123456");
    }
    login_otp(&c, &home, "ghost", "x", "123456").fails_with("account ghost is locked");
}

#[test]
fn signup_tokens_are_single_use_and_expire() {
    let c = Cluster::start();
    let token = c.add_user("dave", "access", "");
    c.signup(&token, PW);
    let home = c.dir.path().join("dave");
    let again = c.sally(
        &home,
        &[
            "signup", "--proxy", &c.proxy, "--token", &token, "--ca-pin", &c.pin,
        ],
        "another password\n",
    );
    again.fails_with("already used");
    c.sally(
        &home,
        &[
            "signup", "--proxy", &c.proxy, "--token", "deadbeef", "--ca-pin", &c.pin,
        ],
        "pw\n",
    )
    .fails_with("sign-up token not found");
    // A token whose hour has passed.
    let token = c.add_user("erin", "access", "");
    c.sqlite("UPDATE signup_tokens SET expires = 1000 WHERE user_name = 'erin';");
    c.sally(
        &home,
        &[
            "signup", "--proxy", &c.proxy, "--token", &token, "--ca-pin", &c.pin,
        ],
        "long enough pw\n",
    )
    .fails_with("expired");
    // A reset issues a working token and the old password stops working.
    c.login(&home, "dave", PW).ok();
    let out = c
        .sallyctl(&["users", "reset", "dave", "--format", "json"])
        .ok();
    let t: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    c.login(&home, "dave", PW)
        .fails_with("invalid user name or password");
    c.signup(t["token"].as_str().unwrap(), "a brand new password");
    c.login(&home, "dave", "a brand new password").ok();
    // Too-short passwords are refused at sign-up.
    let token = c.add_user("frank", "access", "");
    c.sally(
        &home,
        &[
            "signup", "--proxy", &c.proxy, "--token", &token, "--ca-pin", &c.pin,
        ],
        "short\n",
    )
    .fails_with("at least 8 characters");
}

#[test]
fn proxy_trust_pin_insecure_and_unreachable() {
    let c = Cluster::start();
    let token = c.add_user("gina", "access", "gina");
    c.signup(&token, PW);
    let home = c.dir.path().join("gina");
    let wrong = format!("sha256:{}", "ab".repeat(32));
    c.sally(
        &home,
        &[
            "login", "--proxy", &c.proxy, "--user", "gina", "--ca-pin", &wrong,
        ],
        &format!("{PW}\n"),
    )
    .fails_with("does not match --ca-pin");
    c.sally(
        &home,
        &[
            "login",
            "--proxy",
            &c.proxy,
            "--user",
            "gina",
            "--ca-pin",
            "sha256:xyz",
        ],
        &format!("{PW}\n"),
    )
    .fails_with("--ca-pin must look like");
    c.sally(
        &home,
        &["login", "--proxy", &c.proxy, "--user", "gina"],
        &format!("{PW}\n"),
    )
    .fails_with("first contact");
    let closed = format!("127.0.0.1:{}", free_port());
    c.sally(
        &home,
        &["login", "--proxy", &closed, "--user", "gina", "--insecure"],
        &format!("{PW}\n"),
    )
    .fails_with("cannot reach the proxy");
    let r = c
        .sally(
            &home,
            &["login", "--proxy", &c.proxy, "--user", "gina", "--insecure"],
            &format!("{PW}\n"),
        )
        .ok();
    assert!(r.stderr.contains("WARNING: --insecure"));
    // After a login, the saved CA is trusted without a pin.
    c.sally(
        &home,
        &[
            "login", "--proxy", &c.proxy, "--user", "gina", "--ttl", "1h",
        ],
        &format!("{PW}\n"),
    )
    .ok();
    let s: serde_json::Value = serde_json::from_str(
        &c.sally(&home, &["status", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    let left = time_of(s["valid_until"].as_str().unwrap()) - now();
    assert!((3500..=3600).contains(&left), "--ttl 1h gave {left}s");
    c.sally(
        &home,
        &[
            "login", "--proxy", &c.proxy, "--user", "gina", "--ttl", "forever",
        ],
        &format!("{PW}\n"),
    )
    .fails_with("--ttl");
    let out = c.sally(&home, &["logout"], "").ok();
    assert!(out.stdout.contains("Logged out"));
    assert!(!home.join("keys").exists());
    c.sally(&home, &["status"], "").fails_with("not logged in");
}

/// The proxy's caps on unauthenticated connections raised out of the way, so that what these
/// tests measure is auth's own bounds (the caps are tested in `abuse.rs`).
fn wide_open_doors() -> Vec<String> {
    [
        "max_unauthenticated_connections: 1024",
        "max_unauthenticated_per_address: 1024",
        "max_connection_rate_per_address: 1000",
    ]
    .map(String::from)
    .to_vec()
}

/// `POST /v1/webapi/login` with curl, as an attacker's script would: (HTTP status, body).
fn curl_login(c: &Cluster, user: &str, password: &str, code: Option<&str>) -> (u16, String) {
    let body = serde_json::json!({
        "user": user,
        "password": password,
        "otp_code": code,
        "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKdXuhsuZQ3K1Z0Bq3YQ6pN3cT0ZLd6lnF1wbZlCsl1f x",
    });
    let r = run(
        Command::new("curl").args([
            "-sk",
            "--max-time",
            "60",
            "-H",
            "content-type: application/json",
            "--data",
            &body.to_string(),
            "-w",
            "\n%{http_code}",
            &format!("https://{}/v1/webapi/login", c.proxy),
        ]),
        "",
    );
    let (text, status) = r.stdout.rsplit_once('\n').unwrap_or(("", "0"));
    (status.trim().parse().unwrap_or(0), text.to_string())
}

/// Runs `n` logins at once (released together by a barrier) and returns their answers.
fn parallel_logins(
    c: &Cluster,
    n: usize,
    attempt: impl Fn(usize) -> (String, String) + Send + Sync,
) -> Vec<(u16, String)> {
    let barrier = std::sync::Barrier::new(n);
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                let (barrier, attempt) = (&barrier, &attempt);
                s.spawn(move || {
                    let (user, password) = attempt(i);
                    barrier.wait();
                    curl_login(c, &user, &password, None)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn lockout_holds_under_sixty_concurrent_guesses() {
    let c = Cluster::start_with(Options {
        max_login_attempts: 5,
        proxy_service: wide_open_doors(),
        ..Options::default()
    });
    let token = c.add_user("dora", "access", "dora");
    c.signup(&token, PW);
    let answers = parallel_logins(&c, 60, |i| ("dora".into(), format!("guess-{i}")));
    // Only an attempt that reserved one of the 5 tries got a password check and its answer;
    // every other one was refused as locked without a check.
    let checked = answers
        .iter()
        .filter(|(_, body)| body.contains("invalid user name or password"))
        .count();
    let locked = answers
        .iter()
        .filter(|(status, body)| {
            *status == 429 && body.starts_with("{\"error\":\"account dora is locked")
        })
        .count();
    assert!(checked <= 5, "{checked} password checks ran: {answers:?}");
    assert_eq!(checked + locked, 60, "{answers:?}");
    assert!(locked >= 55, "{answers:?}");
    // The lock holds for the right password too.
    let home = c.dir.path().join("dora");
    c.login(&home, "dora", PW)
        .fails_with("account dora is locked after 5 failed logins");
}

/// The daemon's resident memory; panics when it cannot be read, so that a bound on it cannot
/// pass by reading nothing.
fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb / 1024)
        .unwrap()
}

/// Samples the daemon's resident memory every 20 ms while `work` runs: (its result, peak MiB).
fn peak_rss_during<T>(pid: u32, work: impl FnOnce() -> T) -> (T, u64) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_mib(pid));
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            peak
        });
        let out = work();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let peak = sampler.join().unwrap();
        assert!(peak > 0, "the daemon's memory was never read");
        (out, peak)
    })
}

#[test]
fn password_checks_are_bounded_under_two_hundred_parallel_logins() {
    let c = Cluster::start_with(Options {
        proxy_service: wide_open_doors(),
        ..Options::default()
    });
    c.wait_online("local1");
    let home = c.user("erin", "access", "root");
    let pid = c.pid().unwrap();
    let ((answers, served), peak) = peak_rss_during(pid, || {
        std::thread::scope(|s| {
            // A logged-in user keeps being served while the flood runs.
            let user = s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(300));
                let ls = c.sally(&home, &["ls"], "");
                let ssh = c.sally(&home, &["ssh", "root@local1", "echo still-served"], "");
                (ls, ssh)
            });
            let answers = parallel_logins(&c, 200, |i| (format!("nobody-{i}"), "guess".into()));
            (answers, user.join().unwrap())
        })
    });
    let busy = answers.iter().filter(|(s, _)| *s == 503).count();
    eprintln!("peak RSS {peak} MiB; {busy} of 200 told to come back");
    assert!(peak < 512, "the daemon reached {peak} MiB");
    let (ls, ssh) = served;
    assert!(ls.ok().stdout.contains("local1"));
    assert_eq!(ssh.ok().stdout, "still-served\n");
    // Every answer is the wrong-credential one, or a clear "come back" from a busy server.
    for (status, body) in &answers {
        match status {
            401 => assert!(body.contains("invalid user name or password"), "{body}"),
            503 => assert!(
                body.contains("too many logins in progress; try again"),
                "{body}"
            ),
            _ => panic!("unexpected answer {status}: {body}"),
        }
    }
    assert!(answers.iter().any(|(s, _)| *s == 401), "{answers:?}");
}

/// `n` logins (users `{who}-0`...) by one curl running `parallel` at a time, each hanging up
/// `ms.0` to `ms.1` ms after it started (--max-time): some while their TLS handshake is under way,
/// some waiting in line for a password check, some during it. A login is answered in ~60 ms
/// when nothing else runs.
fn cancelled_logins(c: &Cluster, who: &str, n: usize, parallel: usize, ms: (usize, usize)) {
    let mut config = String::new();
    for i in 0..n {
        let body = serde_json::json!({
            "user": format!("{who}-{i}"),
            "password": "guess",
            "ssh_public_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIKdXuhsuZQ3K1Z0Bq3YQ6pN3cT0ZLd6lnF1wbZlCsl1f x",
        });
        let after_ms = ms.0 + (i * 37) % (ms.1 - ms.0);
        config += &format!(
            "url = \"https://{}/v1/webapi/login\"\ndata = {}\nheader = \"content-type: application/json\"\ninsecure\nsilent\noutput = /dev/null\nmax-time = {}.{:03}\nnext\n",
            c.proxy,
            serde_json::to_string(&body.to_string()).unwrap(),
            after_ms / 1000,
            after_ms % 1000,
        );
    }
    let file = c.dir.path().join("cancelled-logins.curl");
    std::fs::write(&file, config).unwrap();
    // curl exits 28 (timed out): that is the point.
    run(
        Command::new("curl")
            .args(["--parallel", "--parallel-immediate", "--parallel-max"])
            .arg(parallel.to_string())
            .arg("-K")
            .arg(&file),
        "",
    );
}

/// Hanging up does not free a password check: the check runs on to its end in its slot and
/// memory, so logins cancelled mid-way cannot run argon2 (19 MiB each) without bound (it
/// reached 757 MiB here); and a login cancelled while waiting in line leaves the line, so the
/// line does not stay full (every login found busy slots was answered 503 at once).
#[test]
fn logins_cancelled_by_their_clients_stay_bounded_and_leave_the_line() {
    let c = Cluster::start_with(Options {
        proxy_service: wide_open_doors(),
        ..Options::default()
    });
    let pid = c.pid().unwrap();
    let ((), peak) = peak_rss_during(pid, || {
        // 10 at a time: many are cancelled during their check.
        cancelled_logins(&c, "gone", 200, 10, (40, 140));
        // 100 at a time: many are cancelled while waiting in line.
        cancelled_logins(&c, "queued", 200, 100, (100, 400));
        // The checks the cancelled logins started run on; they end within a few seconds.
        std::thread::sleep(std::time::Duration::from_secs(3));
    });
    eprintln!("peak RSS {peak} MiB under 400 cancelled logins");
    assert!(peak < 512, "the daemon reached {peak} MiB");
    // More logins at once than there are slots: the rest wait in line and are answered, not
    // told the line is full.
    let started = std::time::Instant::now();
    let answers = parallel_logins(&c, 12, |i| (format!("after-{i}"), "guess".into()));
    for (status, body) in &answers {
        assert_eq!(*status, 401, "{body}");
        assert!(body.contains("invalid user name or password"), "{body}");
    }
    assert!(started.elapsed() < std::time::Duration::from_secs(10));
    // A real user logs in at once.
    let home = c.user("erin", "access", "root");
    c.sally(&home, &["status"], "").ok();
}

/// A sign-up token refused at either step is audited under the client's address (the proxy
/// forwards it), not the proxy's own.
#[test]
fn refused_signup_tokens_are_audited_under_the_clients_address() {
    let c = Cluster::start();
    let port = c.proxy.rsplit(':').next().unwrap();
    for (step, source, body) in [
        ("start", "127.0.0.2", r#"{"token":"deadbeef"}"#),
        (
            "finish",
            "127.0.0.3",
            r#"{"token":"deadbeef","password":"correct horse battery"}"#,
        ),
    ] {
        let r = run(
            Command::new("curl").args([
                "-sk",
                "--interface",
                source,
                "-H",
                "content-type: application/json",
                "--data",
                body,
                "-w",
                "\n%{http_code}",
                &format!("https://127.0.0.1:{port}/v1/webapi/signup/{step}"),
            ]),
            "",
        );
        assert!(r.stdout.ends_with("\n401"), "{r:?}");
        assert!(r.stdout.contains("sign-up token not found"), "{r:?}");
        let path = format!("/v1/signup/{step}");
        let audited: Vec<_> = c
            .events("auth.fail")
            .into_iter()
            .filter(|e| e["path"] == path.as_str())
            .collect();
        assert_eq!(audited.len(), 1, "{audited:?}");
        let addr = audited[0]["remote_addr"].as_str().unwrap_or_default();
        assert!(addr.starts_with(&format!("{source}:")), "{audited:?}");
    }
}

#[test]
fn signup_with_a_pin_saves_the_trust_its_login_needs() {
    let c = Cluster::start();
    let token = c.add_user("fern", "access", "fern");
    let home = c.dir.path().join("fern");
    let out = c
        .sally(
            &home,
            &[
                "signup", "--proxy", &c.proxy, "--token", &token, "--ca-pin", &c.pin,
            ],
            &format!("{PW}\n"),
        )
        .ok();
    // The printed command works as printed: no pin needed, the sign-up verified the cluster.
    let printed = out
        .stderr
        .lines()
        .find_map(|l| l.trim().strip_prefix("sally "))
        .unwrap_or_else(|| panic!("no login command printed: {out:?}"))
        .to_string();
    assert!(!printed.contains("--ca-pin"), "{printed}");
    let args: Vec<&str> = printed.split_whitespace().collect();
    c.sally(&home, &args, &format!("{PW}\n")).ok();
    let s = c.sally(&home, &["status", "--format", "json"], "").ok();
    assert!(s.stdout.contains("\"fern\""), "{s:?}");
    // A pin that does not match the proxy is still refused, before anything is saved.
    let other = c.dir.path().join("other");
    let token = c.add_user("gus", "access", "");
    c.sally(
        &other,
        &[
            "signup",
            "--proxy",
            &c.proxy,
            "--token",
            &token,
            "--ca-pin",
            &format!("sha256:{}", "ab".repeat(32)),
        ],
        &format!("{PW}\n"),
    )
    .fails_with("does not match --ca-pin");
    c.sally(
        &other,
        &["login", "--proxy", &c.proxy, "--user", "gus"],
        &format!("{PW}\n"),
    )
    .fails_with("first contact");
}
