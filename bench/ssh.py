#!/usr/bin/env python3
"""SSH through Sallyport vs direct OpenSSH, side by side in one run (a benchmark, not a test).

Started by bench/ssh.sh, which brings up a release all-in-one cluster (one local agent), a plain
OpenSSH sshd on loopback trusting the cluster's user CA, and a logged-in user. Prints medians
and ratios for (a) `echo foo` session set-up and (b) 32 MiB through `cat` and back.
"""
import os, statistics, subprocess, sys, time

def timed(cmd, stdin=None, runs=15):
    samples = []
    for _ in range(runs):
        f = open(stdin, "rb") if stdin else subprocess.DEVNULL
        t = time.perf_counter()
        r = subprocess.run(cmd, stdin=f, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        samples.append(time.perf_counter() - t)
        if stdin:
            f.close()
        if r.returncode != 0:
            sys.exit(f"failed: {' '.join(cmd)}: {r.stderr.decode()[-500:]}")
    return statistics.median(samples)

def main():
    env = os.environ
    direct = ["ssh", "-F", env["DIRECT_CFG"], "direct"]
    proxied = ["ssh", "-F", env["PROXY_CFG"], "-J", "proxy", "root@" + env["NODE"]]
    sally = [env["SALLY"], "ssh", "root@" + env["NODE"]]
    runs = int(env.get("RUNS", "15"))
    rows = []
    base = timed(direct + ["echo", "foo"], runs=runs)
    rows.append(("`echo foo` set-up", "direct OpenSSH", base, 1.0))
    for name, cmd in [("sally ssh", sally), ("OpenSSH -J proxy", proxied)]:
        t = timed(cmd + ["echo", "foo"], runs=runs)
        rows.append(("`echo foo` set-up", name, t, t / base))
    blob = env["BLOB"]
    size = os.path.getsize(blob) / (1 << 20)
    tp_runs = max(3, runs // 3)
    base_t = timed(direct + ["cat"], stdin=blob, runs=tp_runs)
    rows.append((f"{size:.0f} MiB through cat and back", "direct OpenSSH", base_t, 1.0))
    for name, cmd in [("sally ssh", sally), ("OpenSSH -J proxy", proxied)]:
        t = timed(cmd + ["cat"], stdin=blob, runs=tp_runs)
        rows.append((f"{size:.0f} MiB through cat and back", name, t, t / base_t))
    print("| workload | client | median | vs direct | throughput |")
    print("|---|---|---:|---:|---:|")
    for w, name, t, ratio in rows:
        tp = f"{size / t:.0f} MiB/s" if "MiB" in w else ""
        rel = f"{ratio:.2f}× time" if "set-up" in w else f"{1 / ratio:.2f}× throughput"
        print(f"| {w} | {name} | {t * 1000:.0f} ms | {rel} | {tp} |")

if __name__ == "__main__":
    main()
