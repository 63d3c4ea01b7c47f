//! A file copy runs unrecorded, so on an agent node it runs as the agent reads it, never
//! through the login's shell: a `~/.bashrc` that redefines `rsync` or `scp` (bash reads it for
//! `bash -c` under sshd's SSH_CLIENT) does not change what a copy runs, and the `sftp`
//! subsystem starts the system sftp-server directly too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sallyport_tests::*;

/// The login `scripts/test` creates, with a `~/.bashrc` of ours while the test runs.
const LOGIN: &str = "sallytest";

/// Puts the login's `~/.bashrc` back as it was when dropped.
struct Bashrc {
    path: PathBuf,
    before: Option<Vec<u8>>,
    log: PathBuf,
}

impl Drop for Bashrc {
    fn drop(&mut self) {
        match &self.before {
            Some(b) => {
                let _ = std::fs::write(&self.path, b);
            }
            None => {
                let _ = std::fs::remove_file(&self.path);
            }
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// A `~/.bashrc` whose functions named `rsync` and `scp` print HIJACKED, and that notes every
/// `bash -c` command that read it in `log`.
fn hijacking_bashrc(home: &Path, log: &Path) -> Bashrc {
    let path = home.join(".bashrc");
    let before = std::fs::read(&path).ok();
    let mut text = format!(
        "echo \"$BASH_EXECUTION_STRING\" >> {}\nrsync(){{ echo HIJACKED; }}\nscp(){{ echo HIJACKED; }}\n",
        log.display()
    )
    .into_bytes();
    text.extend(before.clone().unwrap_or_default());
    std::fs::write(&path, text).unwrap();
    let _ = Command::new("chown")
        .arg(format!("{LOGIN}:"))
        .arg(&path)
        .status();
    Bashrc {
        path,
        before,
        log: log.to_path_buf(),
    }
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// `/etc/pam.d/<name>` that permits everything, removed when dropped.
struct PamService(String);

impl Drop for PamService {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(Path::new("/etc/pam.d").join(&self.0));
    }
}

/// Without PAM (the agent starts the program) and with it (`sallyport session-exec` does).
#[test]
fn a_copy_runs_the_real_program_whatever_the_logins_shell_says() {
    let login_home = PathBuf::from(format!("/home/{LOGIN}"));
    let id = std::process::id();
    let log = login_home.join(format!(".sallyport-rc-log-{id}"));
    let _rc = hijacking_bashrc(&login_home, &log);
    let c = Cluster::start();
    c.wait_online("local1");
    copies_ignore_the_shell(&c, &login_home, &log, "plain");
    drop(c);
    let service = PamService(format!("sallyport-copy-exec-{id}"));
    std::fs::write(
        Path::new("/etc/pam.d").join(&service.0),
        "account required pam_permit.so\nsession required pam_permit.so\n",
    )
    .unwrap();
    let c = Cluster::start_with(Options {
        ssh_service: vec![format!(
            "pam: {{enabled: true, service_name: {}}}",
            service.0
        )],
        ..Options::default()
    });
    c.wait_online("local1");
    copies_ignore_the_shell(&c, &login_home, &log, "pam");
}

fn copies_ignore_the_shell(c: &Cluster, login_home: &Path, log: &Path, tag: &str) {
    let home = c.user("alice", "access", LOGIN);
    let cfg = c.ssh_config(&home, "alice");
    let id = format!("{}-{tag}", std::process::id());
    let _ = std::fs::remove_file(log);
    let work = c.dir.path().join("files");
    std::fs::create_dir_all(&work).unwrap();
    let file = work.join("data.bin");
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    std::fs::write(&file, &data).unwrap();
    let ssh = format!("ssh -F {} -J proxy", cfg.display());
    let up = format!("copy-exec-{id}.bin");

    // rsync up (into the home by `~/`) and back down (--sender): the real rsync ran.
    run(
        Command::new("rsync")
            .args(["-e", &ssh])
            .arg(&file)
            .arg(format!("{LOGIN}@local1:~/{up}")),
        "",
    )
    .ok();
    let back = work.join("back.bin");
    run(
        Command::new("rsync")
            .args(["-e", &ssh])
            .arg(format!("{LOGIN}@local1:{up}"))
            .arg(&back),
        "",
    )
    .ok();
    assert_eq!(sha256(&file), sha256(&back));
    assert_eq!(sha256(&file), sha256(&login_home.join(&up)));

    // Legacy scp both ways, and scp over SFTP (the sftp subsystem).
    let scp_up = format!("copy-exec-scp-{id}.bin");
    run(
        Command::new("scp")
            .arg("-F")
            .arg(&cfg)
            .args(["-J", "proxy", "-O", "-q"])
            .arg(&file)
            .arg(format!("{LOGIN}@local1:{scp_up}")),
        "",
    )
    .ok();
    let scp_back = work.join("scp-back.bin");
    for legacy in [true, false] {
        let _ = std::fs::remove_file(&scp_back);
        run(
            Command::new("scp")
                .arg("-F")
                .arg(&cfg)
                .args(["-J", "proxy", "-q"])
                .args(legacy.then_some("-O"))
                .arg(format!("{LOGIN}@local1:{scp_up}"))
                .arg(&scp_back),
            "",
        )
        .ok();
        assert_eq!(sha256(&file), sha256(&scp_back), "legacy: {legacy}");
    }

    // The server sides asked for by hand: the real programs answer, not the functions.
    for command in [
        "rsync --server -e.LsfxC . /tmp/x".to_string(),
        format!("rsync --server --sender -e.LsfxC . ~/{up}"),
        "scp -t /tmp/x".to_string(),
        format!("scp -f {up}"),
    ] {
        let r = c.ssh(&cfg, &[&format!("{LOGIN}@local1"), &command], "");
        assert!(
            !r.stdout.contains("HIJACKED") && !r.stderr.contains("HIJACKED"),
            "{command:?} ran the login's function: {r:?}"
        );
    }
    // A copy program the node does not have is refused, not looked for in the login's PATH.
    c.ssh(
        &cfg,
        &[&format!("{LOGIN}@local1"), "/usr/libexec/sftp-server"],
        "",
    )
    .fails_with("sallyport: /usr/libexec/sftp-server is not installed on node local1");
    // Not one copy went through the login's shell.
    let through_shell = std::fs::read_to_string(log).unwrap_or_default();
    assert!(
        !through_shell.contains("--server")
            && !through_shell.contains("scp ")
            && !through_shell.contains("sftp-server"),
        "copies ran through bash -c: {through_shell}"
    );

    // The same words that are not a copy run as a (recorded) session through the shell,
    // which does read the function: the ~/.bashrc above is in force.
    let r = c
        .ssh(&cfg, &[&format!("{LOGIN}@local1"), "rsync --version"], "")
        .ok();
    assert_eq!(r.stdout, "HIJACKED\n");
    assert!(
        std::fs::read_to_string(log)
            .unwrap()
            .contains("rsync --version")
    );

    let _ = std::fs::remove_file(login_home.join(&up));
    let _ = std::fs::remove_file(login_home.join(&scp_up));
}
