#!/usr/bin/env bash
# Scale of the all-in-one on this machine (bench/scale.py): (a) `sally bench ssh` at rising
# rates, recording on, beside OpenSSH's own sessions/s from a parallel xargs loop; (b) idle
# agent tunnels held by tests/src/bin/agent_sim (N = 1,000 .. 10,000 on one proxy): the
# daemon's RSS and CPU at rest, `sally ls` over N nodes, and every tunnel back after a restart.
# RATES="100 200" NS="1000 2000" DURATION=5s bash bench/scale.sh: fewer steps.
# SKIP_SSH=1 / SKIP_IDLE=1: leave out (a) / (b).
#
# Every client here (the bench, the simulated agents) comes from 127.0.0.1, which the proxy's
# doors treat as one address: the per-address caps on unauthenticated connections and the
# DHEat throttle are raised to the global cap (256, the default) and out of the way.
ulimit -n "$(ulimit -Hn)"
# The login: sallybench (made if missing, with Debian's plain ~/.bashrc), as root's rc files here
# start pyenv and friends, whose lock-and-sleep under load would be measured instead.
export BENCH_LOGIN=${BENCH_LOGIN:-sallybench}
export PROXY_EXTRA="max_unauthenticated_per_address: 256, max_connection_rate_per_address: 100000"
source "$(dirname "$0")/setup.sh"
trap '[ -f "$dir/daemon.pid" ] && kill "$(cat "$dir/daemon.pid")" 2>/dev/null; cleanup' EXIT
echo "Sallyport scale benchmark — $(date -u +%Y-%m-%d), $(git rev-parse --short HEAD 2>/dev/null), $(nproc) cores, $(uname -m), OpenSSH $(ssh -V 2>&1 | cut -d, -f1), login $login, ulimit -n $(ulimit -n)"
B=$B DIR=$dir PID=$pid CONFIG=$dir/sallyport.yaml WEB=127.0.0.1:$web PIN=$pin LOGIN=$login NODE=node1 \
  DIRECT_CFG=$dir/direct_cfg PROXY_CFG=$dir/proxy_cfg python3 bench/scale.py
