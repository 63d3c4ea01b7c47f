//! Agentless nodes: a real OpenSSH `sshd`, started by this test, that trusts the cluster's user
//! CA (`sallyctl auth export --type=user`), reached through the proxy with per-session
//! certificates. Its host key is pinned at first contact; a changed key is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use sallyport_tests::*;

struct Sshd(Child);

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_sshd(dir: &Path, port: u16, ca: &str, hostkey_name: &str) -> Sshd {
    std::fs::create_dir_all("/run/sshd").unwrap();
    let key = dir.join(hostkey_name);
    if !key.exists() {
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    std::fs::write(dir.join("user_ca.pub"), ca).unwrap();
    let cfg = dir.join("sshd_config");
    std::fs::write(
        &cfg,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {key}\nTrustedUserCAKeys {ca}\nPidFile {pid}\nAuthorizedKeysFile none\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin yes\nUsePAM no\nStrictModes no\n",
            key = key.display(),
            ca = dir.join("user_ca.pub").display(),
            pid = dir.join("sshd.pid").display(),
        ),
    )
    .unwrap();
    let child = Command::new("/usr/sbin/sshd")
        .args(["-D", "-e", "-f"])
        .arg(&cfg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("/usr/sbin/sshd (scripts/test installs openssh-server)");
    assert!(
        eventually(Duration::from_secs(10), || std::net::TcpStream::connect((
            "127.0.0.1",
            port
        ))
        .is_ok()),
        "sshd did not start"
    );
    Sshd(child)
}

#[test]
fn plain_sshd_behind_the_proxy_with_a_pinned_host_key() {
    let c = Cluster::start();
    let dir = c.dir.path().join("sshd");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    let port = free_port();
    let sshd = start_sshd(&dir, port, &ca, "hostkey");
    c.sallyctl(&[
        "nodes",
        "add",
        "--name",
        "plain1",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--labels",
        "env=legacy",
    ])
    .ok();
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let r = c.ssh(&cfg, &["root@plain1", "echo agentless; exit 6"], "");
    assert_eq!((r.code, r.stdout.as_str()), (6, "agentless\n"), "{r:?}");
    let r = c.ssh(&cfg, &["root@plain1", "cat"], "through sshd\n").ok();
    assert_eq!(r.stdout, "through sshd\n");
    let r = c
        .sally(&home, &["ssh", "root@env=legacy", "echo", "selected"], "")
        .ok();
    assert_eq!(r.stdout, "[plain1] selected\n");
    // Recorded like any other session.
    let list = c
        .sally(&home, &["recordings", "ls", "--format", "json"], "")
        .ok()
        .stdout;
    assert!(list.contains("\"plain1\""), "{list}");
    // The same address answering with another host key is someone else: refused.
    drop(sshd);
    let _impostor = start_sshd(&dir, port, &ca, "other-hostkey");
    c.ssh(&cfg, &["root@plain1", "true"], "")
        .fails_with("host key other than the one pinned");
}
