#!/usr/bin/env python3
"""SSH through Sallyport vs direct OpenSSH, side by side in one run (a benchmark, not a test).

Started by bench/ssh.sh, which brings up a release all-in-one cluster (one local agent), a plain
OpenSSH sshd on loopback trusting the cluster's user CA, and a logged-in user. Prints medians
and ratios for (a) `echo foo` session set-up, (b) a login session's set-up with a pty (`-tt
true`: the groups, utmp/wtmp/lastlog, motd, and PAM under PAM=1) and (c) 32 MiB through `cat`
and back, the clients taking turns run after run.
"""
import os, statistics, subprocess, sys, time

def run_once(cmd, stdin):
    f = open(stdin, "rb") if stdin else subprocess.DEVNULL
    t = time.perf_counter()
    r = subprocess.run(cmd, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - t
    if stdin:
        f.close()
    if r.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}: {r.stderr.decode()[-500:]}")
    return elapsed

def interleaved(clients, stdin=None, runs=15):
    """Median per client, the clients taking turns (in a rotating order) run after run, so that
    a slow spell of this shared machine falls on all of them alike."""
    samples = {name: [] for name, _ in clients}
    for i in range(runs):
        turn = clients[i % len(clients):] + clients[:i % len(clients)]
        for name, cmd in turn:
            samples[name].append(run_once(cmd, stdin))
    return {name: statistics.median(v) for name, v in samples.items()}

def main():
    env = os.environ
    direct = ["ssh", "-F", env["DIRECT_CFG"], "direct"]
    proxied = ["ssh", "-F", env["PROXY_CFG"], "-J", "proxy", env.get("LOGIN", "root") + "@" + env["NODE"]]
    proxied_aes = ["ssh", "-F", env["PROXY_AES_CFG"], "-J", "proxy", env.get("LOGIN", "root") + "@" + env["NODE"]]
    sally = [env["SALLY"], "ssh", env.get("LOGIN", "root") + "@" + env["NODE"]]
    runs = int(env.get("RUNS", "15"))
    clients = [
        ("direct OpenSSH", direct),
        ("sally ssh", sally),
        ("OpenSSH -J proxy", proxied),
        ("OpenSSH -J proxy, AES-GCM (`sally config`)", proxied_aes),
    ]
    blob = env["BLOB"]
    size = os.path.getsize(blob) / (1 << 20)
    rows = []
    def with_pty(name, cmd):
        # A terminal although stdin is not one: OpenSSH wants -tt before the host, sally -t.
        if name == "sally ssh":
            return cmd[:2] + ["-t"] + cmd[2:]
        return cmd[:-1] + ["-tt"] + cmd[-1:]
    plain = lambda name, cmd: cmd
    for workload, opts, args, stdin, n in [
        ("`echo foo` set-up", plain, ["echo", "foo"], None, runs),
        ("pty login set-up (`-tt true`)", with_pty, ["true"], None, runs),
        (f"{size:.0f} MiB through cat and back", plain, ["cat"], blob, max(5, runs // 2)),
    ]:
        medians = interleaved([(name, opts(name, cmd) + args) for name, cmd in clients], stdin, n)
        base = medians["direct OpenSSH"]
        for name, _ in clients:
            rows.append((workload, name, medians[name], medians[name] / base))
    print("| workload | client | median | vs direct | throughput |")
    print("|---|---|---:|---:|---:|")
    for w, name, t, ratio in rows:
        tp = f"{size / t:.0f} MiB/s" if "MiB" in w else ""
        rel = f"{ratio:.2f}× time" if "set-up" in w else f"{1 / ratio:.2f}× throughput"
        print(f"| {w} | {name} | {t * 1000:.0f} ms | {rel} | {tp} |")

if __name__ == "__main__":
    main()
