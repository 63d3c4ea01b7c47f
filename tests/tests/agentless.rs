//! Agentless nodes: a real OpenSSH `sshd`, started by this test, that trusts the cluster's
//! OpenSSH CA (`sallyctl auth export --type=openssh`), reached through the proxy with
//! per-session certificates. A person's own login certificate (from the user CA) does not open
//! it directly. Its host key is pinned at first contact; a changed key is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use sallyport_tests::*;

#[test]
fn plain_sshd_behind_the_proxy_with_a_pinned_host_key() {
    let c = Cluster::start();
    let ca = c
        .sallyctl(&["auth", "export", "--type=openssh"])
        .ok()
        .stdout;
    assert!(ca.starts_with("ssh-ed25519 "), "{ca}");
    assert_ne!(
        ca,
        c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout
    );
    let node = c.agentless_node("plain1", &["--labels", "env=legacy"]);
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
    drop(node.sshd);
    let _impostor = start_sshd(&node.dir, node.port, &ca, "other-hostkey");
    c.ssh(&cfg, &["root@plain1", "true"], "")
        .fails_with("host key other than the one pinned");
}

/// OpenSSH straight at the agentless sshd with the user's own key and login certificate.
fn direct(dir: &Path, home: &Path, c: &Cluster, user: &str, port: u16) -> Run {
    let key = home.join("keys").join(c.proxy.replace(':', "_")).join(user);
    run(
        Command::new("ssh")
            .arg("-i")
            .arg(&key)
            .arg("-o")
            .arg(format!("CertificateFile={}-cert.pub", key.display()))
            .args([
                "-o",
                "IdentitiesOnly=yes",
                "-o",
                "BatchMode=yes",
                "-o",
                "StrictHostKeyChecking=no",
                "-o",
            ])
            .arg(format!(
                "UserKnownHostsFile={}",
                dir.join("direct_known_hosts").display()
            ))
            .args(["-p", &port.to_string(), "root@127.0.0.1", "echo direct"]),
        "",
    )
}

#[test]
fn a_login_certificate_does_not_open_an_agentless_node_directly() {
    let c = Cluster::start();
    let node = c.agentless_node("plain2", &[]);
    let home = c.user("mallory", "access", "root");
    // Past the proxy, skipping roles, locks, recording and audit: refused.
    direct(&node.dir, &home, &c, "mallory", node.port).fails_with("Permission denied");
    // Through the proxy: the per-session certificate from the OpenSSH CA.
    let cfg = c.ssh_config(&home, "mallory");
    let r = c.ssh(&cfg, &["root@plain2", "echo proxied"], "").ok();
    assert_eq!(r.stdout, "proxied\n");
    // A node still trusting the user CA (set up before the OpenSSH CA) is refused by the
    // proxy's certificate, with the switch to make in the message.
    drop(node.sshd);
    let user_ca = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    let _old = start_sshd(&node.dir, node.port, &user_ca, "hostkey");
    c.ssh(&cfg, &["root@plain2", "true"], "")
        .fails_with("sallyctl auth export --type=openssh");
}

#[test]
fn a_database_from_before_the_openssh_ca_gets_one_at_start() {
    let mut c = Cluster::start();
    let user = c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout;
    c.stop();
    c.sqlite("DELETE FROM cert_authorities WHERE kind = 'openssh';");
    c.boot();
    let openssh = c
        .sallyctl(&["auth", "export", "--type=openssh"])
        .ok()
        .stdout;
    assert!(openssh.starts_with("ssh-ed25519 "), "{openssh}");
    assert_ne!(openssh, user);
    // The other CAs are the ones the cluster had.
    assert_eq!(
        c.sallyctl(&["auth", "export", "--type=user"]).ok().stdout,
        user
    );
}

/// sshd runs every command through the login's shell, which the login can make run anything
/// for `rsync` (a function in ~/.bashrc), and rsync's stream is not held to its protocol: to
/// an agentless node an rsync is a recorded session, and still works.
#[test]
fn an_rsync_to_an_agentless_node_is_a_recorded_session() {
    let c = Cluster::start();
    let _node = c.agentless_node("plain3", &[]);
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let file = c.dir.path().join("synced.txt");
    std::fs::write(&file, "synced through sshd\n").unwrap();
    let remote = format!("/tmp/sallyport-agentless-rsync-{}", std::process::id());
    run(
        Command::new("rsync")
            .args(["-e", &format!("ssh -F {} -J proxy", cfg.display())])
            .arg(&file)
            .arg(format!("root@plain3:{remote}")),
        "",
    )
    .ok();
    assert_eq!(
        std::fs::read_to_string(&remote).unwrap(),
        "synced through sshd\n"
    );
    let _ = std::fs::remove_file(&remote);
    let auditor = c.user("audrey", "auditor", "");
    // Its session has a recording (a copy's has none).
    let recorded = || {
        let list: serde_json::Value = serde_json::from_str(
            &c.sally(&auditor, &["recordings", "ls", "--format", "json"], "")
                .ok()
                .stdout,
        )
        .unwrap_or_default();
        list.as_array().is_some_and(|l| {
            l.iter().any(|s| {
                s["command"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("rsync --server") && c.ends_with(&remote))
                    && s["session_id"].as_str().is_some_and(|id| {
                        std::fs::metadata(
                            c.data_dir().join("recordings").join(format!("{id}.cast")),
                        )
                        .is_ok_and(|m| m.len() > 0)
                    })
            })
        })
    };
    assert!(
        eventually(std::time::Duration::from_secs(10), recorded),
        "no recording of the rsync"
    );
}

/// One shell, command or subsystem per channel (stricter than sshd). Hostile: a client sends
/// `subsystem sftp` (an agentless sshd without a `Subsystem` line refuses it; the channel stays
/// open), then `exec` on the same channel. Before, the proxy had set the channel up as an SFTP
/// copy (unrecorded) when it passed the subsystem on, so the command ran unrecorded with its
/// stderr shown to the person. OpenSSH never sends a second request, so this client is sally's
/// own SSH library, driven by hand.
#[test]
fn a_second_program_on_one_channel_is_refused_even_after_a_refused_subsystem() {
    let c = Cluster::start();
    let _node = c.agentless_node("plain4", &[]);
    let home = c.user("alice", "access", "root");
    // sally's library reads its profile from here (the one test of this binary that links it).
    assert!(sallyport_cli::profile::use_home(home.clone()));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (subsystem, exec, shown) = rt.block_on(async {
        use sallyport_cli::{profile::Profile, ssh};
        let p = Profile::require().unwrap();
        let keys = ssh::Keys::load(&p).unwrap();
        let proxy = ssh::connect_proxy(&p, &keys, c.ssh_port).await.unwrap();
        let (node, _) = ssh::connect_node(&proxy, &keys, "plain4", "root", Default::default())
            .await
            .unwrap();
        let mut ch = node.channel_open_session().await.unwrap();
        // The answer to the last request, and everything the channel showed meanwhile.
        async fn answer(
            ch: &mut russh::Channel<russh::client::Msg>,
            shown: &mut Vec<u8>,
        ) -> Option<bool> {
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                let msg = tokio::time::timeout_at(deadline, ch.wait()).await.ok()??;
                match msg {
                    russh::ChannelMsg::Success => return Some(true),
                    russh::ChannelMsg::Failure => return Some(false),
                    russh::ChannelMsg::Data { data }
                    | russh::ChannelMsg::ExtendedData { data, .. } => {
                        shown.extend_from_slice(&data)
                    }
                    _ => {}
                }
            }
        }
        let mut shown = Vec::new();
        ch.request_subsystem(true, "sftp").await.unwrap();
        let subsystem = answer(&mut ch, &mut shown).await;
        ch.exec(true, "echo ran-unrecorded >&2; echo ran-unrecorded")
            .await
            .unwrap();
        let exec = answer(&mut ch, &mut shown).await;
        // Anything the command would print.
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
            while let Some(msg) = ch.wait().await {
                if let russh::ChannelMsg::Data { data }
                | russh::ChannelMsg::ExtendedData { data, .. } = msg
                {
                    shown.extend_from_slice(&data);
                }
            }
        })
        .await;
        (
            subsystem,
            exec,
            String::from_utf8_lossy(&shown).into_owned(),
        )
    });
    assert_eq!(subsystem, Some(false), "sshd has no sftp subsystem here");
    assert_eq!(
        exec,
        Some(false),
        "a second program on one channel was accepted"
    );
    assert!(
        !shown.contains("ran-unrecorded"),
        "the command ran: {shown:?}"
    );
}

/// A login removed when dropped.
struct HostLogin(String);

impl Drop for HostLogin {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["-r", &self.0]).output();
    }
}

/// Hostile: on an agentless node sshd runs a copy through the login's shell, so the login's
/// rc files can make `scp -t` anything. Its stdout is still held to scp's protocol; its stderr,
/// neither recorded nor parsed, is bounded: past 64 KiB it is dropped, said once and audited,
/// and the copy itself goes through.
#[test]
fn a_file_copys_error_output_is_bounded() {
    let login = HostLogin(format!("sperr{}", std::process::id() % 100_000));
    host_admin(&["useradd", "-m", "-s", "/bin/bash", &login.0]);
    // No password, but not locked ("!" makes sshd without PAM refuse every login).
    host_admin(&["usermod", "-p", "*", &login.0]);
    // What a login could put in its rc file: `scp` that talks on stderr instead.
    std::fs::write(
        format!("/home/{}/.bashrc", login.0),
        "scp() { head -c 300000 /dev/zero | tr '\\0' x >&2; command scp \"$@\"; }\n",
    )
    .unwrap();
    let c = Cluster::start();
    let _node = c.agentless_node("plain5", &[]);
    let home = c.user("alice", "access", &login.0);
    let cfg = c.ssh_config(&home, "alice");
    let file = c.dir.path().join("f.txt");
    std::fs::write(&file, "x\n").unwrap();
    let target = format!("/tmp/sallyport-sperr-{}", std::process::id());
    // A hang here is a failure in a minute, not at nextest's limit.
    let out = Command::new("timeout")
        .args(["60", "scp", "-F"])
        .arg(&cfg)
        .args(["-o", "ProxyJump=proxy", "-O"])
        .arg(&file)
        .arg(format!("{}@plain5:{target}", login.0))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = || stderr.chars().rev().take(300).collect::<String>();
    // The copy itself goes through; only its error output is cut.
    assert!(out.status.success(), "{}", tail());
    assert_eq!(
        std::fs::read_to_string(&target).ok().as_deref(),
        Some("x\n")
    );
    let _ = std::fs::remove_file(&target);
    assert!(
        stderr.contains("the file copy's error output past 64 KiB dropped"),
        "{}",
        tail()
    );
    let flood = stderr.matches('x').count();
    assert!(
        (64 * 1024..=64 * 1024 + 256).contains(&flood),
        "{flood} bytes of error output reached the person (64 KiB expected)"
    );
    assert!(
        eventually(Duration::from_secs(10), || c.events("scp").iter().any(
            |e| e["result"]
                .as_str()
                .is_some_and(|r| r.contains("error output past 64 KiB dropped"))
        )),
        "{:?}",
        c.events("scp")
    );
}
