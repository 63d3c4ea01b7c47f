#!/usr/bin/env bash
# SSH through Sallyport vs direct OpenSSH on this machine, side by side, in one run:
# `echo foo` set-up, a pty login's set-up, and 32 MiB through `cat` and back (bench/ssh.py).
# PAM=1 bash bench/ssh.sh: the same with PAM's account and session stacks on both sides.
# BENCH_LOGIN=sallybench bash bench/ssh.sh: as a login with Debian's plain ~/.bashrc (made if missing).
source "$(dirname "$0")/setup.sh"
head -c $((32 * 1024 * 1024)) /dev/urandom > "$dir/blob"
echo "Sallyport SSH benchmark — $(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m), OpenSSH $(ssh -V 2>&1 | cut -d, -f1), PAM ${use_pam}, login $login"
DIRECT_CFG=$dir/direct_cfg PROXY_CFG=$dir/proxy_cfg PROXY_AES_CFG=$dir/proxy_aes_cfg NODE=node1 LOGIN=$login SALLY=$B/sally BLOB=$dir/blob python3 bench/ssh.py
