#!/usr/bin/env python3
"""File copy and Ansible through Sallyport vs direct OpenSSH, side by side in one run.

Started by bench/tools.sh (see bench/setup.sh for the cluster and the plain sshd). Prints
medians and ratios for (a) `scp` of a 256 MiB file to the node, and (b) a playbook of 50
`command` module runs with `pipelining = True` and ControlPersist — the shape of Ansible's own
SSH connection benchmark: many small module runs over one multiplexed connection. The clients
take turns run after run.
"""
import os, statistics, subprocess, sys, time

def run_once(cmd, env=None):
    t = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    elapsed = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}: {r.stderr.decode()[-800:]}")
    return elapsed

def interleaved(clients, runs):
    """Median per client, the clients taking turns (in a rotating order) run after run, so that
    a slow spell of this shared machine falls on all of them alike. `clients`: (name, cmd, env)."""
    samples = {name: [] for name, _, _ in clients}
    for i in range(runs):
        for name, cmd, env in clients[i % len(clients):] + clients[:i % len(clients)]:
            samples[name].append(run_once(cmd, env))
    return {name: statistics.median(v) for name, v in samples.items()}

def ansible_setup(work, name, host, common_args):
    d = os.path.join(work, "ansible-" + name)
    os.makedirs(os.path.join(d, "cp"), exist_ok=True)
    with open(os.path.join(d, "hosts.ini"), "w") as f:
        f.write(f"[target]\n{host}\n\n[target:vars]\nansible_user=root\n"
                f"ansible_python_interpreter=/usr/bin/python3\nansible_ssh_common_args={common_args}\n")
    with open(os.path.join(d, "ansible.cfg"), "w") as f:
        f.write(f"[defaults]\ninventory = {d}/hosts.ini\nhost_key_checking = False\n"
                f"local_tmp = {d}/tmp\n\n"
                f"[ssh_connection]\npipelining = True\n"
                f"ssh_args = -o ControlMaster=auto -o ControlPersist=60s\ncontrol_path_dir = {d}/cp\n")
    with open(os.path.join(d, "play.yml"), "w") as f:
        f.write("- hosts: target\n  gather_facts: false\n  tasks:\n")
        for i in range(50):
            f.write(f"    - ansible.builtin.command: /bin/true\n      changed_when: false\n")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(d, "ansible.cfg"))
    return ["ansible-playbook", os.path.join(d, "play.yml")], env

def main():
    env = os.environ
    work, blob, node = env["WORK"], env["BLOB"], env["NODE"]
    runs = int(env.get("RUNS", "3"))
    size = os.path.getsize(blob) / (1 << 20)
    rows = []
    scp = [
        ("direct OpenSSH", ["scp", "-q", "-F", env["DIRECT_CFG"], blob, "direct:/tmp/sallyport-bench-direct"]),
        ("OpenSSH scp -J proxy", ["scp", "-q", "-F", env["PROXY_CFG"], "-o", "ProxyJump=proxy", blob,
                                  f"root@{node}:/tmp/sallyport-bench-proxy"]),
        ("OpenSSH scp -J proxy, AES-GCM (`sally config`)",
         ["scp", "-q", "-F", env["PROXY_AES_CFG"], "-o", "ProxyJump=proxy", blob,
          f"root@{node}:/tmp/sallyport-bench-proxy-aes"]),
        ("sally scp", [env["SALLY"], "scp", "-q", blob, f"root@{node}:/tmp/sallyport-bench-sally"]),
    ]
    medians = interleaved([(name, cmd, None) for name, cmd in scp], max(runs, 5))
    base = medians["direct OpenSSH"]
    for name, _ in scp:
        t = medians[name]
        rows.append((f"scp {size:.0f} MiB", name, t, t / base, f"{size / t:.0f} MiB/s"))
    for p in ["direct", "proxy", "proxy-aes", "sally"]:
        try:
            os.remove(f"/tmp/sallyport-bench-{p}")
        except OSError:
            pass
    plays = [
        ("direct OpenSSH", ansible_setup(work, "direct", "direct", f"-F {env['DIRECT_CFG']}")),
        ("OpenSSH -J proxy", ansible_setup(work, "proxy", node,
                                           f"-F {env['PROXY_CFG']} -o ProxyJump=proxy")),
    ]
    # One warm-up run each: Ansible's own start-up (Python imports) is not what is measured.
    for _, (cmd, aenv) in plays:
        run_once(cmd, aenv)
    medians = interleaved([(name, cmd, aenv) for name, (cmd, aenv) in plays], runs)
    base = medians["direct OpenSSH"]
    for name, _ in plays:
        t = medians[name]
        rows.append(("Ansible: 50 module runs, pipelining + ControlPersist", name, t, t / base,
                      f"{50 / t:.1f} tasks/s"))
    print("| workload | client | median | vs direct | rate |")
    print("|---|---|---:|---:|---:|")
    for w, name, t, ratio, rate in rows:
        print(f"| {w} | {name} | {t * 1000:.0f} ms | {1 / ratio:.2f}× speed | {rate} |")

if __name__ == "__main__":
    main()
