#!/usr/bin/env python3
"""Scale of the all-in-one (a benchmark, not a test); started by bench/scale.sh, which brings up
a release cluster (bench/setup.sh), a logged-in user and a plain sshd.

(a) `sally bench ssh` at rising rates (each session a new connection through the proxy, recording
    on), with the daemon's and the client's CPU per session; then OpenSSH's sessions/s from a
    parallel xargs loop of `ssh` processes (closed loop, process start included: labelled so).
(b) idle tunnels: agent_sim holds N agents' tunnels; the daemon's RSS and CPU at rest, `sally ls`
    over N nodes, and the time until all N are online again after the daemon restarts.
"""
import json, os, resource, signal, statistics, subprocess, sys, time

E = os.environ
B, DIR = E["B"], E["DIR"]
HZ = os.sysconf("SC_CLK_TCK")
daemon_pid = int(E["PID"])


def load():
    return os.getloadavg()[0]


def cpu_secs(pid):
    """utime + stime of a process, in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / HZ


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def sally(*args, check=True):
    r = subprocess.run([f"{B}/sally", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        sys.exit(f"sally {' '.join(args)} failed: {r.stderr[-500:]}")
    return r


def ms(v):
    return "-" if v is None else f"{v:.1f} ms"


def settle(limit=60):
    """Waits (up to `limit` s) until the daemon is idle (< 10% of a core over a second): an
    overloaded step leaves sessions the client gave up on still running in the daemon."""
    for _ in range(limit):
        if sample_cpu(daemon_pid, 1) < 10:
            return
    print(f"(the daemon was still busy {limit} s after the step)")


# ---------------------------------------------------------------------------------------------
def bench_ssh():
    rates = [int(r) for r in E.get("RATES", "10 25 50 75 100 150 200 300 500").split()]
    duration = E.get("DURATION", "10s")
    target = f"{E['LOGIN']}@{E['NODE']}"
    print(f"\n(a) `sally bench ssh --rate R --duration {duration} --concurrency 2000 {target} 'echo foo'`"
          " — each session a new connection to the proxy (TCP, key exchange, certificate), a channel"
          " to the node, the inner connection, the command, its exit status; recording on."
          " Latency from each session's scheduled start (open loop).\n")
    print("| rate asked | achieved | ok | errors | skipped | p50 | p90 | p99 | max | daemon CPU / session | client CPU / session | load before |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    best = None
    errors_seen = []
    for rate in rates:
        before_load = load()
        d0 = cpu_secs(daemon_pid)
        c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        r = sally("bench", "ssh", "--rate", str(rate), "--duration", duration, "--concurrency", "2000",
                  "--format", "json", target, "echo foo")
        c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        d1 = cpu_secs(daemon_pid)
        j = json.loads(r.stdout)
        n = max(j["ok"] + j["errors"], 1)
        daemon_ms = (d1 - d0) * 1000 / n
        client_ms = ((c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime)) * 1000 / n
        lat = j["latency_ms"]
        print(f"| {rate}/s | {j['sessions_per_sec']:.1f}/s | {j['ok']} | {j['errors']} | {j['skipped']} | {ms(lat['p50'])} | "
              f"{ms(lat['p90'])} | {ms(lat['p99'])} | {ms(lat['max'])} | {daemon_ms:.2f} ms | {client_ms:.2f} ms | {before_load:.2f} |",
              flush=True)
        errors_seen += [m["message"] for m in j["error_messages"]]
        sustained = (j["errors"] == 0 and j["skipped"] == 0 and lat["p99"] is not None and lat["p99"] < 100
                     and j["sessions_per_sec"] >= 0.95 * rate)
        if sustained:
            best = rate
        if lat["p99"] is None or lat["p99"] > 2000:
            break
        settle()
    for m in dict.fromkeys(errors_seen):
        print(f"\nerror seen: {m}")
    print(f"\nHighest rate sustained (no error or skip, achieved ≥ 95% of asked, p99 < 100 ms): "
          f"{best or 'none'}{'/s' if best else ''} — goal ≥ 500/s: {'met' if best and best >= 500 else 'missed'}.")

    # OpenSSH, closed loop: N ssh processes, P at a time.
    n, p = int(E.get("XARGS_N", "300")), int(E.get("XARGS_P", "16"))
    print(f"\nOpenSSH's own sessions/s: `seq {n} | xargs -P {p}` of `ssh ... 'echo foo'` (a closed loop of"
          " processes: each pays its process start and config parsing; not an open-loop rate)\n")
    print("| client | sessions | parallel | wall time | sessions/s | load before |")
    print("|---|---:|---:|---:|---:|---:|")
    loops = [
        ("direct OpenSSH to plain sshd", f"ssh -F {E['DIRECT_CFG']} direct 'echo foo'"),
        ("OpenSSH -J through Sallyport", f"ssh -F {E['PROXY_CFG']} -J proxy {target} 'echo foo'"),
        ("`sally ssh` processes", f"{B}/sally ssh {target} 'echo foo'"),
    ]
    for name, cmd in loops:
        before_load = load()
        t = time.perf_counter()
        r = subprocess.run(f"seq {n} | xargs -P {p} -I{{}} sh -c \"{cmd} > /dev/null\"", shell=True,
                           capture_output=True, text=True)
        wall = time.perf_counter() - t
        ok = "" if r.returncode == 0 else f" (some failed: {r.stderr.strip()[-200:]})"
        print(f"| {name} | {n} | {p} | {wall:.2f} s | {n / wall:.0f}/s{ok} | {before_load:.2f} |", flush=True)
        settle()


# ---------------------------------------------------------------------------------------------
def online_sims():
    r = sally("ls", "env=sim", "--format", "json", check=False)
    if r.returncode != 0:
        return -1
    try:
        return sum(1 for n in json.loads(r.stdout) if n.get("online"))
    except json.JSONDecodeError:
        return -1


def wait_online(n, timeout):
    t = time.perf_counter()
    seen = -1
    while time.perf_counter() - t < timeout:
        seen = online_sims()
        if seen >= n:
            return time.perf_counter() - t, seen
        time.sleep(0.5)
    return None, seen


def start_daemon():
    global daemon_pid
    out = open(f"{DIR}/out", "w")
    err = open(f"{DIR}/err", "a")
    p = subprocess.Popen([f"{B}/sallyport", "start", "--config", E["CONFIG"]], stdout=out, stderr=err)
    daemon_pid = p.pid
    with open(f"{DIR}/daemon.pid", "w") as f:
        f.write(str(p.pid))
    return p


def restart_daemon(proc):
    """SIGTERM the daemon, wait for it, start it again; returns the new process and when it
    was started."""
    os.kill(daemon_pid, signal.SIGTERM)
    for _ in range(200):
        try:
            if proc is not None:
                if proc.poll() is not None:
                    break
            else:
                os.kill(daemon_pid, 0)
                # A child of bash, not of us: gone when /proc says so (or a zombie).
                with open(f"/proc/{daemon_pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
        except (ProcessLookupError, FileNotFoundError):
            break
        time.sleep(0.05)
    else:
        os.kill(daemon_pid, signal.SIGKILL)
    t = time.perf_counter()
    return start_daemon(), t


def sample_cpu(pid, secs):
    c0, t0 = cpu_secs(pid), time.perf_counter()
    time.sleep(secs)
    return (cpu_secs(pid) - c0) / (time.perf_counter() - t0) * 100


def idle_tunnels():
    ns = [int(n) for n in E.get("NS", "1000 2000 5000 10000").split()]
    rest = int(E.get("REST_SECS", "30"))
    need = max(ns)
    tokens = f"{DIR}/tokens"
    t = time.perf_counter()
    # One-time tokens, one per agent (`sallyctl tokens add` makes one a call).
    subprocess.run(
        f"seq {need} | xargs -P 4 -I{{}} {B}/sallyctl --data-dir {DIR}/data tokens add --type node --ttl 3h --format json"
        f" | python3 -c 'import json,sys; [print(json.loads(l)[\"token\"]) for l in sys.stdin]' > {tokens}",
        shell=True, check=True)
    print(f"\n(b) idle tunnels: set-up, {need} one-time join tokens through `sallyctl tokens add` (4 at a time):"
          f" {time.perf_counter() - t:.1f} s")
    print("\n| agents | join (new ones) | all online after sim start | daemon RSS | daemon CPU at rest | sim CPU at rest | `sally ls` median / max (10 runs, text) | restart: all online again | daemon RSS after | load before |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    proc = None
    base_rss = rss_mib(daemon_pid)
    base_cpu = sample_cpu(daemon_pid, 10)
    print(f"| 0 (node1 only) | | | {base_rss:.0f} MiB | {base_cpu:.1f}% (10 s) | | | | | {load():.2f} |", flush=True)
    for n in ns:
        before_load = load()
        log = open(f"{DIR}/sim.out", "w")
        sim = subprocess.Popen([f"{B}/agent_sim", "--proxy", E["WEB"], "--ca-pin", E["PIN"], "--state", f"{DIR}/sim.jsonl",
                                "--tokens", tokens, "--count", str(n)], stdout=log, stderr=subprocess.STDOUT)
        try:
            join = "-"
            while True:
                with open(f"{DIR}/sim.out") as f:
                    text = f.read()
                if "holding" in text:
                    break
                if sim.poll() is not None:
                    sys.exit(f"agent_sim ended: {text[-1000:]}")
                time.sleep(0.2)
            for line in text.splitlines():
                if line.startswith("joined"):
                    join = line.removeprefix("joined ")
            up, seen = wait_online(n, 120)
            if up is None:
                print(f"| {n} | {join} | only {seen} online after 120 s | | | | | | | {before_load:.2f} |", flush=True)
                continue
            time.sleep(12)  # a heartbeat round for all
            rss = rss_mib(daemon_pid)
            c0 = cpu_secs(sim.pid)
            cpu = sample_cpu(daemon_pid, rest)
            sim_cpu = (cpu_secs(sim.pid) - c0) / rest * 100
            lat = []
            for _ in range(10):
                t = time.perf_counter()
                sally("ls")
                lat.append((time.perf_counter() - t) * 1000)
            proc, t_start = restart_daemon(proc)
            back, seen = wait_online(n, 120)
            back_s = f"{time.perf_counter() - t_start:.1f} s" if back is not None else f"only {seen} after 120 s"
            rss_after = rss_mib(daemon_pid)
            print(f"| {n} | {join} | {up:.1f} s | {rss:.0f} MiB | {cpu:.1f}% ({rest} s) | {sim_cpu:.1f}% | "
                  f"{statistics.median(lat):.0f} / {max(lat):.0f} ms | {back_s} | {rss_after:.0f} MiB | {before_load:.2f} |", flush=True)
        finally:
            sim.terminate()
            sim.wait()
        time.sleep(3)


def main():
    if E.get("SKIP_SSH") != "1":
        bench_ssh()
    if E.get("SKIP_IDLE") != "1":
        idle_tunnels()


if __name__ == "__main__":
    main()
