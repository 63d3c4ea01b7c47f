#!/usr/bin/env python3
"""kubectl exec through Sallyport vs straight to the API server, side by side in one run (a
benchmark, not a test).

Started by bench/kube.sh, which brings up the fixture API server, a release all-in-one cluster
with a kube agent for it (cluster `lab`) and a logged-in user whose kubeconfig `sally kube login
lab` wrote. Prints median and p90 for (a) `kubectl exec -- true` set-up and (b) 32 MiB through
`kubectl exec -i -- cat` and back (checked with SHA-256 every run), each over WebSocket
(kubectl's default) and SPDY (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false), direct and through
Sallyport, the clients taking turns run after run; two more transfers over WebSocket, through
two lean plain TCP relays and through two lean TLS relays (tests/src/bin/relay.rs), what two
extra processes that only relay cost on this machine. A path the proxy refuses to serve
(SPDY, until it is served) is printed as refused, with the proxy's words, instead of measured.
"""
import hashlib, os, re, resource, statistics, subprocess, sys, time

POD = ["-n", "dev", "web-1", "-c", "main"]
# The reference paths (bench/kube.sh): two relays between kubectl and the API server, plain TCP
# or ending and starting TLS on each leg.
TCP_RELAY = "two TCP relays"
TLS_RELAY = "two TLS relays"
TICK = os.sysconf("SC_CLK_TCK")
# Seconds after which a run is taken for hung (a run takes well under one).
STALL = float(os.environ.get("STALL_SECONDS", "30"))


# The processes of the path: (name, [pid, …]) from $PIDS ("name=pid+pid,…"; several pids are
# counted together).
PROCS = [(name, [int(p) for p in pids.split("+")]) for name, pids in
         (p.split("=") for p in os.environ.get("PIDS", "").split(",") if p)]


def sockets(procs):
    """The TCP connections these processes hold (`ss -tnp`), each named by its process, with
    its receive and send queues."""
    names = {str(pid): name for name, pids in procs.items() for pid in pids}
    out = subprocess.run(["ss", "-tnpH"], capture_output=True, text=True).stdout
    lines = []
    for line in out.splitlines():
        m = re.search(r"pid=(\d+),", line)
        if m and m.group(1) in names:
            f = line.split()
            lines.append(f"{names[m.group(1)]}: {f[3]} → {f[4]} Recv-Q {f[1]} Send-Q {f[2]}")
    return sorted(lines)


def cpu_seconds(pid):
    """User and system time of a process and its reaped children (/proc/PID/stat)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(x) for x in fields[11:15]) / TICK


def kubectl_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class Client:
    def __init__(self, path, protocol, kubeconfig, env):
        self.path, self.protocol = path, protocol
        self.env = dict(os.environ, KUBECONFIG=kubeconfig, **env)
        self.kubectl = os.environ["KUBECTL"]
        self.refused = None  # the proxy's words, when it refuses this protocol
        self.stalls = []  # runs killed after STALL seconds without finishing
        self.stalled_sockets = []  # `ss` at each of them

    def name(self):
        return f"{self.protocol} {self.path}"

    def run(self, args, stdin=None, stdout=None, timeout=None):
        """Runs kubectl; returns (seconds, returncode, stderr). A run that outlives `timeout` is
        killed and returns returncode None."""
        fin = open(stdin, "rb") if stdin else subprocess.DEVNULL
        fout = open(stdout, "wb") if stdout else subprocess.DEVNULL
        t = time.perf_counter()
        p = subprocess.Popen([self.kubectl, *args], stdin=fin, stdout=fout, stderr=subprocess.PIPE, env=self.env)
        try:
            _, err = p.communicate(timeout=timeout)
            code, err = p.returncode, err.decode(errors="replace")
        except subprocess.TimeoutExpired:
            # Where the bytes stand, before the kill: each TCP connection of these processes
            # with its receive and send queues.
            self.stalled_sockets.append(sockets({"kubectl": [p.pid], **dict(PROCS)}))
            p.kill()
            _, err = p.communicate()
            code, err = None, err.decode(errors="replace")
        elapsed = time.perf_counter() - t
        for f in (fin, fout):
            if f is not subprocess.DEVNULL:
                f.close()
        return elapsed, code, err

    def must(self, args, stdin=None, stdout=None):
        """One run that must succeed. A run that hangs (STALL seconds) is killed, counted in
        self.stalls and run again, at most twice: a benchmark reports a hang, it does not wait
        on it forever, nor time it."""
        for _ in range(3):
            elapsed, code, err = self.run(args, stdin, stdout, timeout=STALL)
            if code is None:
                self.stalls.append(" ".join(args[:2] + ["…"] + args[-1:]))
                continue
            if code != 0:
                sys.exit(f"failed ({self.name()}): kubectl {' '.join(args)}: {err[-800:]}")
            return elapsed
        sys.exit(f"{self.name()}: kubectl {' '.join(args)} hung three times running (killed after {STALL} s each);"
                 " TCP queues at the last:\n  " + "\n  ".join(self.stalled_sockets[-1]))


def interleaved(clients, once, runs):
    """Samples per client, the clients taking turns (in a rotating order) run after run, so that
    a slow spell of this shared machine falls on all of them alike."""
    samples = {c.name(): [] for c in clients}
    for i in range(runs):
        for c in clients[i % len(clients):] + clients[:i % len(clients)]:
            samples[c.name()].append(once(c, i))
    return samples


def p90(v):
    return statistics.quantiles(v, n=10, method="inclusive")[8] if len(v) > 1 else v[0]


def main():
    env = os.environ
    runs = int(env.get("RUNS", "15"))
    xfer_runs = int(env.get("XFER_RUNS", max(5, runs // 2)))
    blob, work = env["BLOB"], env["WORK"]
    want = sha256(blob)
    size = os.path.getsize(blob) / (1 << 20)
    spdy = {"KUBECTL_REMOTE_COMMAND_WEBSOCKETS": "false"}
    clients = [
        Client("direct", "WebSocket", env["DIRECT_KUBECONFIG"], {}),
        Client("Sallyport", "WebSocket", env["PROXY_KUBECONFIG"], {}),
        Client("direct", "SPDY", env["DIRECT_KUBECONFIG"], spdy),
        Client("Sallyport", "SPDY", env["PROXY_KUBECONFIG"], spdy),
    ]
    # The reference paths (bench/kube.sh), over WebSocket only.
    for i, (path, var) in enumerate([(TCP_RELAY, "TCP_RELAY_KUBECONFIG"), (TLS_RELAY, "TLS_RELAY_KUBECONFIG")]):
        if env.get(var):
            clients.insert(2 + i, Client(path, "WebSocket", env[var], {}))
    # One run each first: it warms caches (the credential plugin's certificate, kubectl's own
    # files) and finds out whether the proxy serves the protocol at all.
    for c in clients:
        _, code, err = c.run(["exec", *POD, "--", "true"], timeout=STALL)
        if code == 0:
            continue
        if c.path == "Sallyport" and re.search(r"websocket|spdy|upgrade", err, re.I):
            c.refused = " ".join(err.split())[-300:]
        else:
            sys.exit(f"failed ({c.name()}): kubectl exec -- true: {err[-800:]}")
    live = [c for c in clients if not c.refused]

    # The reference paths only in the transfers: the goal for the set-up is against direct.
    setup = interleaved([c for c in live if c.path not in (TCP_RELAY, TLS_RELAY)],
                        lambda c, i: c.must(["exec", *POD, "--", "true"]), runs)

    def transfer(c, i):
        out = os.path.join(work, "out")
        t = c.must(["exec", "-i", *POD, "--", "cat"], stdin=blob, stdout=out)
        got = sha256(out)
        os.unlink(out)
        if got != want:
            sys.exit(f"{c.name()}: run {i}: the bytes back differ from the bytes sent (sha256 {got}, sent {want})")
        return t

    # CPU time each process spent on one transfer (clock ticks: ±10 ms), for where the time goes.
    procs = PROCS
    cpu = {c.name(): [] for c in live}

    def transfer_cpu(c, i):
        before = [kubectl_cpu()] + [sum(map(cpu_seconds, pids)) for _, pids in procs]
        t = transfer(c, i)
        after = [kubectl_cpu()] + [sum(map(cpu_seconds, pids)) for _, pids in procs]
        cpu[c.name()].append([b - a for a, b in zip(before, after)])
        return t

    xfer = interleaved(live, transfer_cpu, xfer_runs)

    print(f"| workload | protocol | path | median | p90 | Sallyport / direct | throughput (median) |")
    print("|---|---|---|---:|---:|---:|---:|")
    for workload, samples, n in [
        (f"`exec -- true` set-up ({runs} runs)", setup, runs),
        (f"{size:.0f} MiB through `exec -i -- cat` and back ({xfer_runs} runs)", xfer, xfer_runs),
    ]:
        bulk = samples is xfer
        for c in clients:
            if c.refused:
                print(f"| {workload} | {c.protocol} | {c.path} | refused (not yet served) | | | |")
                continue
            if c.name() not in samples or not samples[c.name()]:
                continue
            v = samples[c.name()]
            med = statistics.median(v)
            base = statistics.median(samples[f"{c.protocol} direct"])
            if c.path == "direct":
                rel = ""
            elif c.path in (TCP_RELAY, TLS_RELAY):
                rel = f"{base / med:.2f}× throughput (reference)" if bulk else f"{med / base:.2f}× time (reference)"
            elif bulk:
                rel = f"{base / med:.2f}× throughput (goal ≥ 0.8×)"
            else:
                rel = f"{med / base:.2f}× time (goal ≤ 1.15×)"
            tp = f"{size / med:.1f} MiB/s" if bulk else ""
            print(f"| {workload} | {c.protocol} | {c.path} | {med * 1000:.0f} ms | {p90(v) * 1000:.0f} ms | {rel} | {tp} |")
    for c in clients:
        if c.refused:
            print(f"\n{c.name()}: the proxy refused it: {c.refused}")
    if procs:
        names = ["kubectl"] + [n for n, _ in procs]
        print(f"\nCPU time per {size:.0f} MiB transfer (median of {xfer_runs}; clock ticks, ±10 ms):\n")
        print("| protocol | path | " + " | ".join(names) + " | total | wall |")
        print("|---|---|" + "---:|" * (len(names) + 2))
        for c in live:
            cols = [statistics.median(v) for v in zip(*cpu[c.name()])]
            print(f"| {c.protocol} | {c.path} | " + " | ".join(f"{x * 1000:.0f} ms" for x in cols)
                  + f" | {sum(cols) * 1000:.0f} ms | {statistics.median(xfer[c.name()]) * 1000:.0f} ms |")
    for c in clients:
        if c.stalls:
            print(f"\n{c.name()}: {len(c.stalls)} run(s) hung and were killed after {STALL:.0f} s, then run again"
                  f" (not in the times above): " + "; ".join(c.stalls))
            for i, lines in enumerate(c.stalled_sockets):
                print(f"  TCP queues at hang {i + 1}:")
                for line in lines:
                    print(f"    {line}")
    rec = env.get("RECORDINGS")
    if rec and os.path.isdir(rec):
        casts = [os.path.join(rec, f) for f in os.listdir(rec) if f.endswith(".cast")]
        total = sum(os.path.getsize(f) for f in casts)
        print(f"\nRecorded through Sallyport: {len(casts)} sessions, {total / (1 << 20):.0f} MiB of asciicast.")


if __name__ == "__main__":
    main()
