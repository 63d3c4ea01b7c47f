#!/bin/sh
# The compose topology's one-shot set-up (the `bootstrap` service of docker-compose.yml), run
# once auth1 is healthy, as root in auth1's network namespace with auth1's data dir mounted
# read-only: it acts as the local admin (`sallyctl --data-dir`, whose identity auth1 wrote
# there, for auth at 127.0.0.1:3025) and writes for the services that start after it:
#   /join/ca-pin                          the cluster's CA pin (--ca-pin)
#   /join/proxy1.token, proxy2.token      one-time proxy tokens (--token), an hour each
#   /join/node1.token                     a one-time node token for the agent
#   /auth-key/audit-checkpoint.key        auth1's audit checkpoint key, for auth2
# Every run mints fresh tokens (a proxy or agent that joined already ignores its token;
# unused tokens expire), and never replaces the shared checkpoint key. The paths can be
# changed through DATA_DIR, JOIN_DIR and KEY_DIR, and the files' owner through OWNER
# (tests/tests/compose.rs runs it against a cluster on loopback that way).
set -eu
data=${DATA_DIR:-/var/lib/sallyport}
join=${JOIN_DIR:-/join}
keys=${KEY_DIR:-/auth-key}
owner=${OWNER:-10001:10001} # the image's `sallyport` user, which the proxies and auth2 run as

ctl() { sallyctl --data-dir "$data" "$@"; }

# Healthy means auth1 serves; still, give it a few seconds before giving up.
tries=0
until ctl status >/dev/null 2>&1; do
  tries=$((tries + 1))
  if [ "$tries" -ge 30 ]; then
    ctl status # its error, for the log
    exit 1
  fi
  sleep 1
done

# Writes $2 to $join/$1 (0600, the sallyport user's), replacing it at once.
put() {
  ( umask 077 && printf '%s\n' "$2" >"$join/.$1.tmp" )
  chown "$owner" "$join/.$1.tmp"
  mv "$join/.$1.tmp" "$join/$1"
}

status=$(ctl status --format json)
pin=$(printf '%s' "$status" | grep -o 'sha256:[0-9a-f]*' | head -n 1)
if [ -z "$pin" ]; then
  echo "bootstrap: no CA pin in sallyctl status" >&2
  exit 1
fi
put ca-pin "$pin"

# A one-time token of kind $1 for the file $join/$2.
token() {
  json=$(ctl tokens add --type="$1" --ttl 1h --format json)
  t=$(printf '%s' "$json" | sed -n 's/.*"token":"\([^"]*\)".*/\1/p')
  if [ -z "$t" ]; then
    echo "bootstrap: no token in: $json" >&2
    exit 1
  fi
  put "$2" "$t"
}
token proxy proxy1.token
token proxy proxy2.token
token node node1.token

# Both auth instances must sign audit checkpoints with the same key: auth2 copies this one
# into its data dir at its first start.
if [ ! -f "$keys/audit-checkpoint.key" ]; then
  install -m 600 -o "${owner%:*}" -g "${owner#*:}" \
    "$data/audit-checkpoint.key" "$keys/audit-checkpoint.key"
fi
echo "bootstrap: CA pin $pin; tokens for proxy1, proxy2 and node1 written"
