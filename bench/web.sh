#!/usr/bin/env bash
# The web UI (bench/web.py): keystroke echo in the browser terminal (Chromium, timed in the page
# from keydown to the echo parsed by xterm.js; keys at a typist's pace, then at once) against
# `sally ssh` in a pty (from the write to the echo read), 500 keys each on the same node; and
# the pages' weight on the wire with a cold cache and their DOMContentLoaded. KEYS=N changes the
# count. Needs Debian's chromium and tests/web's playwright-core (installed here by npm ci when
# missing).
DIRECT_SSHD=0 source "$(dirname "$0")/setup.sh"
CHROMIUM=${CHROMIUM:-/usr/lib/chromium/chromium}
[ -d tests/web/node_modules/playwright-core ] || (cd tests/web && npm ci --no-audit --no-fund > /dev/null)
echo "Sallyport web benchmark — $(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m), $($CHROMIUM --version 2>/dev/null | head -1), login $login"
SALLYPORT_URL=https://127.0.0.1:$web SALLYPORT_CA_PIN=$pin SCREENSHOTS=$dir/shots CHROMIUM=$CHROMIUM \
  BENCH_USER=bench BENCH_PASSWORD=benchmark-password BENCH_NODE=node1 BENCH_LOGIN=$login \
  BENCH_KEYS=${KEYS:-500} node tests/web/driver.mjs bench > "$dir/browser.out" 2> "$dir/browser.err" \
  || { cat "$dir/browser.out" "$dir/browser.err" >&2; exit 1; }
sed -n 's/^bench: //p' "$dir/browser.out" > "$dir/browser.json"
BROWSER_JSON=$dir/browser.json SALLY=$B/sally NODE=node1 LOGIN=$login KEYS=${KEYS:-500} python3 bench/web.py
