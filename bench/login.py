#!/usr/bin/env python3
"""Login throughput and latency against a running Sallyport proxy (a benchmark, not a test).

Creates N users through sallyctl, signs them up, then runs concurrent logins through the proxy's
web API (the same HTTPS request `sally login` sends: password check with argon2id, role
evaluation, SSH + X.509 issuance, audit write) and prints logins/s with p50/p99 latency.
Usage: bench/login.py PROXY DATA_DIR [--users 8] [--logins 200] [--concurrency 1,2,4,8]
"""
import argparse, concurrent.futures, http.client, json, os, ssl, statistics, subprocess, sys, tempfile, time

def call(proxy, path, body):
    host, port = proxy.rsplit(":", 1)
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # a benchmark on loopback; the tests check trust
    c = http.client.HTTPSConnection(host, int(port), context=ctx, timeout=30)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if r.status != 200:
        raise RuntimeError(f"{path}: {r.status} {data[:200]!r}")
    return json.loads(data)

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("proxy")
    ap.add_argument("data_dir")
    ap.add_argument("--bin", default="target/release")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--logins", type=int, default=200)
    ap.add_argument("--concurrency", default="1,2,4,8")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp()
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", f"{tmp}/k"], check=True)
    pub = open(f"{tmp}/k.pub").read().strip()
    users = []
    for i in range(a.users):
        name = f"bench{os.getpid()}-{i}"
        out = subprocess.run([f"{a.bin}/sallyctl", "--data-dir", a.data_dir, "users", "add", name,
                              "--roles", "access", "--logins", "root", "--format", "json"],
                             check=True, capture_output=True, text=True).stdout
        token = json.loads(out)["token"]
        call(a.proxy, "/v1/webapi/signup/start", {"token": token})
        call(a.proxy, "/v1/webapi/signup/finish", {"token": token, "password": "benchmark-pw", "otp_code": None})
        users.append(name)

    def one(i):
        t = time.perf_counter()
        call(a.proxy, "/v1/webapi/login", {"user": users[i % len(users)], "password": "benchmark-pw",
                                             "otp_code": None, "ssh_public_key": pub, "ttl_secs": 3600})
        return time.perf_counter() - t

    print(f"| concurrency | logins | logins/s | p50 ms | p99 ms |")
    print(f"|---:|---:|---:|---:|---:|")
    for conc in [int(x) for x in a.concurrency.split(",")]:
        start = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(conc) as ex:
            lat = sorted(ex.map(one, range(a.logins)))
        wall = time.perf_counter() - start
        p = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000
        print(f"| {conc} | {a.logins} | {a.logins / wall:.1f} | {p(0.5):.1f} | {p(0.99):.1f} |")

if __name__ == "__main__":
    sys.exit(main())
