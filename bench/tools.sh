#!/usr/bin/env bash
# File copy and Ansible through Sallyport vs direct OpenSSH, side by side, in one run:
# scp of 256 MiB, and 50 Ansible module runs with pipelining and ControlPersist (bench/tools.py).
# Needs ansible-core (pip install ansible-core).
source "$(dirname "$0")/setup.sh"
head -c $((256 * 1024 * 1024)) /dev/urandom > "$dir/blob"
echo "Sallyport file copy and Ansible benchmark — $(date -u +%Y-%m-%d), $(nproc) cores, $(uname -m), OpenSSH $(ssh -V 2>&1 | cut -d, -f1), $(ansible --version 2>/dev/null | sed -n 1p)"
WORK=$dir DIRECT_CFG=$dir/direct_cfg PROXY_CFG=$dir/proxy_cfg PROXY_AES_CFG=$dir/proxy_aes_cfg NODE=node1 SALLY=$B/sally BLOB=$dir/blob python3 bench/tools.py
