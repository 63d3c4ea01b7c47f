//! File transfer through the proxy with the real clients: `scp` (SFTP-based and legacy `-O`),
//! `scp -r`, `sftp -b`, `rsync -e ssh`; byte-identical results checked by SHA-256; the
//! `ssh_file_copy` role option; and the `sftp`/`scp` audit events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sallyport_tests::*;

fn events(c: &Cluster, kind: &str) -> Vec<serde_json::Value> {
    c.events(kind)
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// A file of `len` pseudo-random bytes.
fn random_file(path: &Path, len: usize) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    std::fs::write(path, data).unwrap();
}

fn tool(name: &str, cfg: &Path) -> Command {
    let mut c = Command::new(name);
    c.arg("-F").arg(cfg).args(["-o", "ProxyJump=proxy"]);
    c
}

#[test]
fn scp_sftp_and_rsync_carry_files_byte_for_byte_and_are_audited() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root,sallytest");
    let cfg = c.ssh_config(&home, "alice");
    let work = c.dir.path().join("files");
    std::fs::create_dir_all(work.join("tree/sub")).unwrap();
    let big = work.join("big.bin");
    random_file(&big, 12 * 1024 * 1024 + 17);
    std::fs::write(work.join("tree/a.txt"), "alpha\n").unwrap();
    std::fs::write(work.join("tree/sub/b.txt"), "beta\n").unwrap();
    let remote = format!("/tmp/sallyport-copy-{}", std::process::id());

    // scp (SFTP underneath, OpenSSH 9): up, then back down, byte-identical.
    run(
        tool("ssh", &cfg).args(["root@local1", &format!("mkdir -p {remote}")]),
        "",
    )
    .ok();
    run(
        tool("scp", &cfg)
            .arg("-q")
            .arg(&big)
            .arg(format!("root@local1:{remote}/big.bin")),
        "",
    )
    .ok();
    let back = work.join("back.bin");
    run(
        tool("scp", &cfg)
            .arg("-q")
            .arg(format!("root@local1:{remote}/big.bin"))
            .arg(&back),
        "",
    )
    .ok();
    assert_eq!(sha256(&big), sha256(&back));

    // Legacy scp protocol (`scp -O`), recursive.
    run(
        tool("scp", &cfg)
            .args(["-O", "-q", "-r"])
            .arg(work.join("tree"))
            .arg(format!("root@local1:{remote}/")),
        "",
    )
    .ok();
    let r = run(
        tool("ssh", &cfg).args(["root@local1", &format!("cat {remote}/tree/sub/b.txt")]),
        "",
    )
    .ok();
    assert_eq!(r.stdout, "beta\n");
    let legacy_back = work.join("legacy.bin");
    run(
        tool("scp", &cfg)
            .args(["-O", "-q"])
            .arg(format!("root@local1:{remote}/big.bin"))
            .arg(&legacy_back),
        "",
    )
    .ok();
    assert_eq!(sha256(&big), sha256(&legacy_back));

    // sftp in batch mode: put, rename, mkdir, get, remove.
    let batch = work.join("batch");
    std::fs::write(
        &batch,
        format!(
            "put {a} {remote}/s.txt\nrename {remote}/s.txt {remote}/t.txt\nmkdir {remote}/newdir\nget {remote}/t.txt {got}\nrm {remote}/t.txt\n",
            a = work.join("tree/a.txt").display(),
            got = work.join("got.txt").display(),
        ),
    )
    .unwrap();
    run(
        tool("sftp", &cfg).arg("-b").arg(&batch).arg("root@local1"),
        "",
    )
    .ok();
    assert_eq!(
        std::fs::read_to_string(work.join("got.txt")).unwrap(),
        "alpha\n"
    );

    // rsync over ssh.
    if Command::new("rsync").arg("--version").output().is_ok() {
        let ssh = format!("ssh -F {} -o ProxyJump=proxy", cfg.display());
        run(
            Command::new("rsync")
                .args(["-a", "-e", &ssh])
                .arg(format!("{}/", work.join("tree").display()))
                .arg(format!("root@local1:{remote}/synced/")),
            "",
        )
        .ok();
        let r = run(
            tool("ssh", &cfg).args(["root@local1", &format!("cat {remote}/synced/sub/b.txt")]),
            "",
        )
        .ok();
        assert_eq!(r.stdout, "beta\n");
    } else {
        panic!("rsync is not installed: run scripts/test, which installs it");
    }

    // Files are written as the login.
    run(
        tool("scp", &cfg)
            .arg("-q")
            .arg(work.join("tree/a.txt"))
            .arg("sallytest@local1:/home/sallytest/mine.txt"),
        "",
    )
    .ok();
    let r = run(
        tool("ssh", &cfg).args(["sallytest@local1", "stat -c %U /home/sallytest/mine.txt"]),
        "",
    )
    .ok();
    assert_eq!(r.stdout.trim(), "sallytest");

    // A full or forbidden destination is an error the client sees, not a success.
    run(
        tool("scp", &cfg)
            .arg("-q")
            .arg(work.join("tree/a.txt"))
            .arg("sallytest@local1:/root/nope.txt"),
        "",
    )
    .fails_with("ermission denied");

    // The audit trail: every SFTP operation with path, bytes and result; legacy scp per file.
    let mut sftp = vec![];
    assert!(
        eventually(Duration::from_secs(10), || {
            sftp = events(&c, "sftp");
            sftp.iter().any(|e| e["action"] == "remove")
        }),
        "{sftp:#?}"
    );
    let upload = sftp
        .iter()
        .find(|e| e["path"] == format!("{remote}/big.bin") && e["mode"] == "write")
        .expect("upload audited");
    assert_eq!(upload["bytes"], 12 * 1024 * 1024 + 17);
    assert_eq!(upload["result"], "ok");
    assert_eq!(upload["user"], "alice");
    assert_eq!(upload["login"], "root");
    assert_eq!(upload["node"], "local1");
    assert!(sftp.iter().any(|e| e["path"] == format!("{remote}/big.bin")
        && e["mode"] == "read"
        && e["bytes"] == 12 * 1024 * 1024 + 17));
    assert!(sftp.iter().any(|e| e["action"] == "rename"
        && e["path"] == format!("{remote}/s.txt")
        && e["target"] == format!("{remote}/t.txt")));
    assert!(
        sftp.iter()
            .any(|e| e["action"] == "mkdir" && e["path"] == format!("{remote}/newdir"))
    );
    assert!(sftp.iter().any(|e| e["path"] == "/root/nope.txt"
        && e["result"].as_str().unwrap().contains("ermission denied")));
    let scp = events(&c, "scp");
    assert!(
        scp.iter().any(|e| e["tool"] == "scp"
            && e["file"] == "tree/sub/b.txt"
            && e["direction"] == "upload"
            && e["size"] == 5),
        "{scp:#?}"
    );
    assert!(scp.iter().any(|e| e["tool"] == "scp"
        && e["direction"] == "download"
        && e["size"] == 12 * 1024 * 1024 + 17));
    assert!(
        scp.iter()
            .any(|e| e["tool"] == "rsync" && e["direction"] == "upload")
    );
    run(
        tool("ssh", &cfg).args(["root@local1", &format!("rm -rf {remote}")]),
        "",
    )
    .ok();
}

#[test]
fn ssh_file_copy_false_refuses_copies_but_not_shells() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: no-copy}\nspec:\n  options: {ssh_file_copy: false}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("erin", "no-copy", "");
    let cfg = c.ssh_config(&home, "erin");
    let file = c.dir.path().join("x.txt");
    std::fs::write(&file, "x\n").unwrap();
    let remote = format!("/tmp/sallyport-nocopy-{}", std::process::id());
    // scp over SFTP, legacy scp, sftp and rsync are each refused, saying why.
    run(
        tool("scp", &cfg)
            .arg(&file)
            .arg(format!("root@local1:{remote}")),
        "",
    )
    .fails_with("ssh_file_copy");
    run(
        tool("scp", &cfg)
            .arg("-O")
            .arg(&file)
            .arg(format!("root@local1:{remote}")),
        "",
    )
    .fails_with("ssh_file_copy");
    let batch = c.dir.path().join("batch");
    std::fs::write(&batch, "ls /\n").unwrap();
    run(
        tool("sftp", &cfg).arg("-b").arg(&batch).arg("root@local1"),
        "",
    )
    .fails_with("ssh_file_copy");
    let ssh = format!("ssh -F {} -o ProxyJump=proxy", cfg.display());
    run(
        Command::new("rsync")
            .args(["-e", &ssh])
            .arg(&file)
            .arg(format!("root@local1:{remote}")),
        "",
    )
    .fails_with("ssh_file_copy");
    // Nothing arrived.
    let r = run(
        tool("ssh", &cfg).args([
            "root@local1",
            &format!("test -e {remote} && echo there || echo absent"),
        ]),
        "",
    )
    .ok();
    assert_eq!(r.stdout, "absent\n");
    // The refusals are in the audit log.
    assert!(eventually(Duration::from_secs(10), || {
        events(&c, "scp").iter().any(|e| {
            e["result"]
                .as_str()
                .is_some_and(|r| r.contains("ssh_file_copy"))
        }) && events(&c, "sftp").iter().any(|e| {
            e["result"]
                .as_str()
                .is_some_and(|r| r.contains("ssh_file_copy"))
        })
    }));
}

/// A 1 MiB tmpfs, unmounted when the test ends.
struct SmallDisk(std::path::PathBuf);

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_on_the_node_is_an_error_the_client_sees() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let mnt = c.dir.path().join("full");
    std::fs::create_dir_all(&mnt).unwrap();
    let r = run(
        Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(&mnt),
        "",
    );
    assert_eq!(r.code, 0, "the tests run as root (scripts/test): {r:?}");
    let _disk = SmallDisk(mnt.clone());
    let big = c.dir.path().join("three-mib.bin");
    random_file(&big, 3 * 1024 * 1024);
    // SFTP-based scp and legacy scp both fail, visibly.
    let r = run(
        tool("scp", &cfg)
            .arg("-q")
            .arg(&big)
            .arg(format!("root@local1:{}/a.bin", mnt.display())),
        "",
    );
    assert_ne!(r.code, 0, "{r:?}");
    let r = run(
        tool("scp", &cfg)
            .args(["-O", "-q"])
            .arg(&big)
            .arg(format!("root@local1:{}/b.bin", mnt.display())),
        "",
    );
    assert_ne!(r.code, 0, "{r:?}");
    assert!(r.stderr.contains("No space left on device"), "{r:?}");
    // The audit does not call the SFTP upload a success.
    let path = format!("{}/a.bin", mnt.display());
    let mut ops = vec![];
    assert!(eventually(Duration::from_secs(10), || {
        ops = events(&c, "sftp")
            .into_iter()
            .filter(|e| e["path"] == path.as_str() && e["mode"] == "write")
            .collect();
        !ops.is_empty()
    }));
    assert!(ops.iter().all(|e| e["result"] != "ok"), "{ops:#?}");
}

/// The session id and .cast text of the one recording whose command is `command`.
fn recording_of(c: &Cluster, home: &Path, command: &str) -> Option<(String, String)> {
    let list: serde_json::Value = serde_json::from_str(
        &c.sally(home, &["recordings", "ls", "--format", "json"], "")
            .ok()
            .stdout,
    )
    .ok()?;
    let id = list.as_array()?.iter().find(|s| s["command"] == command)?["session_id"]
        .as_str()?
        .to_string();
    let cast =
        std::fs::read_to_string(c.data_dir().join("recordings").join(format!("{id}.cast"))).ok()?;
    Some((id, cast))
}

#[test]
fn a_command_that_only_mentions_a_copy_is_a_recorded_session() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: strict}\nspec:\n  options: {record_session: {ssh: strict}}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("sam", "strict", "");
    let auditor = c.user("audrey", "auditor", "");
    let cfg = c.ssh_config(&home, "sam");
    // Each of these once ran unrecorded because it contained a copy program's server flags.
    for command in [
        "echo rsync-dodge; : rsync --server",
        "echo scp-dodge; : scp -t /tmp/x",
        "echo sftp-dodge; : /usr/lib/openssh/sftp-server",
        "echo wrapped-dodge && rsync --server --version >/dev/null 2>&1; true",
    ] {
        let said = command
            .split(';')
            .next()
            .unwrap()
            .trim_start_matches("echo ");
        let said = said.split(" &&").next().unwrap();
        let r = c.ssh(&cfg, &["root@local1", command], "").ok();
        assert_eq!(r.stdout, format!("{said}\n"));
        let mut found = None;
        assert!(
            eventually(Duration::from_secs(10), || {
                found = recording_of(&c, &auditor, command);
                found.is_some()
            }),
            "no recording of {command:?}"
        );
        let (_, cast) = found.unwrap();
        assert!(
            cast.contains(said),
            "{command:?} recorded without its output: {cast}"
        );
    }
    // Real copies are still copies: audited per file, not recorded as terminal output.
    let file = c.dir.path().join("real.txt");
    std::fs::write(&file, "real\n").unwrap();
    let remote = format!("/tmp/sallyport-real-{}", std::process::id());
    run(
        tool("scp", &cfg)
            .args(["-O", "-q"])
            .arg(&file)
            .arg(format!("root@local1:{remote}")),
        "",
    )
    .ok();
    assert!(eventually(Duration::from_secs(10), || {
        events(&c, "scp")
            .iter()
            .any(|e| e["tool"] == "scp" && e["path"] == remote.as_str() && e["size"] == 5)
    }));
    c.ssh(&cfg, &["root@local1", &format!("rm -f {remote}")], "")
        .ok();
}

#[test]
fn ssh_file_copy_false_refuses_copies_wrapped_in_a_shell() {
    let c = Cluster::start();
    c.create(
        "kind: role\nversion: v1\nmetadata: {name: no-copy}\nspec:\n  options: {ssh_file_copy: false}\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n",
    )
    .ok();
    c.wait_online("local1");
    let home = c.user("erin", "no-copy", "");
    let cfg = c.ssh_config(&home, "erin");
    let remote = format!("/tmp/sallyport-wrapped-{}", std::process::id());
    // Not an exact copy, so it would be a recorded session, but it runs one: still refused.
    c.ssh(
        &cfg,
        &["root@local1", &format!("cd /tmp && scp -t {remote}")],
        "C0644 2 x\nx\n\0",
    )
    .fails_with("file copy (scp, sftp, rsync) is not allowed by your roles (ssh_file_copy: false)");
    let r = c
        .ssh(
            &cfg,
            &[
                "root@local1",
                &format!("test -e {remote} && echo there || echo absent"),
            ],
            "",
        )
        .ok();
    assert_eq!(r.stdout, "absent\n");
}

#[test]
fn a_copy_that_stops_speaking_scp_is_cut_off_and_audited() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let remote = format!("/tmp/sallyport-notscp-{}", std::process::id());
    // An exact `scp -t` runs unrecorded, so what it carries must be scp: shell text is not.
    let r = c.ssh(
        &cfg,
        &["root@local1", &format!("scp -t {remote}")],
        "id; cat /etc/shadow\n",
    );
    assert_ne!(r.code, 0, "{r:?}");
    assert!(
        r.stderr
            .contains("sallyport: the stream is not the legacy scp protocol; closing"),
        "{r:?}"
    );
    // The same for the answers to a download.
    let r = c.ssh(&cfg, &["root@local1", "scp -f /etc/hostname"], "whoami\n");
    assert_ne!(r.code, 0, "{r:?}");
    assert!(eventually(Duration::from_secs(10), || {
        events(&c, "scp")
            .iter()
            .filter(|e| {
                e["result"] == "the stream is not the legacy scp protocol" && e["user"] == "alice"
            })
            .count()
            >= 2
    }));
    // Real legacy scp still works both ways.
    let file = c.dir.path().join("legit.txt");
    std::fs::write(&file, "legit\n").unwrap();
    run(
        tool("scp", &cfg)
            .args(["-O", "-q"])
            .arg(&file)
            .arg(format!("root@local1:{remote}")),
        "",
    )
    .ok();
    let back = c.dir.path().join("back.txt");
    run(
        tool("scp", &cfg)
            .args(["-O", "-q"])
            .arg(format!("root@local1:{remote}"))
            .arg(&back),
        "",
    )
    .ok();
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "legit\n");
    c.ssh(&cfg, &["root@local1", &format!("rm -f {remote}")], "")
        .ok();
}
