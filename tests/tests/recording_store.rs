//! Recordings in S3 (`recordings: {uri: s3://…, endpoint: …}`), against a real S3 API on
//! loopback (`moto_server`): a session's recording is written locally while it runs (and
//! replays from there), reaches the store when the session ends and then replays from the store
//! with the local copy gone; a recording left by a proxy killed mid-session is uploaded when it
//! starts again; a store that cannot be reached, or refuses the credentials, costs no recording
//! (kept on disk, retried, said in the log without the secret); and a recording of hundreds of
//! MiB streams from the store through auth with the daemon's memory flat.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sallyport_tests::s3::{Moto, credentials};
use sallyport_tests::*;

const BUCKET: &str = "recordings";

fn cluster(endpoint: &str, prefix: &str, env: Vec<(String, String)>) -> Cluster {
    Cluster::start_with(Options {
        recordings: Some(format!(
            "{{uri: 's3://{BUCKET}/{prefix}', endpoint: '{endpoint}', region: us-east-1}}"
        )),
        env,
        ..Options::default()
    })
}

/// The one session whose command contains `needle`, from `sally recordings ls`.
fn session(c: &Cluster, home: &std::path::Path, needle: &str) -> serde_json::Value {
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(home, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .find(|s| s["command"].as_str().is_some_and(|c| c.contains(needle)))
        .cloned()
        .unwrap_or_else(|| panic!("no session running {needle:?} in {list}"))
}

fn local(c: &Cluster, id: &str) -> std::path::PathBuf {
    c.data_dir().join("recordings").join(format!("{id}.cast"))
}

fn play_text(c: &Cluster, home: &std::path::Path, id: &str) -> String {
    c.sally(home, &["play", id, "--format", "text"], "")
        .ok()
        .stdout
}

#[test]
fn a_session_replays_while_it_runs_then_from_s3_with_the_local_copy_gone() {
    let moto = Moto::start();
    moto.bucket(BUCKET);
    let c = cluster(&moto.endpoint, "cluster-a", credentials());
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    // While it runs, its recording is on the proxy's disk and replays from there.
    let mut running = Command::new(bin("sally"))
        .env("SALLY_HOME", &home)
        .args(["ssh", "root@local1", "echo live-part; sleep 8"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(running.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "live-part\n");
    let live = session(&c, &home, "live-part");
    let live_id = live["session_id"].as_str().unwrap().to_string();
    assert_eq!(live["status"], "running");
    assert!(eventually(Duration::from_secs(5), || {
        play_text(&c, &home, &live_id) == "live-part\n"
    }));
    assert!(moto.list(BUCKET, "cluster-a/").is_empty());
    assert!(running.wait().unwrap().success());

    c.ssh(
        &c.ssh_config(&home, "alice"),
        &["root@local1", "echo stored-in-s3"],
        "",
    )
    .ok();
    let id = session(&c, &home, "stored-in-s3")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // Both ended sessions reach the store under the prefix, and leave the proxy's disk.
    let key = format!("cluster-a/{id}.cast");
    assert!(
        eventually(Duration::from_secs(20), || {
            let keys = moto.list(BUCKET, "cluster-a/");
            keys.iter().any(|(k, _)| *k == key)
                && keys
                    .iter()
                    .any(|(k, _)| *k == format!("cluster-a/{live_id}.cast"))
                && !local(&c, &id).exists()
                && !local(&c, &live_id).exists()
        }),
        "in the store: {:?}",
        moto.list(BUCKET, "cluster-a/")
    );
    // Replayed from the store: the same bytes as the object, through `sally play` and the
    // session's detail.
    assert_eq!(play_text(&c, &home, &id), "stored-in-s3\n");
    assert_eq!(play_text(&c, &home, &live_id), "live-part\n");
    let cast = c
        .sally(&home, &["play", &id, "--format", "asciicast"], "")
        .ok()
        .stdout;
    assert_eq!(cast.as_bytes(), moto.get(BUCKET, &key));
    // Another user's recording in the store is still refused.
    let bob = c.user("bob", "access", "root");
    c.sally(&bob, &["play", &id], "")
        .fails_with("belongs to another user");
}

#[test]
fn a_recording_left_by_a_killed_proxy_is_uploaded_when_it_starts_again() {
    let moto = Moto::start();
    moto.bucket(BUCKET);
    let mut c = cluster(&moto.endpoint, "crashed", credentials());
    c.wait_online("local1");
    let home = c.user("kim", "access", "root");
    let mut session_cmd = Command::new(bin("sally"))
        .env("SALLY_HOME", &home)
        .args(["ssh", "root@local1", "echo before-the-crash; sleep 30"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(session_cmd.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "before-the-crash\n");
    let id = session(&c, &home, "before-the-crash")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    // The recorder's flush interval, then kill -9.
    std::thread::sleep(Duration::from_millis(1500));
    c.stop();
    let _ = session_cmd.kill();
    let _ = session_cmd.wait();
    assert!(local(&c, &id).exists(), "the flushed recording is on disk");
    assert!(moto.list(BUCKET, "crashed/").is_empty());
    c.boot();
    assert!(
        eventually(Duration::from_secs(20), || {
            moto.list(BUCKET, "crashed/")
                .iter()
                .any(|(k, _)| *k == format!("crashed/{id}.cast"))
                && !local(&c, &id).exists()
        }),
        "not uploaded at restart"
    );
    let s = session(&c, &home, "before-the-crash");
    assert_eq!(s["status"], "incomplete", "{s}");
    assert_eq!(play_text(&c, &home, &id), "before-the-crash\n");
    assert!(
        c.log()
            .contains("uploading recordings left by an earlier run")
    );
}

#[test]
fn an_unreachable_store_keeps_the_recording_and_takes_it_once_back() {
    let port = free_port();
    let c = Cluster::start_with(Options {
        recordings: Some(format!(
            "{{uri: 's3://{BUCKET}/later', endpoint: 'http://127.0.0.1:{port}'}}"
        )),
        env: credentials(),
        diag_addr: Some("127.0.0.1:0".into()),
        ..Options::default()
    });
    let metrics = || {
        let diag = c.diag.clone().expect("the diagnostics listener");
        let out = Command::new("curl")
            .args(["-sS", &format!("http://{diag}/metrics")])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    c.wait_online("local1");
    let home = c.user("lee", "access", "root");
    c.ssh(
        &c.ssh_config(&home, "lee"),
        &["root@local1", "echo kept-on-disk"],
        "",
    )
    .ok();
    let id = session(&c, &home, "kept-on-disk")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(20), || {
            c.log()
                .lines()
                .any(|l| l.contains("a recording could not be uploaded") && l.contains(&id))
        }),
        "no upload failure in the log:\n{}",
        c.log()
    );
    let log = c.log();
    assert!(
        log.contains("the recording store cannot be used now"),
        "{log}"
    );
    assert!(
        log.contains("the recording store s3://recordings/later failed"),
        "{log}"
    );
    assert!(!log.contains("sallyport-test-secret-never-logged"), "{log}");
    // Nothing lost: the recording stays on disk, counted in the backlog, and replays from there.
    assert!(local(&c, &id).exists());
    let size = std::fs::metadata(local(&c, &id)).unwrap().len();
    let m = metrics();
    assert!(
        m.contains("sallyport_recording_upload_backlog_files 1\n"),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "sallyport_recording_upload_backlog_bytes {size}\n"
        )),
        "{m}"
    );
    assert_eq!(play_text(&c, &home, &id), "kept-on-disk\n");
    // The store comes back: a later try uploads it and the local copy goes.
    let moto = Moto::start_on(port);
    moto.bucket(BUCKET);
    assert!(
        eventually(Duration::from_secs(30), || {
            moto.list(BUCKET, "later/")
                .iter()
                .any(|(k, _)| *k == format!("later/{id}.cast"))
                && !local(&c, &id).exists()
        }),
        "not uploaded once the store was back"
    );
    assert_eq!(play_text(&c, &home, &id), "kept-on-disk\n");
    assert!(eventually(Duration::from_secs(5), || metrics()
        .contains("sallyport_recording_upload_backlog_files 0\n")));
}

#[test]
fn wrong_credentials_keep_the_recording_and_say_so() {
    let moto = Moto::start_checking_credentials();
    let c = cluster(&moto.endpoint, "denied", credentials());
    c.wait_online("local1");
    let home = c.user("max", "access", "root");
    c.ssh(
        &c.ssh_config(&home, "max"),
        &["root@local1", "echo not-lost"],
        "",
    )
    .ok();
    let id = session(&c, &home, "not-lost")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        eventually(Duration::from_secs(20), || {
            c.log().lines().any(|l| {
                l.contains("a recording could not be uploaded")
                    && l.contains(&id)
                    && l.contains("InvalidAccessKeyId")
            })
        }),
        "no refused upload in the log:\n{}",
        c.log()
    );
    assert!(!c.log().contains("sallyport-test-secret-never-logged"));
    assert!(local(&c, &id).exists());
    assert_eq!(play_text(&c, &home, &id), "not-lost\n");
}

#[test]
fn a_bad_recordings_uri_or_missing_credentials_stop_the_start() {
    let dir = TempDir::new().unwrap();
    for (section, env, said) in [
        (
            "{uri: 'gs://bucket/x'}",
            credentials(),
            "recordings: uri \"gs://bucket/x\": unknown scheme \"gs\"; use s3://BUCKET[/PREFIX] or file:///PATH",
        ),
        (
            "{uri: 's3://bucket/x', endpoint: 'http://127.0.0.1:9'}",
            vec![],
            "recordings: the store s3://bucket/x needs AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in the environment",
        ),
    ] {
        let config = dir.path().join("sallyport.yaml");
        std::fs::write(
            &config,
            format!(
                "version: v1\nsallyport: {{data_dir: {}}}\nrecordings: {section}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let r = run(
            Command::new(bin("sallyport"))
                .args(["start", "--config"])
                .arg(&config)
                .env_remove("AWS_ACCESS_KEY_ID")
                .env_remove("AWS_SECRET_ACCESS_KEY")
                .envs(env),
            "",
        );
        r.fails_with(said);
    }
}

/// The daemon's peak resident memory so far, in bytes.
fn peak_rss(c: &Cluster) -> u64 {
    let pid = c.pid().unwrap();
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn a_large_recording_streams_from_s3_with_flat_memory() {
    let moto = Moto::start();
    moto.bucket(BUCKET);
    let c = cluster(&moto.endpoint, "large", credentials());
    c.wait_online("local1");
    let home = c.user("ada", "access", "root");
    c.ssh(
        &c.ssh_config(&home, "ada"),
        &["root@local1", "echo small"],
        "",
    )
    .ok();
    let id = session(&c, &home, "small")["session_id"]
        .as_str()
        .unwrap()
        .to_string();
    let key = format!("large/{id}.cast");
    assert!(eventually(Duration::from_secs(20), || {
        moto.list(BUCKET, "large/").iter().any(|(k, _)| *k == key)
    }));
    // The session's recording in the store becomes a 256 MiB one (as a long session's would
    // be): 1 KiB events.
    let big = c.dir.path().join("big.cast");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&big).unwrap());
    writeln!(f, "{{\"version\": 2, \"width\": 80, \"height\": 24}}").unwrap();
    let text = "x".repeat(1000);
    let events = 256 * 1024;
    for i in 0..events {
        writeln!(f, "[{}.{:03}, \"o\", \"{text}\\r\\n\"]", i / 1000, i % 1000).unwrap();
    }
    drop(f);
    let size = std::fs::metadata(&big).unwrap().len();
    moto.put_file(BUCKET, &key, &big);
    std::fs::remove_file(&big).unwrap();
    assert_eq!(
        moto.list(BUCKET, "large/"),
        vec![(key.clone(), size)],
        "the large object in place"
    );
    let before = peak_rss(&c);
    let started = Instant::now();
    let mut play = Command::new(bin("sally"))
        .env("SALLY_HOME", &home)
        .args(["play", &id, "--format", "asciicast"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = play.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    let mut last = Vec::new();
    loop {
        let n = stdout.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        got += n as u64;
        last = buf[..n].to_vec();
    }
    let status = play.wait().unwrap();
    let elapsed = started.elapsed();
    assert!(status.success(), "sally play failed");
    assert_eq!(got, size, "the whole recording arrived");
    assert!(String::from_utf8_lossy(&last).ends_with(&format!("{text}\\r\\n\"]\n")));
    let grew = peak_rss(&c).saturating_sub(before);
    eprintln!(
        "streamed {} MiB from S3 through auth in {elapsed:?}; the daemon's peak RSS grew {} KiB",
        size >> 20,
        grew >> 10
    );
    assert!(
        grew < 64 << 20,
        "the daemon's peak memory grew {} MiB while streaming {} MiB",
        grew >> 20,
        size >> 20
    );
}
