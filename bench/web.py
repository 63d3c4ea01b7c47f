#!/usr/bin/env python3
"""Keystroke echo, browser vs `sally ssh`, and the pages' weight (a benchmark, not a test).

Started by bench/web.sh, which brings up the release cluster (bench/setup.sh) and has already
run the browser's half in Chromium (tests/web/driver.mjs bench: keydown to the echo parsed by
xterm.js, timed in the page; cold-cache page weights and DOMContentLoaded), whose JSON is in
BROWSER_JSON. This half times `sally ssh LOGIN@NODE` in a pseudo-terminal the same way: the node
runs `cat > /dev/null` with `stty -icanon`, so the echo is the node's pty's own; one key is
written, the time taken until its echo is read, then the next. The first 20 keys are not
counted (as in the browser). Prints the markdown tables.
"""
import json, os, pty, select, subprocess, sys, termios, time

WARMUP = 20


def read_until(fd, needle, timeout=10.0):
    buf = b""
    deadline = time.monotonic() + timeout
    while needle not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            sys.exit(f"sally ssh: never saw {needle!r}; last output: {buf[-300:]!r}")
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                sys.exit(f"sally ssh ended; last output: {buf[-300:]!r}")
            if not chunk:
                sys.exit(f"sally ssh ended; last output: {buf[-300:]!r}")
            buf += chunk
    return buf


def sally_echo(sally, target, keys):
    master, slave = pty.openpty()
    proc = subprocess.Popen([sally, "ssh", target], stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, close_fds=True)
    os.close(slave)
    try:
        os.write(master, b"echo up$((1+1))\r")
        read_until(master, b"up2")
        # sally has put its terminal in raw mode: the echo timed is the node's, not this pty's.
        if termios.tcgetattr(master)[3] & termios.ECHO:
            sys.exit("sally ssh left the local terminal echoing: the timing would be of a local echo")
        os.write(master, b"stty -icanon; cat > /dev/null\r")
        time.sleep(0.5)
        while select.select([master], [], [], 0.1)[0]:
            os.read(master, 4096)
        letters = b"abcdefghijklmnopqrstuvwxyz"
        ms = []
        for i in range(WARMUP + keys):
            ch = letters[i % len(letters):][:1]
            t0 = time.perf_counter()
            os.write(master, ch)
            read_until(master, ch)
            ms.append((time.perf_counter() - t0) * 1000)
        return ms[WARMUP:]
    finally:
        proc.kill()
        proc.wait()
        os.close(master)


def pct(v, p):
    """Nearest rank."""
    s = sorted(v)
    return s[max(0, min(len(s) - 1, -(-p * len(s) // 100) - 1))]


def main():
    env = os.environ
    keys = int(env.get("KEYS", "500"))
    with open(env["BROWSER_JSON"]) as f:
        browser = json.load(f)
    web = browser["echoMs"]
    ssh = sally_echo(env["SALLY"], f"{env.get('LOGIN', 'root')}@{env['NODE']}", keys)
    print(f"\nKeystroke echo, {keys} keys each (after {WARMUP} not counted), node {env['NODE']}:\n")
    print("| client | keys | p50 | p95 | p99 | max |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [("browser (Chromium, xterm.js, WebSocket), keys at a typist's pace", web)]
    if browser.get("echoAtOnceMs"):
        rows.append(("browser, each key as soon as the last echo is parsed (before it is drawn)",
                     browser["echoAtOnceMs"]))
    rows.append(("`sally ssh` in a pty", ssh))
    if browser.get("wsEchoMs"):
        rows.append(("the same WebSocket from Node, no browser (send → echo)", browser["wsEchoMs"]))
    for name, v in rows:
        print(f"| {name} | {len(v)} | {pct(v, 50):.2f} ms | {pct(v, 95):.2f} ms | {pct(v, 99):.2f} ms | {max(v):.2f} ms |")
    names = ["keydown → WebSocket send", "send → the echo's message event in the page",
             "event → Terminal.write", "xterm.js parse"]
    for pace, key in [("at a typist's pace", "echoPartsMs"), ("with each key at once", "echoAtOncePartsMs")]:
        parts = browser.get(key) or []
        if parts:
            said = "; ".join(f"{n} {pct([x[i] for x in parts], 50):.2f} / {pct([x[i] for x in parts], 99):.2f} ms"
                             for i, n in enumerate(names))
            print(f"\nBrowser {pace}, where the time goes (p50 / p99): {said}.")
    if "animations" in browser:
        running = browser["animations"]
        print(f"\nAnimations running on the idle terminal page: {', '.join(running) if running else 'none'}.")
    gap = pct(web, 50) - pct(ssh, 50)
    print(f"\nGoal: web p50 within 5 ms of `sally ssh`: {'met' if gap <= 5 else 'missed'} "
          f"({gap:+.2f} ms). Goal: web p99 < 30 ms: {'met' if pct(web, 99) < 30 else 'missed'} "
          f"({pct(web, 99):.2f} ms).")
    print("\nPages, cold cache (a fresh browser context), bytes on the wire (headers and encoded bodies):\n")
    print("| page | bytes | budget | DOMContentLoaded | budget |")
    print("|---|---:|---:|---:|---:|")
    for name, budget in [("login", 60), ("terminal", 250)]:
        r = browser[name]
        print(f"| {name} | {r['bytes']:,} ({r['bytes'] / 1024:.1f} KiB) | {budget} KiB "
              f"({'met' if r['bytes'] <= budget * 1024 else 'missed'}) | {r['domContentLoadedMs']} ms | 500 ms "
              f"({'met' if r['domContentLoadedMs'] < 500 else 'missed'}) |")
    print("| player | measured and held to its budget by tests/web (it needs a recording) | 200 KiB + cast | | 500 ms |")


if __name__ == "__main__":
    main()
