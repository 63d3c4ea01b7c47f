# Sourced by the bench/*.sh scripts: brings up a release all-in-one cluster with its local
# agent (node1), a plain sshd on loopback that trusts the cluster's user CA (so both paths use
# the same certificate), and a logged-in user; leaves $dir/direct_cfg (host `direct`) and
# $dir/proxy_cfg (host `proxy`, for -J) for OpenSSH, and $dir/proxy_aes_cfg (the same with the
# cipher order `sally config` writes). Needs /usr/sbin/sshd (openssh-server).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build --release --bins -q
# CARGO_TARGET_DIR as cargo reads it (a relative one is from the workspace root).
B=$(realpath "${CARGO_TARGET_DIR:-target}")/release
dir=$(mktemp -d)
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
auth=$(port); web=$(port); sshp=$(port); tun=$(port); sshd_port=$(port)
# BENCH_LOGIN: the node login every client uses (root by default). Both sshd and the agent run
# the login's shell rc files for a command (bash reads ~/.bashrc when SSH_CLIENT is set), so a
# login with a heavy ~/.bashrc measures that file as much as the path to it.
login=${BENCH_LOGIN:-root}
# A bench login is made if missing, unlocked ('*': no password, which sshd's UsePAM no accepts).
id "$login" >/dev/null 2>&1 || useradd -m -s /bin/bash -p '*' "$login"
# PROXY_EXTRA: more proxy_service keys, `k: v, k2: v2` (bench/scale.sh raises the per-address
# door caps: all its clients share one address).
# PAM=1: both sides run PAM's account and session stacks (the agent with the shipped
# config/pam.d/sallyport, sshd with UsePAM yes and Debian's /etc/pam.d/sshd).
pam_cfg=""; use_pam=no
if [ "${PAM:-0}" = 1 ]; then
  cp config/pam.d/sallyport /etc/pam.d/sallyport-bench
  pam_cfg=", pam: {enabled: true, service_name: sallyport-bench}"; use_pam=yes
fi
cat > "$dir/sallyport.yaml" <<CFG
version: v1
sallyport: {data_dir: $dir/data, nodename: node1, log: {severity: warn}}
auth_service: {listen_addr: 127.0.0.1:$auth, cluster_name: bench, authentication: {second_factor: off}}
proxy_service: {web_listen_addr: 127.0.0.1:$web, ssh_listen_addr: 127.0.0.1:$sshp, tunnel_listen_addr: 127.0.0.1:$tun, kube_listen_addr: 127.0.0.1:$(port)${PROXY_EXTRA:+, $PROXY_EXTRA}}
ssh_service: {enabled: true, labels: {env: bench}$pam_cfg}
CFG
$B/sallyport start --config "$dir/sallyport.yaml" > "$dir/out" 2> "$dir/err" &
pid=$!
cleanup() { kill $pid 2>/dev/null; wait $pid 2>/dev/null || true; [ -f "$dir/sshd.pid" ] && kill "$(cat "$dir/sshd.pid")" 2>/dev/null; rm -rf "$dir"; [ -n "$pam_cfg" ] && rm -f /etc/pam.d/sallyport-bench; true; }
trap cleanup EXIT
for _ in $(seq 1 100); do grep -q "CA pin" "$dir/out" && break; sleep 0.1; done
pin=$(awk '/CA pin/ {print $3}' "$dir/out")
export SALLY_HOME=$dir/home
token=$($B/sallyctl --data-dir "$dir/data" users add bench --roles access --logins "root,$login" --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["token"])')
printf 'benchmark-password\n' | $B/sally signup --proxy 127.0.0.1:$web --token "$token" --ca-pin "$pin" 2>/dev/null
printf 'benchmark-password\n' | $B/sally login --proxy 127.0.0.1:$web --user bench --ca-pin "$pin" > /dev/null
keys=$SALLY_HOME/keys/127.0.0.1_$web
# Plain sshd trusting the same user CA (DIRECT_SSHD=0: none, for a script that compares no
# direct path, such as bench/web.sh).
if [ "${DIRECT_SSHD:-1}" = 1 ]; then
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$dir/hostkey"
$B/sallyctl --data-dir "$dir/data" auth export --type=user > "$dir/user_ca.pub"
cat > "$dir/sshd_config" <<CFG
Port $sshd_port
ListenAddress 127.0.0.1
HostKey $dir/hostkey
TrustedUserCAKeys $dir/user_ca.pub
PidFile $dir/sshd.pid
AuthorizedKeysFile none
PasswordAuthentication no
PermitRootLogin yes
UsePAM $use_pam
StrictModes no
# Parallel clients (bench/scale.sh's xargs loop) beyond sshd's default 10:30:100.
MaxStartups 200
Subsystem sftp /usr/lib/openssh/sftp-server
CFG
/usr/sbin/sshd -f "$dir/sshd_config"
for _ in $(seq 1 50); do [ -f "$dir/sshd.pid" ] && break; sleep 0.1; done
fi
cat > "$dir/direct_cfg" <<CFG
Host direct
  HostName 127.0.0.1
  Port $sshd_port
  User $login
  IdentityFile $keys/bench
  CertificateFile $keys/bench-cert.pub
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
CFG
cat > "$dir/proxy_cfg" <<CFG
Host proxy
  HostName 127.0.0.1
  Port $sshp
  User bench
Host *
  UserKnownHostsFile $SALLY_HOME/known_hosts
  IdentityFile $keys/bench
  CertificateFile $keys/bench-cert.pub
  IdentitiesOnly yes
  StrictHostKeyChecking yes
  BatchMode yes
CFG
{ cat "$dir/proxy_cfg"; echo "  Ciphers aes256-gcm@openssh.com,aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-ctr"; } > "$dir/proxy_aes_cfg"
for _ in $(seq 1 100); do $B/sally ssh "$login@node1" true 2>/dev/null && break; sleep 0.2; done
