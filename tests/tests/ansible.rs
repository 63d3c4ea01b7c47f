//! Ansible through the proxy, unchanged: `ansible -m ping`, `ansible -m copy` and a three-task
//! playbook against two nodes, with `pipelining = True` and ControlPersist, using only the
//! ssh_config a user gets from Sallyport. `ansible-core` comes from PyPI (scripts/test installs
//! it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use sallyport_tests::*;

fn setup(c: &Cluster, cfg: &Path) -> (PathBuf, PathBuf) {
    let dir = c.dir.path().join("ansible");
    std::fs::create_dir_all(&dir).unwrap();
    let inventory = dir.join("hosts.ini");
    std::fs::write(
        &inventory,
        format!(
            "[nodes]\nlocal1\nweb2\n\n[nodes:vars]\nansible_user=root\nansible_python_interpreter=/usr/bin/python3\nansible_ssh_common_args=-F {} -o ProxyJump=proxy\n",
            cfg.display()
        ),
    )
    .unwrap();
    let ansible_cfg = dir.join("ansible.cfg");
    std::fs::write(
        &ansible_cfg,
        format!(
            "[defaults]\ninventory = {inv}\nhost_key_checking = True\nlocal_tmp = {dir}/tmp\nforks = 4\n\n[ssh_connection]\npipelining = True\nssh_args = -o ControlMaster=auto -o ControlPersist=60s\ncontrol_path_dir = {dir}/cp\n",
            inv = inventory.display(),
            dir = dir.display()
        ),
    )
    .unwrap();
    (dir, ansible_cfg)
}

fn ansible(program: &str, cfg: &Path, args: &[&str]) -> Run {
    run(
        Command::new(program)
            .env("ANSIBLE_CONFIG", cfg)
            .env("ANSIBLE_NOCOLOR", "1")
            .env("ANSIBLE_FORCE_COLOR", "0")
            .args(args),
        "",
    )
}

#[test]
fn ansible_ping_copy_and_a_playbook_with_pipelining() {
    if Command::new("ansible").arg("--version").output().is_err() {
        panic!("ansible is not installed: run scripts/test, which installs ansible-core");
    }
    let c = Cluster::start();
    let _web2 = c.agent("web2", "env=staging");
    c.wait_online("local1");
    c.wait_online("web2");
    let home = c.user("alice", "access", "root");
    let cfg = c.ssh_config(&home, "alice");
    let (dir, acfg) = setup(&c, &cfg);

    let r = ansible("ansible", &acfg, &["nodes", "-m", "ping"]).ok();
    assert_eq!(r.stdout.matches("SUCCESS").count(), 2, "{r:?}");
    assert!(r.stdout.contains("\"ping\": \"pong\""), "{r:?}");

    let src = dir.join("motd");
    std::fs::write(&src, "managed by ansible through sallyport\n").unwrap();
    let dest = format!("/tmp/sallyport-ansible-{}", std::process::id());
    let r = ansible(
        "ansible",
        &acfg,
        &[
            "nodes",
            "-m",
            "copy",
            "-a",
            &format!("src={} dest={dest}/motd mode=0640", src.display()),
        ],
    );
    // The destination directory does not exist yet: copy fails on both, saying so.
    assert_ne!(r.code, 0, "{r:?}");
    let playbook = dir.join("site.yml");
    std::fs::write(
        &playbook,
        format!(
            "- hosts: nodes\n  gather_facts: false\n  tasks:\n    - name: a directory\n      ansible.builtin.file: {{path: {dest}, state: directory, mode: '0755'}}\n    - name: a file\n      ansible.builtin.copy: {{src: {src}, dest: {dest}/motd, mode: '0640'}}\n    - name: read it back\n      ansible.builtin.command: cat {dest}/motd\n      register: out\n      changed_when: false\n      failed_when: \"'through sallyport' not in out.stdout\"\n",
            src = src.display()
        ),
    )
    .unwrap();
    let r = ansible(
        "ansible-playbook",
        &acfg,
        &[&playbook.display().to_string()],
    )
    .ok();
    assert!(r.stdout.contains("local1"), "{r:?}");
    assert!(
        r.stdout.contains("failed=0") && !r.stdout.contains("unreachable=1"),
        "{r:?}"
    );
    // Run again: nothing changes (idempotent), and ad-hoc copy now succeeds unchanged.
    let r = ansible(
        "ansible-playbook",
        &acfg,
        &[&playbook.display().to_string()],
    )
    .ok();
    assert_eq!(r.stdout.matches("changed=0").count(), 2, "{r:?}");
    let r = ansible(
        "ansible",
        &acfg,
        &[
            "nodes",
            "-m",
            "copy",
            "-a",
            &format!("src={} dest={dest}/motd mode=0640", src.display()),
        ],
    )
    .ok();
    assert_eq!(r.stdout.matches("SUCCESS").count(), 2, "{r:?}");
    assert_eq!(
        std::fs::read_to_string(format!("{dest}/motd")).unwrap(),
        "managed by ansible through sallyport\n"
    );
    let _ = std::fs::remove_dir_all(&dest);
}
