#!/usr/bin/env python3
"""The phases of bench/scale_ab.sh: see there."""
import os, sys, time, json, signal, sqlite3, hashlib, secrets, statistics, subprocess
E = os.environ
B, DIR = E["B"], E["DIR"]
HZ = os.sysconf("SC_CLK_TCK")
N = int(E.get("N", "10000"))
REST = int(E.get("REST_SECS", "30"))
daemon_pid = int(E["PID"])
phases = [p.split(":", 1) for p in E["PHASES"].split()]

def cpu_secs(pid):
    with open(f"/proc/{pid}/stat") as f:
        fl = f.read().rsplit(")", 1)[1].split()
    return (int(fl[11]) + int(fl[12])) / HZ

def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS:"): return int(l.split()[1]) / 1024

def online(bindir):
    r = subprocess.run([f"{bindir}/sally", "ls", "env=sim", "--format", "json"], capture_output=True, text=True)
    if r.returncode: return -1
    try: return sum(1 for n in json.loads(r.stdout) if n.get("online"))
    except Exception: return -1

def stop():
    try: os.kill(daemon_pid, signal.SIGTERM)
    except ProcessLookupError: return
    for _ in range(200):
        try:
            with open(f"/proc/{daemon_pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z": break
        except FileNotFoundError: break
        time.sleep(0.05)

def start(bindir):
    global daemon_pid
    p = subprocess.Popen([f"{bindir}/sallyport", "start", "--config", E["CONFIG"]],
                         stdout=open(f"{DIR}/out", "w"), stderr=open(f"{DIR}/err", "a"))
    daemon_pid = p.pid
    open(f"{DIR}/daemon.pid", "w").write(str(p.pid))
    return p

# tokens straight into the database (what `sallyctl tokens add` writes, minus its audit event)
tokens = [secrets.token_hex(16) for _ in range(N)]
db = sqlite3.connect(f"{DIR}/data/sallyport.db", timeout=30)
now = int(time.time())
db.executemany("INSERT INTO join_tokens (token_hash, kind, expires, created) VALUES (?, 'node', ?, ?)",
               [(hashlib.sha256(t.encode()).hexdigest(), now + 10800, now) for t in tokens])
db.commit(); db.close()
open(f"{DIR}/tokens", "w").write("\n".join(tokens) + "\n")
sim = None
print("| daemon | agents | all online after start | daemon RSS | daemon CPU at rest | sim CPU at rest | `sally ls` median / min / max (10 runs) | load before |")
print("|---|---:|---:|---:|---:|---:|---:|---:|", flush=True)
try:
    for name, bindir in phases:
        stop(); start(bindir)
        t0 = time.perf_counter()
        if sim is None:
            time.sleep(1)
            sim = subprocess.Popen([f"{B}/agent_sim", "--proxy", E["WEB"], "--ca-pin", E["PIN"], "--state", f"{DIR}/sim.jsonl",
                                    "--tokens", f"{DIR}/tokens", "--count", str(N)], stdout=open(f"{DIR}/sim.out", "w"), stderr=subprocess.STDOUT)
        while online(bindir) < N:
            if time.perf_counter() - t0 > 300: sys.exit(f"{name}: not all online")
            time.sleep(1)
        up = time.perf_counter() - t0
        time.sleep(int(E.get("SETTLE", "40")))
        load = os.getloadavg()[0]
        c0, s0, w0 = cpu_secs(daemon_pid), cpu_secs(sim.pid), time.perf_counter()
        time.sleep(REST)
        w = time.perf_counter() - w0
        cpu = (cpu_secs(daemon_pid) - c0) / w * 100
        scpu = (cpu_secs(sim.pid) - s0) / w * 100
        lat = []
        for _ in range(10):
            t = time.perf_counter()
            subprocess.run([f"{bindir}/sally", "ls"], capture_output=True, check=True)
            lat.append((time.perf_counter() - t) * 1000)
        print(f"| {name} | {N} | {up:.1f} s | {rss(daemon_pid):.0f} MiB | {cpu:.1f}% ({REST} s) | {scpu:.1f}% | "
              f"{statistics.median(lat):.0f} / {min(lat):.0f} / {max(lat):.0f} ms | {load:.2f} |", flush=True)
        if E.get("PERF") == "1":
            subprocess.run(["perf", "record", "-g", "-o", f"/tmp/scale-ab-perf-{name}.data", "-p", str(daemon_pid), "--", "sleep", "20"],
                           capture_output=True)
            print(f"perf: /tmp/scale-ab-perf-{name}.data", flush=True)
finally:
    if sim: sim.terminate(); sim.wait()
