//! SFTP audit follows the protocol exactly: attribute changes, links and extension requests are
//! audited by name from what the real `sftp` client sends, and a client that breaks the protocol
//! to hide an operation (a request id reused while pending) has its channel ended, with the
//! reason in the audit log and the hidden request never reaching the node.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use sallyport_tests::*;

fn tool(name: &str, cfg: &Path) -> Command {
    let mut c = Command::new(name);
    c.arg("-F").arg(cfg).args(["-o", "ProxyJump=proxy"]);
    c
}

fn sftp_ops(c: &Cluster) -> Vec<serde_json::Value> {
    c.events("sftp")
}

fn has(ops: &[serde_json::Value], action: &str, path: &str) -> bool {
    ops.iter()
        .any(|e| e["action"] == action && e["path"].as_str() == Some(path))
}

#[test]
fn chmod_links_and_extensions_from_real_sftp_are_audited() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let remote = format!("/tmp/sallyport-sftp-audit-{}", std::process::id());
    run(
        tool("ssh", &cfg).args([
            "root@local1",
            &format!("mkdir -p {remote} && echo x > {remote}/f"),
        ]),
        "",
    )
    .ok();
    let batch = c.dir.path().join("batch");
    std::fs::write(
        &batch,
        format!(
            "chmod 600 {remote}/f\nsymlink {remote}/f {remote}/soft\nln {remote}/f {remote}/hard\ndf {remote}\n"
        ),
    )
    .unwrap();
    run(
        tool("sftp", &cfg).arg("-b").arg(&batch).arg("root@local1"),
        "",
    )
    .ok();
    let f = format!("{remote}/f");
    let soft = format!("{remote}/soft");
    let hard = format!("{remote}/hard");
    assert!(
        eventually(Duration::from_secs(10), || {
            let ops = sftp_ops(&c);
            has(&ops, "setstat", &f)
                && has(&ops, "symlink", &soft)
                && has(&ops, "hardlink", &hard)
                && ops
                    .iter()
                    .any(|e| e["action"] == "extended" && e["extension"] == "statvfs@openssh.com")
        }),
        "{:#?}",
        sftp_ops(&c)
    );
    let ops = sftp_ops(&c);
    let link = ops.iter().find(|e| e["action"] == "symlink").unwrap();
    assert_eq!(link["target"], f.as_str());
    assert_eq!(link["result"], "ok");
    assert_eq!(link["user"], "alice");
}

/// One SFTP packet: length, type, request id, fields.
fn packet(kind: u8, id: Option<u32>, fields: &[&[u8]]) -> Vec<u8> {
    let mut body = vec![kind];
    if let Some(id) = id {
        body.extend_from_slice(&id.to_be_bytes());
    }
    for f in fields {
        body.extend_from_slice(f);
    }
    let mut p = (body.len() as u32).to_be_bytes().to_vec();
    p.extend(body);
    p
}

fn string(b: &[u8]) -> Vec<u8> {
    let mut v = (b.len() as u32).to_be_bytes().to_vec();
    v.extend_from_slice(b);
    v
}

#[test]
fn a_reused_request_id_ends_the_channel_with_the_reason_audited() {
    let c = Cluster::start();
    c.wait_online("local1");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let decoy = format!("/tmp/sallyport-decoy-{}", std::process::id());
    let victim = format!("/tmp/sallyport-victim-{}", std::process::id());
    run(
        tool("ssh", &cfg).args(["root@local1", &format!("mkdir -p {victim}")]),
        "",
    )
    .ok();

    // A hand-made client: INIT, then RMDIR with id 7 and, before its reply, MKDIR with id 7
    // again: the server's one reply would close both in the audit, and one would be lost.
    let mut stream = packet(1, None, &[&3u32.to_be_bytes()]);
    stream.extend(packet(15, Some(7), &[&string(victim.as_bytes())]));
    stream.extend(packet(
        14,
        Some(7),
        &[&string(decoy.as_bytes()), &0u32.to_be_bytes()],
    ));
    let mut child = tool("ssh", &cfg)
        .args(["-s", "root@local1", "sftp"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&stream).unwrap();
        // Keep stdin open: the proxy, not the end of input, must end the channel.
        std::thread::sleep(Duration::from_secs(3));
        drop(stdin);
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("request id 7 reused while its request is pending"),
        "stderr: {stderr}"
    );
    assert!(
        eventually(Duration::from_secs(10), || sftp_ops(&c).iter().any(
            |e| e["action"] == "abort"
                && e["result"]
                    .as_str()
                    .is_some_and(|r| r.contains("request id 7 reused"))
        )),
        "{:#?}",
        sftp_ops(&c)
    );
    // The packet that broke the protocol never reached the node.
    let r = run(
        tool("ssh", &cfg).args([
            "root@local1",
            &format!("test -e {decoy} && echo present || echo absent"),
        ]),
        "",
    )
    .ok();
    assert_eq!(r.stdout.trim(), "absent");
}
