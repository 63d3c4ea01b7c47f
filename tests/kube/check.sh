#!/usr/bin/env bash
# Runs real kubectl 1.32 directly against the API server fixture (tests/kube/apiserver.py), no
# proxy in between: prints PASS/FAIL per check and exits non-zero if any failed.
#   tests/kube/check.sh            (KUBECTL=/path/to/kubectl to use another binary)
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
KUBECTL="${KUBECTL:-/usr/lib/google-cloud-sdk/bin/kubectl.1.32}"
T="$(mktemp -d /tmp/kubefixture.XXXXXX)"
export HOME="$T/home"  # kubectl's discovery cache and config stay in here
mkdir -p "$HOME"
unset KUBECONFIG KUBECTL_REMOTE_COMMAND_WEBSOCKETS KUBECTL_PORT_FORWARD_WEBSOCKETS
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT

passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1${2:+: $2}"; failed=$((failed + 1)); }
check() { # check NAME COMMAND... : passes when the command exits 0
  local name="$1"; shift
  if "$@" >"$T/last.out" 2>"$T/last.err"; then pass "$name"; else fail "$name" "$(tail -c 600 "$T/last.err" "$T/last.out" | tr '\n' ' ')"; fi
}
run() { local script="$1"; shift; bash -c "$script" _ "$@"; }  # run SCRIPT ARGS: ARGS are $1...
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# start_fixture NAME ARGS... : starts one in $T/NAME, sets PORT_<NAME>
start_fixture() {
  local name="$1"; shift
  mkdir -p "$T/$name"
  python3 "$HERE/apiserver.py" --dir "$T/$name" "$@" >"$T/$name.out" 2>"$T/$name.err" &
  pids+=($!)
  for _ in $(seq 100); do
    [ -s "$T/$name.out" ] && break
    sleep 0.1
  done
  local port
  port="$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["port"])' "$T/$name.out" 2>/dev/null)" ||
    { echo "FAIL fixture $name did not start"; cat "$T/$name.err"; exit 1; }
  eval "PORT_$name=$port"
}

# a "pod port 80": a plain HTTP server with a page and a 32 MiB file
WWW="$T/www"; mkdir -p "$WWW"
echo "hello from pod port 80" >"$WWW/index.html"
head -c 33554432 /dev/urandom >"$T/big.bin"
cp "$T/big.bin" "$WWW/big.bin"
HTTP_PORT="$(free_port)"
python3 -m http.server "$HTTP_PORT" --bind 127.0.0.1 --directory "$WWW" >"$T/http.log" 2>&1 &
pids+=($!)

start_fixture main --forward "80=$HTTP_PORT"
D="$T/main"
K=("$KUBECTL" --kubeconfig "$D/kubeconfig")
LOG="$D/requests.jsonl"
SESS="$D/sessions.jsonl"
CURL=(curl -sS --cacert "$D/ca.crt")
URL="https://127.0.0.1:$PORT_main"

# jq-less helpers over the JSON-lines logs
py() { python3 -c "$@"; }
last_session() { tail -n1 "$SESS"; }
session_has() { # session_has PYTHON-EXPR-over-r (the last sessions.jsonl line)
  py "import json,sys; r=json.loads(open(sys.argv[1]).read().splitlines()[-1]); sys.exit(0 if ($1) else 1)" "$SESS"
}
log_has() { # log_has PYTHON-EXPR-over-r : some requests.jsonl line matches
  py "import json,sys; sys.exit(0 if any(($1) for r in map(json.loads, open(sys.argv[1]))) else 1)" "$LOG"
}

# a WebSocket exec that outlives kubectl's 60 s read deadline only if the server answers its pings
"${K[@]}" exec -n dev web-2 -- sh -c 'sleep 66; echo still-here' >"$T/long.out" 2>"$T/long.err" &
long_pid=$!

echo "== TLS, authentication, request log"
for kc in kubeconfig kubeconfig-data kubeconfig-ed25519 kubeconfig-token; do
  check "get namespaces with $kc" run '"$1" --kubeconfig "$2" get ns -o name | tr "\n" " " | grep -qx "namespace/default namespace/dev namespace/prod "' "$KUBECTL" "$D/$kc"
done
check "no credentials: 401 Status" run '[ "$("$@" "'"$URL"'/api/v1/pods")" = "{\"kind\":\"Status\",\"apiVersion\":\"v1\",\"metadata\":{},\"status\":\"Failure\",\"message\":\"Unauthorized\",\"reason\":\"Unauthorized\",\"code\":401}" ]' "${CURL[@]}"
check "wrong token: 401" run '[ "$("$@" -o /dev/null -w "%{http_code}" -H "Authorization: Bearer nope" "'"$URL"'/api")" = 401 ]' "${CURL[@]}"
check "client certificate from another CA refused" run '
  cd "$1" && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout o.key -out o.crt -subj /O=system:masters/CN=mallory -days 1 2>/dev/null &&
  ! curl -sS --cacert "$2" --cert o.crt --key o.key "$3/api" >/dev/null 2>&1' "$T" "$D/ca.crt" "$URL"
check "log: x509 identity (CN, O)" log_has 'r["identity"] == {"via": "x509", "cn": "sallyport-agent", "o": ["system:masters"]}'
check "log: token identity and raw Authorization" log_has 'r["identity"] and r["identity"]["via"] == "token" and r["authorization"] == "Bearer " + open("'"$D/token"'").read().strip()'
check "log: 401 recorded with no identity" log_has 'r["status"] == 401 and r["identity"] is None'

echo "== discovery and reads"
check "discovery: aggregated asked, legacy answered" log_has 'r["path"] == "/apis" and "as=APIGroupDiscoveryList" in (r["accept"] or "") and r["status"] == 200'
check "kubectl api-resources" run '"$@" api-resources | grep -q "^deployments .*apps/v1 .*true .*Deployment" && "$@" api-resources | grep -q "^pods .*po .*v1 .*true .*Pod"' "${K[@]}"
check "kubectl version (server)" run '"$@" version | grep -q "Server Version: v1.32"' "${K[@]}"
check "get pods -n dev (Table)" run 'out="$("$@" get pods -n dev)" && echo "$out" | head -1 | grep -q "^NAME *READY *STATUS *RESTARTS *AGE$" && echo "$out" | grep -q "^web-1 *2/2 *Running *0 " && echo "$out" | grep -q "^web-2 *1/1 *Running"' "${K[@]}"
check "log: kubectl get asked for a Table" log_has 'r["path"] == "/api/v1/namespaces/dev/pods" and (r["accept"] or "").startswith("application/json;as=Table;v=v1;g=meta.k8s.io")'
check "get pods -A" run '[ "$("$@" get pods -A --no-headers | awk "{print \$1\"/\"\$2}" | tr "\n" " ")" = "default/shell dev/web-1 dev/web-2 prod/db-1 " ]' "${K[@]}"
check "get pods -o wide" run '"$@" get pods -n prod -o wide | grep -q "^db-1 .* 10\.244\.0\.[0-9]* *node-1 *<none> *<none>$"' "${K[@]}"
check "get pods -o json" run '"$@" get pods -n dev -o json | python3 -c "import json,sys; d=json.load(sys.stdin); assert [i[\"metadata\"][\"name\"] for i in d[\"items\"]] == [\"web-1\",\"web-2\"]; assert [c[\"name\"] for c in d[\"items\"][0][\"spec\"][\"containers\"]] == [\"main\",\"sidecar\"]"' "${K[@]}"
check "get pod -o yaml" run '"$@" get pod -n default shell -o yaml | grep -q "^  phase: Running$"' "${K[@]}"
check "get missing pod: NotFound" run '"$@" get pod -n dev nope 2>&1 | grep -q "Error from server (NotFound): pods \"nope\" not found"' "${K[@]}"
check "get secrets,configmaps -A" run '"$@" get secrets,configmaps -A | grep -q "secret/db-password *Opaque *1" ' "${K[@]}"
check "gzip when Accept-Encoding: gzip" run '"$@" -D - -o /dev/null --cert "'"$D"'/agent.crt" --key "'"$D"'/agent.key" -H "Accept-Encoding: gzip" "'"$URL"'/api/v1/pods" | grep -qi "^content-encoding: gzip"' "${CURL[@]}"
check "log: kubectl sends Accept-Encoding: gzip" log_has '(r["accept_encoding"] or "") == "gzip" and (r["user_agent"] or "").startswith("kubectl")'
check "no OpenAPI needed by get/exec" run '! grep -q "\"path\":\"/openapi" "$1"' "$LOG"

echo "== watch"
"${K[@]}" get pods -n dev -w >"$T/watch.out" 2>&1 &
wpid=$!
sleep 2
"${CURL[@]}" --cert "$D/agent.crt" --key "$D/agent.key" -X POST "$URL/fixture/pods/dev/web-9" -o /dev/null
sleep 1
"${K[@]}" delete pod -n dev web-9 --wait=false >/dev/null
sleep 1
kill $wpid 2>/dev/null; wait $wpid 2>/dev/null
check "get -w shows a pod added during the watch" grep -q "^web-9 *1/1 *Running *0 *[0-9]*s$" "$T/watch.out"
check "get -w shows it terminating" grep -q "^web-9 .*Terminating" "$T/watch.out"
check "get -w shows no duplicate of existing pods" run '[ "$(grep -c "^web-1 " "$1")" = 1 ]' "$T/watch.out"
check "log: watch=true with a Table Accept" log_has 'r["path"] == "/api/v1/namespaces/dev/pods" and "watch=true" in r["query"] and "as=Table" in (r["accept"] or "")'
check "raw watch streams ADDED events" run '"$@" --cert "'"$D"'/agent.crt" --key "'"$D"'/agent.key" "'"$URL"'/api/v1/namespaces/prod/pods?watch=1&timeoutSeconds=1" | python3 -c "import json,sys; e=[json.loads(l) for l in sys.stdin]; assert [(x[\"type\"], x[\"object\"][\"kind\"], x[\"object\"][\"metadata\"][\"name\"]) for x in e] == [(\"ADDED\",\"Pod\",\"db-1\")], e"' "${CURL[@]}"

echo "== impersonation"
check "auth whoami (cert)" run '"$@" auth whoami | grep -q "^Username *sallyport-agent$"' "${K[@]}"
check "auth whoami --as alice --as-group devs" run '"$@" auth whoami -o json --as alice --as-group devs --as-group ops | python3 -c "import json,sys; u=json.load(sys.stdin)[\"status\"][\"userInfo\"]; assert u[\"username\"]==\"alice\" and u[\"groups\"]==[\"devs\",\"ops\",\"system:authenticated\"], u"' "${K[@]}"
check "log: Impersonate-* headers and effective user" log_has 'r["impersonate"].get("Impersonate-Group") == ["devs", "ops"] and r["impersonate"].get("Impersonate-User") == ["alice"] and r["effective"]["user"] == "alice" and r["identity"]["cn"] == "sallyport-agent"'
check "auth whoami (token kubeconfig)" run '"$1" --kubeconfig "$2" auth whoami | grep -q "^Username *sallyport-token$"' "$KUBECTL" "$D/kubeconfig-token"
check "Impersonate-Group without Impersonate-User refused" run '"$@" --cert "'"$D"'/agent.crt" --key "'"$D"'/agent.key" -H "Impersonate-Group: devs" "'"$URL"'/api" | grep -q "without impersonating a user"' "${CURL[@]}"

echo "== exec over WebSocket (v5)"
check "exec echo" run '[ "$("$@" exec -n dev web-1 -c main -- echo hi)" = hi ]' "${K[@]}"
check "session: websocket v5" session_has 'r["transport"] == "websocket" and r["protocol"] == "v5.channel.k8s.io" and r["command"] == ["echo", "hi"]'
check "log: exec upgrade asked for v5.channel.k8s.io" log_has 'r["upgrade"] and r["upgrade"]["upgrade"] == "websocket" and r["upgrade"]["protocols"] == ["v5.channel.k8s.io"] and r["status"] == 101'
check "exec: stdout and stderr apart" run '[ "$("$@" exec -n dev web-2 -- sh -c "echo out; echo err >&2" 2>/dev/null)" = out ] && [ "$("$@" exec -n dev web-2 -- sh -c "echo out; echo err >&2" 2>&1 >/dev/null)" = err ]' "${K[@]}"
check "exec: exit code 3" run '"$@" exec -n dev web-2 -- sh -c "exit 3"; [ $? = 3 ]' "${K[@]}"
check "exec: unknown command is an InternalError" run '"$@" exec -n dev web-2 -- nope 2>&1 | grep -q "executable file not found in \$PATH"' "${K[@]}"
check "exec -i: stdin closed (v5 CLOSE) ends cat" run '[ "$(echo hello | timeout 20 "$@" exec -i -n dev web-2 -- cat)" = hello ]' "${K[@]}"
check "exec -i: 32 MiB through cat" run 'timeout 120 "$@" exec -i -n dev web-2 -- cat <"'"$T"'/big.bin" | cmp - "'"$T"'/big.bin"' "${K[@]}"
# (script(1) with stdin at EOF types a NUL, which the pod's terminal echoes as ^@: sed drops it)
check "exec -it under a terminal (tty, size)" run 'out="$(timeout 20 script -qec "stty cols 91 rows 37; $* exec -it -n dev web-2 -- sh -c \"tty; stty size; exit 4\"" /dev/null </dev/null)"; rc=$?; out="$(echo "$out" | tr -d "\r" | sed "s/\^@//g")"; echo "$out" | grep -q "^/dev/pts/" && echo "$out" | grep -q "^37 91$" && [ $rc = 4 ]' "${K[@]}"
check "session: tty resize recorded" session_has 'r["tty"] and [91, 37] in r["resizes"]'

echo "== exec over SPDY/3.1 (KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false)"
export KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false
check "spdy exec echo" run '[ "$("$@" exec -n dev web-1 -c sidecar -- echo hi)" = hi ]' "${K[@]}"
check "session: spdy v4.channel.k8s.io" session_has 'r["transport"] == "spdy" and r["protocol"] == "v4.channel.k8s.io" and r["container"] == "sidecar"'
check "log: SPDY upgrade offered v5..v1" log_has 'r["upgrade"] and r["upgrade"]["upgrade"] == "SPDY/3.1" and r["upgrade"]["protocols"][:2] == ["v5.channel.k8s.io", "v4.channel.k8s.io"]'
check "spdy exec: exit code 3" run '"$@" exec -n dev web-2 -- sh -c "echo o; exit 3" >/dev/null; [ $? = 3 ]' "${K[@]}"
check "spdy exec -i: stdin FIN ends cat" run '[ "$(echo hello | timeout 20 "$@" exec -i -n dev web-2 -- cat)" = hello ]' "${K[@]}"
check "spdy exec -i: 32 MiB through cat" run 'timeout 120 "$@" exec -i -n dev web-2 -- cat <"'"$T"'/big.bin" | cmp - "'"$T"'/big.bin"' "${K[@]}"
check "session: WINDOW_UPDATEs sent for the upload" session_has 'r["spdy_frames_out"].get("WINDOW_UPDATE", 0) > 100 and r["bytes"]["stdin"] == 33554432'
check "spdy exec -it under a terminal" run 'out="$(timeout 20 script -qec "stty cols 91 rows 37; $* exec -it -n dev web-2 -- sh -c \"tty; stty size; exit 4\"" /dev/null </dev/null)"; rc=$?; out="$(echo "$out" | tr -d "\r" | sed "s/\^@//g")"; echo "$out" | grep -q "^/dev/pts/" && echo "$out" | grep -q "^37 91$" && [ $rc = 4 ]' "${K[@]}"
unset KUBECTL_REMOTE_COMMAND_WEBSOCKETS

echo "== attach"
check "attach -i (websocket)" run '[ "$(echo "echo attached-\$((6*7))" | timeout 20 "$@" attach -i -q -n default shell)" = attached-42 ]' "${K[@]}"
check "attach -i (spdy)" run '[ "$(echo "echo attached; exit 2" | KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false timeout 20 "$@" attach -i -q -n default shell)" = attached ]' "${K[@]}"
check "session: attach runs /bin/sh" session_has 'r["kind"] == "attach" and r["command"] == ["/bin/sh"] and r["transport"] == "spdy"'

echo "== kubectl cp"
mkdir -p "$T/cpsrc/sub" && echo one >"$T/cpsrc/a.txt" && echo two >"$T/cpsrc/sub/b.txt"
check "cp local -> pod" run '"$@" cp "'"$T"'/cpsrc" dev/web-2:copied && diff -r "'"$T"'/cpsrc" "'"$D"'/pods/dev/web-2/copied"' "${K[@]}"
check "cp pod -> local" run '"$@" cp dev/web-2:copied "'"$T"'/cpback" && diff -r "'"$T"'/cpsrc" "'"$T"'/cpback"' "${K[@]}"

echo "== port-forward"
pf() { # pf MODE(true|false) POD_PORT : runs kubectl port-forward, fetches, checks
  local lp; lp="$(free_port)"
  KUBECTL_PORT_FORWARD_WEBSOCKETS="$1" "${K[@]}" port-forward -n dev pod/web-1 "$lp:$2" >"$T/pf.out" 2>&1 &
  local p=$!
  for _ in $(seq 50); do grep -q "Forwarding from" "$T/pf.out" 2>/dev/null && break; sleep 0.1; done
  local ok=0
  if [ "$2" = 80 ]; then
    [ "$(curl -sS "localhost:$lp/")" = "hello from pod port 80" ] || ok=1
    local dl=()
    for i in 1 2 3; do curl -sS "localhost:$lp/big.bin" -o "$T/dl$i" & dl+=($!); done
    wait "${dl[@]}"
    for i in 1 2 3; do cmp -s "$T/dl$i" "$T/big.bin" || ok=1; done
  else
    ! curl -sS -m 5 "localhost:$lp/" >/dev/null 2>&1 || ok=1
    sleep 0.5
  fi
  kill $p 2>/dev/null; wait $p 2>/dev/null
  return $ok
}
check "port-forward over WebSocket (SPDY tunnel)" pf true 80
check "session: websocket-tunnel SPDY/3.1+portforward.k8s.io" session_has 'r["transport"] == "websocket-tunnel" and r["protocol"] == "SPDY/3.1+portforward.k8s.io" and len(r["connections"]) == 4'
check "port-forward over SPDY" pf false 80
check "session: spdy portforward.k8s.io" session_has 'r["transport"] == "spdy" and r["protocol"] == "portforward.k8s.io" and all(c["bytes_out"] > 0 for c in r["connections"])'
pf true 81
check "port-forward to a closed pod port: error stream" run 'grep -q "error forwarding port 81 to pod web-1" "$1" || { cat "$1" >&2; false; }' "$T/pf.out"

echo "== WebSocket protocols of other clients (v4, base64, v1, kubelet port-forward)"
while IFS= read -r line; do
  case "$line" in
    PASS\ *) pass "${line#PASS }" ;;
    FAIL\ *) fail "${line#FAIL }" ;;
    *) echo "$line" ;;
  esac
done < <(timeout 60 python3 "$HERE/wsclient_check.py" "$D" "$HTTP_PORT" 2>&1 || echo "FAIL wsclient_check.py exited $?")

echo "== a cluster before WebSocket streaming (--no-websocket): kubectl falls back to SPDY"
start_fixture old --no-websocket --forward "80=$HTTP_PORT"
KO=("$KUBECTL" --kubeconfig "$T/old/kubeconfig")
check "exec falls back" run '[ "$("$@" exec -n dev web-2 -- echo fell-back)" = fell-back ]' "${KO[@]}"
check "log: 403 to the WebSocket, then 101 to SPDY" py 'import json; r=[json.loads(l) for l in open("'"$T"'/old/requests.jsonl") if "/exec" in json.loads(l)["path"]]; assert [(x["upgrade"]["upgrade"], x["status"]) for x in r] == [("websocket", 403), ("SPDY/3.1", 101)], r'
check "port-forward falls back" run 'lp=$(python3 -c "import socket; s=socket.socket(); s.bind((\"127.0.0.1\",0)); print(s.getsockname()[1])"); "$@" port-forward -n dev pod/web-1 $lp:80 >/dev/null 2>&1 & p=$!; sleep 1.5; out="$(curl -sS localhost:$lp/)"; kill $p; [ "$out" = "hello from pod port 80" ]' "${KO[@]}"
check "log: 400 to the tunnel, then 101 to SPDY" py 'import json; r=[json.loads(l) for l in open("'"$T"'/old/requests.jsonl") if "/portforward" in json.loads(l)["path"]]; assert [(x["upgrade"]["upgrade"], x["status"]) for x in r] == [("websocket", 400), ("SPDY/3.1", 101)], r'

echo "== a WebSocket-only server (--no-spdy) and --prefer-protobuf"
start_fixture nospdy --no-spdy --prefer-protobuf
KN=("$KUBECTL" --kubeconfig "$T/nospdy/kubeconfig")
check "exec over WebSocket still works" run '[ "$("$@" exec -n dev web-2 -- echo ws)" = ws ]' "${KN[@]}"
check "SPDY refused with 400" run '! KUBECTL_REMOTE_COMMAND_WEBSOCKETS=false "$@" exec -n dev web-2 -- echo x 2>"'"$T"'/nospdy.err"; grep -q "SPDY" "'"$T"'/nospdy.err"' "${KN[@]}"
check "protobuf-only Accept: 406" run '[ "$(curl -sS --cacert "$1/ca.crt" --cert "$1/agent.crt" --key "$1/agent.key" -H "Accept: application/vnd.kubernetes.protobuf" -o /dev/null -w "%{http_code}" "https://127.0.0.1:$2/api/v1/pods")" = 406 ]' "$T/nospdy" "$PORT_nospdy"
check "protobuf first, JSON fallback: JSON" run 'curl -sS --cacert "$1/ca.crt" --cert "$1/agent.crt" --key "$1/agent.key" -H "Accept: application/vnd.kubernetes.protobuf,application/json" "https://127.0.0.1:$2/api/v1/pods" | grep -q "\"kind\":\"PodList\""' "$T/nospdy" "$PORT_nospdy"

echo "== a WebSocket exec longer than kubectl's 60 s ping deadline"
wait $long_pid
rc=$?
if [ $rc = 0 ] && [ "$(cat "$T/long.out")" = still-here ]; then pass "exec of 66 s (pings answered)"; else fail "exec of 66 s (pings answered)" "rc=$rc $(cat "$T/long.out" "$T/long.err")"; fi

for f in main old nospdy; do
  if grep -q Traceback "$T/$f.err"; then fail "fixture $f stderr has no traceback" "$(cat "$T/$f.err")"; fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ]
