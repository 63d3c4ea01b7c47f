#!/usr/bin/env bash
# A/B of the daemon at N idle agent tunnels, under the same load: one cluster, one agent_sim;
# each phase (re)starts the daemon from a directory of binaries (its sallyport and sally), waits
# for all N online, then measures the daemon's CPU at rest and `sally ls` (bench/scale_ab.py).
#   cp $CARGO_TARGET_DIR/release/{sallyport,sally,agent_sim} /somewhere/before   # at the old commit
#   PHASES="before:/somewhere/before after:$CARGO_TARGET_DIR/release" N=10000 bash bench/scale_ab.sh
# PERF=1: a 20 s `perf record -g` of the daemon after each phase (/tmp/scale-ab-perf-NAME.data).
# Join tokens go straight into the cluster's SQLite database (what `sallyctl tokens add` writes,
# minus its audit event): 10,000 of them through sallyctl took 390 s.
ulimit -n "$(ulimit -Hn)"
export BENCH_LOGIN=${BENCH_LOGIN:-sallybench} DIRECT_SSHD=0
export PROXY_EXTRA="max_unauthenticated_per_address: 256, max_connection_rate_per_address: 100000"
source "$(dirname "$0")/setup.sh"
trap '[ -f "$dir/daemon.pid" ] && kill "$(cat "$dir/daemon.pid")" 2>/dev/null; cleanup' EXIT
echo "Sallyport scale A/B — $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD 2>/dev/null), $(nproc) cores"
B=$B DIR=$dir PID=$pid CONFIG=$dir/sallyport.yaml WEB=127.0.0.1:$web PIN=$pin python3 bench/scale_ab.py
