#!/usr/bin/env bash
# Logins per second and p50/p99 login latency against a local all-in-one (release build).
# Password-only logins: a TOTP code is single-use per 30 s step, which would cap the benchmark
# at one login per user per step; the cost measured (argon2id, role evaluation, SSH and X.509
# signing, hash-chained audit write) is the same.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins -q
dir=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
auth=$(port); web=$(port)
cat > "$dir/sallyport.yaml" <<CFG
version: v1
sallyport: {data_dir: $dir/data, log: {severity: warn}}
auth_service: {listen_addr: 127.0.0.1:$auth, cluster_name: bench, authentication: {second_factor: off}}
proxy_service: {web_listen_addr: 127.0.0.1:$web, ssh_listen_addr: 127.0.0.1:$(port), tunnel_listen_addr: 127.0.0.1:$(port), kube_listen_addr: 127.0.0.1:$(port)}
CFG
target/release/sallyport start --config "$dir/sallyport.yaml" > "$dir/out" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 1 100); do grep -q "CA pin" "$dir/out" && break; sleep 0.1; done
echo "Sallyport login benchmark — $(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m)"
python3 bench/login.py "127.0.0.1:$web" "$dir/data" "$@"
