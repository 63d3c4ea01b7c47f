#!/usr/bin/env bash
# kubectl exec through Sallyport vs straight to the API server, side by side, in one run:
# `kubectl exec -- true` set-up and 32 MiB through `kubectl exec -i -- cat` and back, over
# WebSocket (kubectl's default) and SPDY (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false) (bench/kube.py).
# The API server is the fixture of tests/kube/apiserver.py (the real wire protocol, commands run
# as local processes; needs aiohttp==3.11.18 and openssl); kubectl is 1.32 ($KUBECTL to change).
# Through Sallyport: an all-in-one daemon (recording on, as by default), a kube agent for cluster
# `lab` in its own process (`sallyport start --roles=kube`, as the tests run it), a user whose
# role allows exec in namespace dev, `sally login` and `sally kube login lab`. Two reference
# rows: two lean plain TCP relays, two lean TLS relays (tests/src/bin/relay.rs).
# RUNS=15 (set-up runs; the transfers run max(5, RUNS/2) times), XFER_RUNS, STALL_SECONDS=30 (a run
# longer than that is killed, reported and run again), SALLYPORT_LOG=debug for timings (the
# daemon's, the agent's and the fixture's stderr are copied to $KEEP_LOGS if set). Builds into
# $CARGO_TARGET_DIR if set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --bins -q
B=${CARGO_TARGET_DIR:-$PWD/target}/release
KUBECTL=${KUBECTL:-/usr/lib/google-cloud-sdk/bin/kubectl.1.32}
dir=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
auth=$(port); web=$(port); sshp=$(port); tun=$(port); kube=$(port)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${KEEP_LOGS:-}" ]; then mkdir -p "$KEEP_LOGS"; cp "$dir"/*.err "$KEEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

# The fixture API server: prints {"port": N} once it listens and has written its kubeconfigs
# (`kubeconfig`: a client certificate in system:masters, what the kube agent uses too).
python3 tests/kube/apiserver.py --dir "$dir/apiserver" --port 0 > "$dir/apiserver.out" 2> "$dir/apiserver.err" &
pids+=($!); api_pid=$!
for _ in $(seq 1 100); do grep -q '"port"' "$dir/apiserver.out" && break; sleep 0.1; done
grep -q '"port"' "$dir/apiserver.out" || { echo "the fixture API server did not start:" >&2; cat "$dir/apiserver.err" >&2; exit 1; }

cat > "$dir/sallyport.yaml" <<CFG
version: v1
sallyport: {data_dir: $dir/data, nodename: proxy1, log: {severity: warn}}
auth_service: {listen_addr: 127.0.0.1:$auth, cluster_name: bench, authentication: {second_factor: off}}
proxy_service: {web_listen_addr: 127.0.0.1:$web, ssh_listen_addr: 127.0.0.1:$sshp, tunnel_listen_addr: 127.0.0.1:$tun, kube_listen_addr: 127.0.0.1:$kube}
ssh_service: {enabled: false}
CFG
$B/sallyport start --config "$dir/sallyport.yaml" > "$dir/out" 2> "$dir/sallyport.err" &
pids+=($!); daemon_pid=$!
for _ in $(seq 1 100); do grep -q "CA pin" "$dir/out" && break; sleep 0.1; done
pin=$(awk '/CA pin/ {print $3}' "$dir/out")
[ -n "$pin" ] || { cat "$dir/sallyport.err" >&2; exit 1; }
ctl() { $B/sallyctl --data-dir "$dir/data" "$@"; }

cat > "$dir/role.yaml" <<ROLE
kind: role
version: v1
metadata: {name: kube-bench}
spec:
  allow:
    kubernetes_labels: {env: dev}
    kubernetes_groups: [developers]
    kubernetes_resources:
      - {kind: pod, namespace: dev, name: '*', verbs: [get, list, watch, exec]}
ROLE
ctl create "$dir/role.yaml" > /dev/null
ktoken=$(ctl tokens add --type=kube --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
$B/sallyport start --roles=kube --proxy 127.0.0.1:$web --token "$ktoken" --ca-pin "$pin" \
  --kube-cluster lab --labels env=dev --kubeconfig "$dir/apiserver/kubeconfig" \
  --data-dir "$dir/kube-agent" > /dev/null 2> "$dir/kube-agent.err" &
pids+=($!); agent_pid=$!
for _ in $(seq 1 150); do
  ctl get kube_clusters --format json 2>/dev/null | python3 -c 'import json,sys; sys.exit(0 if any(c["name"] == "lab" and c["online"] for c in json.load(sys.stdin)) else 1)' && break
  sleep 0.2
done

# The user, logged in, and kubectl pointed at `lab` through the proxy in its own kubeconfig.
export HOME=$dir/home SALLY_HOME=$dir/home
mkdir -p "$HOME"
token=$(ctl users add bench --roles kube-bench --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
printf 'benchmark-password\n' | $B/sally signup --proxy 127.0.0.1:$web --token "$token" --ca-pin "$pin" > /dev/null 2>&1
printf 'benchmark-password\n' | $B/sally login --proxy 127.0.0.1:$web --user bench --ca-pin "$pin" > /dev/null
KUBECONFIG=$dir/proxy-kubeconfig $B/sally kube login lab > /dev/null

# Two reference paths, each through two relays in their own processes (as the proxy and the
# agent are two) that copy both directions at once (tests/src/bin/relay.rs: tokio, 256 KiB
# buffers): plain TCP relays, which copy bytes and do nothing else (kubectl's TLS goes through
# to the API server), and TLS relays (rustls, aws-lc, as the proxy), which end TLS and start it
# again on each leg, as the proxy and the agent do, and nothing more (no tunnel, no HTTP, no
# recording). What they cost is what two lean relays cost on this machine.
tcp_kubeconfig= tls_kubeconfig= relay_pids=
api_port=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["port"])' "$dir/apiserver.out")
a=$dir/apiserver
hop1=$(port); hop2=$(port); tls1=$(port); tls2=$(port)
$B/relay tcp $hop1 $api_port 2> "$dir/relay1.err" &
pids+=($!); tcp_pids=$!
$B/relay tcp $hop2 $hop1 2> "$dir/relay2.err" &
pids+=($!); tcp_pids+="+$!"
sed "s|127.0.0.1:$api_port|127.0.0.1:$hop2|" "$a/kubeconfig" > "$dir/tcp-kubeconfig"
# The TLS relays' certificate, from the fixture's CA (which kubectl and the relays trust).
openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=relay \
  -keyout "$dir/relay.key" -out "$dir/relay.csr" 2> "$dir/relay-cert.err" ||
  { echo "no certificate for the TLS relays:" >&2; cat "$dir/relay-cert.err" >&2; exit 1; }
printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$dir/relay.ext"
openssl x509 -req -in "$dir/relay.csr" -CA "$a/ca.crt" -CAkey "$a/ca.key" -set_serial 4242 -days 1 \
  -extfile "$dir/relay.ext" -out "$dir/relay.crt" 2> "$dir/relay-cert.err" ||
  { echo "no certificate for the TLS relays:" >&2; cat "$dir/relay-cert.err" >&2; exit 1; }
$B/relay tls $tls2 $api_port "$dir/relay.crt" "$dir/relay.key" "$a/ca.crt" "$a/agent.crt" "$a/agent.key" 2> "$dir/relay3.err" &
pids+=($!); tls_pids=$!
$B/relay tls $tls1 $tls2 "$dir/relay.crt" "$dir/relay.key" "$a/ca.crt" 2> "$dir/relay4.err" &
pids+=($!); tls_pids+="+$!"
sed "s|127.0.0.1:$api_port|127.0.0.1:$tls1|" "$a/kubeconfig" > "$dir/tls-kubeconfig"
# Each relay listening, or its rows left out (and why said).
listening() { for p in "$@"; do (exec 3<> "/dev/tcp/127.0.0.1/$p") 2> /dev/null || return 1; done; }
for _ in $(seq 1 50); do listening $hop1 $hop2 $tls1 $tls2 && break; sleep 0.1; done
if listening $hop1 $hop2 $tls1 $tls2; then
  tcp_kubeconfig=$dir/tcp-kubeconfig tls_kubeconfig=$dir/tls-kubeconfig
  relay_pids=",two TCP relays=$tcp_pids,two TLS relays=$tls_pids"
else
  echo "the reference relays did not start; their rows are left out:" >&2
  cat "$dir"/relay*.err >&2
fi

head -c $((32 * 1024 * 1024)) /dev/urandom > "$dir/blob"
if rev=$(git rev-parse --short HEAD 2>/dev/null); then
  git diff --quiet HEAD -- . ':!bench' || rev="$rev + uncommitted changes"
else
  rev=${BENCH_REV:-unknown}  # a copy without .git (git archive): say which commit it is
fi
echo "Sallyport kubectl exec benchmark — $(date -u +%Y-%m-%d), $rev, $(nproc) cores, $(uname -m), kubectl $("$KUBECTL" version --client -o json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["gitVersion"])'), fixture API server (Python $(python3 -c 'import platform; print(platform.python_version())'), aiohttp)"
WORK=$dir KUBECTL=$KUBECTL DIRECT_KUBECONFIG=$dir/apiserver/kubeconfig PROXY_KUBECONFIG=$dir/proxy-kubeconfig \
  TCP_RELAY_KUBECONFIG=$tcp_kubeconfig TLS_RELAY_KUBECONFIG=$tls_kubeconfig \
  PIDS="fixture API server (+ cat)=$api_pid,sallyport (auth + proxy)=$daemon_pid,kube agent=$agent_pid$relay_pids" \
  BLOB=$dir/blob RECORDINGS=$dir/data/recordings python3 bench/kube.py
