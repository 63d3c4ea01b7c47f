#!/usr/bin/env python3
# A fixture of the real Kubernetes API server's wire protocol: HTTPS with client certificates
# (and bearer tokens), impersonation, discovery, pods (and a few other kinds) as JSON, Table and
# PartialObjectMetadata, watch, exec/attach over WebSocket (v5 as kube-apiserver 1.30+ serves it,
# v4 and older as the kubelet does) and over SPDY/3.1, and port-forward over SPDY and over SPDY
# tunnelled in WebSocket. It is used because no real API server can run on the machines the tests
# run on; real kubectl (1.32) talks to it, directly or through Sallyport's proxy. Commands "in" a
# pod run as local processes in DIR/pods/NAMESPACE/POD; forwarded pod ports go to local ports.
# README.md beside this file says what it models, what it logs and where it is simpler than the
# real server.
#
#   python3 tests/kube/apiserver.py --dir DIR [--port 0] [--no-websocket] [--no-spdy]
#       [--forward POD_PORT=LOCAL_PORT ...] [--prefer-protobuf] [--gzip-threshold N]
#       [--no-window-updates]
#
# Prints one line {"port": PORT} on stdout once it listens and the kubeconfigs are written.
# Needs aiohttp==3.11.18 (pinned; scripts/test installs it) and the openssl command.

import argparse
import asyncio
import base64
import copy
import datetime
import gzip
import hashlib
import hmac
import json
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from aiohttp import web  # noqa: E402

import streaming  # noqa: E402

SERVER_VERSION = {
    "major": "1",
    "minor": "32",
    "gitVersion": "v1.32.5",
    "gitCommit": "9894294ef13a5b32803e3ca2c0d620a088cc84d1",
    "gitTreeState": "clean",
    "buildDate": "2025-05-15T08:55:49Z",
    "goVersion": "go1.23.8",
    "compiler": "gc",
    "platform": "linux/amd64",
}
TOKEN_USER = "sallyport-token"
MASTERS = "system:masters"
AUTHENTICATED = "system:authenticated"
FLOWSCHEMA_UID = str(uuid.uuid4())
PRIORITYLEVEL_UID = str(uuid.uuid4())


# ---- JSON as Go's encoding/json writes it ---------------------------------------------------------
def gojson(obj):
    """Compact, UTF-8, and <, >, & escaped as \\u003c, \\u003e, \\u0026 (Go's HTML-safe default)."""
    s = json.dumps(obj, separators=(",", ":"), ensure_ascii=False)
    return (
        s.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")
    )


def now_rfc3339(t=None):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if t is None else t))


def parse_rfc3339(s):
    return datetime.datetime.strptime(s, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()


def human_duration(seconds):
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration"""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return "%ds" % s
    minutes = s // 60
    if minutes < 10:
        sec = s % 60
        return "%dm" % minutes if sec == 0 else "%dm%ds" % (minutes, sec)
    if minutes < 180:
        return "%dm" % minutes
    hours = s // 3600
    if hours < 8:
        m = minutes % 60
        return "%dh" % hours if m == 0 else "%dh%dm" % (hours, m)
    if hours < 48:
        return "%dh" % hours
    if hours < 24 * 8:
        h = hours % 24
        return "%dd" % (hours // 24) if h == 0 else "%dd%dh" % (hours // 24, h)
    if hours < 24 * 365 * 2:
        return "%dd" % (hours // 24)
    if hours < 24 * 365 * 8:
        dy = (hours // 24) % 365
        return "%dy" % (hours // 24 // 365) if dy == 0 else "%dy%dd" % (hours // 24 // 365, dy)
    return "%dy" % (hours // 24 // 365)


def age(obj):
    return human_duration(time.time() - parse_rfc3339(obj["metadata"]["creationTimestamp"]))


def parse_bool(v):
    """strconv.ParseBool, as query parameters are converted."""
    return v in ("1", "t", "T", "TRUE", "true", "True")


def status_body(code, reason, message, details=None, status="Failure"):
    body = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": status}
    if message:
        body["message"] = message
    if reason:
        body["reason"] = reason
    if details is not None:
        body["details"] = details
    if code:
        body["code"] = code
    return body


class ApiError(Exception):
    def __init__(self, code, reason, message, details=None):
        super().__init__(message)
        self.body = status_body(code, reason, message, details)
        self.code = code


def not_found(resource, name, group=""):
    d = {"name": name}
    if group:
        d["group"] = group
    d["kind"] = resource
    qual = resource + ("." + group if group else "")
    return ApiError(404, "NotFound", '%s "%s" not found' % (qual, name), d)


def no_such_path():
    return ApiError(404, "NotFound", "the server could not find the requested resource", {})


def bad_request(message):
    return ApiError(400, "BadRequest", message)


def internal_error(err):
    return ApiError(500, "InternalError", "Internal error occurred: " + err, {"causes": [{"message": err}]})


# ---- certificates, token and kubeconfigs --------------------------------------------------------------
def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_credentials(d):
    def have(*names):
        return all(os.path.exists(os.path.join(d, n)) for n in names)

    serial = lambda: "0x" + secrets.token_hex(16)  # noqa: E731
    if not have("ca.crt", "ca.key"):
        openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650", "-subj", "/CN=kubernetes",
                "-set_serial", serial(),
                "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,digitalSignature,keyEncipherment,keyCertSign", cwd=d)

    def leaf(name, keyargs, subj, ext):
        if have(name + ".crt", name + ".key"):
            return
        with tempfile.NamedTemporaryFile("w", dir=d, suffix=".ext", delete=False) as f:
            f.write(ext)
            extfile = f.name
        try:
            openssl("req", "-new", *keyargs, "-nodes", "-keyout", name + ".key", "-out", name + ".csr",
                    "-subj", subj, cwd=d)
            openssl("x509", "-req", "-in", name + ".csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", serial(),
                    "-days", "825", "-extfile", extfile, "-out", name + ".crt", cwd=d)
        finally:
            os.unlink(extfile)
            if os.path.exists(os.path.join(d, name + ".csr")):
                os.unlink(os.path.join(d, name + ".csr"))

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]
    leaf("server", ec, "/CN=kube-apiserver",
         "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
         "extendedKeyUsage=serverAuth\n"
         "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
         "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n")
    client_ext = "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n"
    leaf("agent", ec, "/O=system:masters/CN=sallyport-agent", client_ext)
    leaf("agent-ed25519", ["-newkey", "ed25519"], "/O=system:masters/CN=sallyport-agent", client_ext)
    if not have("token"):
        with open(os.path.join(d, "token"), "w") as f:
            f.write(secrets.token_hex(32) + "\n")
    for n in os.listdir(d):
        if n.endswith(".key") or n == "token":
            os.chmod(os.path.join(d, n), 0o600)


def yaml_str(s):
    return json.dumps(s)  # a JSON string is a YAML double-quoted scalar


def write_kubeconfigs(d, port):
    server = "https://127.0.0.1:%d" % port
    p = lambda n: os.path.join(os.path.abspath(d), n)  # noqa: E731
    b64 = lambda n: base64.b64encode(open(p(n), "rb").read()).decode()  # noqa: E731
    token = open(p("token")).read().strip()

    def config(cluster_lines, user_name, user_lines):
        return "\n".join([
            "apiVersion: v1",
            "kind: Config",
            "clusters:",
            "- name: fixture",
            "  cluster:",
            "    server: " + yaml_str(server),
            *["    " + ln for ln in cluster_lines],
            "users:",
            "- name: " + user_name,
            "  user:",
            *["    " + ln for ln in user_lines],
            "contexts:",
            "- name: fixture",
            "  context:",
            "    cluster: fixture",
            "    user: " + user_name,
            "current-context: fixture",
            "",
        ])

    ca_file = ["certificate-authority: " + yaml_str(p("ca.crt"))]
    ca_data = ["certificate-authority-data: " + b64("ca.crt")]
    files = {
        "kubeconfig": config(ca_file, "sallyport-agent", [
            "client-certificate: " + yaml_str(p("agent.crt")), "client-key: " + yaml_str(p("agent.key"))]),
        "kubeconfig-data": config(ca_data, "sallyport-agent", [
            "client-certificate-data: " + b64("agent.crt"), "client-key-data: " + b64("agent.key")]),
        "kubeconfig-ed25519": config(ca_file, "sallyport-agent-ed25519", [
            "client-certificate: " + yaml_str(p("agent-ed25519.crt")),
            "client-key: " + yaml_str(p("agent-ed25519.key"))]),
        "kubeconfig-token": config(ca_file, TOKEN_USER, ["token: " + yaml_str(token)]),
    }
    for name, text in files.items():
        path = p(name)
        fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)


# ---- the objects ---------------------------------------------------------------------------------------
def column(name, type_, description, priority=0, format_=""):
    return {"name": name, "type": type_, "format": format_, "description": description, "priority": priority}


NAME_DOC = (
    "Name must be unique within a namespace. Is required when creating resources, although some resources may "
    "allow a client to request the generation of an appropriate name automatically. Name is primarily intended "
    "for creation idempotence and configuration definition. Cannot be updated. More info: "
    "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names"
)
CREATION_DOC = (
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not "
    "guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It "
    "is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More "
    "info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
)
NAME_COL = column("Name", "string", NAME_DOC, 0, "name")
AGE_COL = column("Age", "string", CREATION_DOC)


def pod_cells(pod):
    spec, st = pod["spec"], pod.get("status", {})
    statuses = st.get("containerStatuses", [])
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(c.get("restartCount", 0) for c in statuses)
    reason = st.get("reason") or st.get("phase", "Unknown")
    if pod["metadata"].get("deletionTimestamp"):
        reason = "Terminating"
    gates = spec.get("readinessGates")
    return [
        pod["metadata"]["name"], "%d/%d" % (ready, len(spec.get("containers", []))), reason, str(restarts), age(pod),
        st.get("podIP") or "<none>", spec.get("nodeName") or "<none>", st.get("nominatedNodeName") or "<none>",
        "<none>" if not gates else "0/%d" % len(gates),
    ]


def data_count(obj):
    return len(obj.get("data", {}) or {}) + len(obj.get("binaryData", {}) or {})


KINDS = {
    # resource: definition (group "", version v1 unless said)
    "pods": {
        "kind": "Pod", "singular": "pod", "namespaced": True, "short": ["po"], "categories": ["all"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "hash": "xPOwRZ+Yhw8=",
        "columns": [
            NAME_COL,
            column("Ready", "string", "The aggregate readiness state of this pod for accepting traffic."),
            column("Status", "string", "The aggregate status of the containers in this pod."),
            column("Restarts", "string", "The number of times the containers in this pod have been restarted and "
                   "when the last container in this pod has restarted."),
            AGE_COL,
            column("IP", "string", "podIP address allocated to the pod. Routable at least within the cluster. "
                   "Empty if not yet allocated.", 1),
            column("Node", "string", "NodeName indicates in which node this pod is scheduled. If empty, this pod is "
                   "a candidate for scheduling by the scheduler defined in schedulerName. Once this field is set, the "
                   "kubelet for this node becomes responsible for the lifecycle of this pod. This field should not be "
                   "used to express a desire for the pod to be scheduled on a specific node. "
                   "https://kubernetes.io/docs/concepts/scheduling-eviction/assign-pod-node/#nodename", 1),
            column("Nominated Node", "string", "nominatedNodeName is set only when this pod preempts other pods on "
                   "the node, but it cannot be scheduled right away as preemption victims receive their graceful "
                   "termination periods. This field does not guarantee that the pod will be scheduled on this node. "
                   "Scheduler may decide to place the pod elsewhere if other nodes become available sooner. Scheduler "
                   "may also decide to give the resources on this node to a higher priority pod that is created after "
                   "preemption. As a result, this field may be different than PodSpec.nodeName when the pod is "
                   "scheduled.", 1),
            column("Readiness Gates", "string", "If specified, all readiness gates will be evaluated for pod "
                   "readiness. A pod is ready when all its containers are ready AND all conditions specified in the "
                   "readiness gates have status equal to \"True\" More info: "
                   "https://git.k8s.io/enhancements/keps/sig-network/580-pod-readiness-gates", 1),
        ],
        "cells": pod_cells,
        "subresources": [
            ("attach", "PodAttachOptions", ["create", "get"]),
            ("binding", "Binding", ["create"]),
            ("ephemeralcontainers", "Pod", ["get", "patch", "update"]),
            ("eviction", "Eviction", ["create"], "policy", "v1"),
            ("exec", "PodExecOptions", ["create", "get"]),
            ("log", "Pod", ["get"]),
            ("portforward", "PodPortForwardOptions", ["create", "get"]),
            ("proxy", "PodProxyOptions", ["create", "delete", "get", "head", "options", "patch", "update"]),
            ("resize", "Pod", ["get", "patch", "update"]),
            ("status", "Pod", ["get", "patch", "update"]),
        ],
    },
    "namespaces": {
        "kind": "Namespace", "singular": "namespace", "namespaced": False, "short": ["ns"],
        "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"], "hash": "Q3oi5N2YM8M=",
        "columns": [NAME_COL, column("Status", "string", "The status of the namespace"), AGE_COL],
        "cells": lambda o: [o["metadata"]["name"], o.get("status", {}).get("phase", "Active"), age(o)],
        "subresources": [("finalize", "Namespace", ["update"]), ("status", "Namespace", ["get", "patch", "update"])],
    },
    "configmaps": {
        "kind": "ConfigMap", "singular": "configmap", "namespaced": True, "short": ["cm"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "hash": "qFsyl6wFWjQ=",
        "columns": [NAME_COL, column("Data", "string", "Data contains the configuration data. Each key must consist "
                    "of alphanumeric characters, '-', '_' or '.'. Values with non-UTF-8 byte sequences must use the "
                    "BinaryData field. The keys stored in Data must not overlap with the keys in the BinaryData field, "
                    "this is enforced during validation process."), AGE_COL],
        "cells": lambda o: [o["metadata"]["name"], data_count(o), age(o)],
    },
    "secrets": {
        "kind": "Secret", "singular": "secret", "namespaced": True,
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "hash": "S6u1pOWzb84=",
        "columns": [NAME_COL, column("Type", "string", "The type of the secret"),
                    column("Data", "string", "The number of entries in the secret"), AGE_COL],
        "cells": lambda o: [o["metadata"]["name"], o.get("type", "Opaque"), data_count(o), age(o)],
    },
    "services": {
        "kind": "Service", "singular": "service", "namespaced": True, "short": ["svc"], "categories": ["all"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "hash": "0/CO1lhkEBI=",
        "columns": [NAME_COL, column("Type", "string", "type determines how the Service is exposed."),
                    column("Cluster-IP", "string", "clusterIP is the IP address of the service."),
                    column("External-IP", "string", "externalIPs is a list of IP addresses for which nodes in the "
                           "cluster will also accept traffic for this service."),
                    column("Port(s)", "string", "The list of ports that are exposed by this service."), AGE_COL,
                    column("Selector", "string", "Route service traffic to pods with label keys and values matching "
                           "this selector.", 1)],
        "cells": lambda o: [
            o["metadata"]["name"], o["spec"].get("type", "ClusterIP"), o["spec"].get("clusterIP", "<none>"), "<none>",
            ",".join("%d/%s" % (p["port"], p.get("protocol", "TCP")) for p in o["spec"].get("ports", [])) or "<none>",
            age(o), ",".join("%s=%s" % kv for kv in sorted(o["spec"].get("selector", {}).items())) or "<none>",
        ],
        "subresources": [("proxy", "ServiceProxyOptions", ["create", "delete", "get", "head", "options", "patch", "update"]),
                         ("status", "Service", ["get", "patch", "update"])],
    },
    "nodes": {
        "kind": "Node", "singular": "node", "namespaced": False, "short": ["no"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "hash": "XwShjMxG9Fs=",
        "columns": [NAME_COL, column("Status", "string", "The status of the node"),
                    column("Roles", "string", "The roles of the node"), AGE_COL,
                    column("Version", "string", "Kubelet Version reported by the node."),
                    column("Internal-IP", "string", "List of addresses reachable to the node.", 1),
                    column("External-IP", "string", "List of addresses reachable to the node.", 1),
                    column("OS-Image", "string", "OS Image reported by the node from /etc/os-release (e.g. Debian "
                           "GNU/Linux 7 (wheezy)).", 1),
                    column("Kernel-Version", "string", "Kernel Version reported by the node from 'uname -r' (e.g. "
                           "3.16.0-0.bpo.4-amd64).", 1),
                    column("Container-Runtime", "string", "ContainerRuntime Version reported by the node through "
                           "runtime remote API (e.g. containerd://1.4.2).", 1)],
        "cells": lambda o: [
            o["metadata"]["name"], "Ready", "control-plane", age(o), o["status"]["nodeInfo"]["kubeletVersion"],
            o["status"]["addresses"][0]["address"], "<none>", o["status"]["nodeInfo"]["osImage"],
            o["status"]["nodeInfo"]["kernelVersion"], o["status"]["nodeInfo"]["containerRuntimeVersion"],
        ],
        "subresources": [("proxy", "NodeProxyOptions", ["create", "delete", "get", "head", "options", "patch", "update"]),
                         ("status", "Node", ["get", "patch", "update"])],
    },
    "deployments": {
        "group": "apps", "kind": "Deployment", "singular": "deployment", "namespaced": True, "short": ["deploy"],
        "categories": ["all"],
        "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
        "hash": "8aSe+NMegvE=",
        "columns": [NAME_COL, column("Ready", "string", "Number of the pod with ready state"),
                    column("Up-to-date", "string", "Total number of non-terminated pods targeted by this deployment "
                           "that have the desired template spec."),
                    column("Available", "string", "Total number of available pods (ready for at least "
                           "minReadySeconds) targeted by this deployment."), AGE_COL,
                    column("Containers", "string", "Names of each container in the template.", 1),
                    column("Images", "string", "Images referenced by each container in the template.", 1),
                    column("Selector", "string", "Label selector for pods. Existing ReplicaSets whose pods are "
                           "selected by this will be the ones affected by this deployment.", 1)],
        "cells": lambda o: [
            o["metadata"]["name"], "%d/%d" % (o["status"].get("readyReplicas", 0), o["spec"]["replicas"]),
            o["status"].get("updatedReplicas", 0), o["status"].get("availableReplicas", 0), age(o),
            ",".join(c["name"] for c in o["spec"]["template"]["spec"]["containers"]),
            ",".join(c["image"] for c in o["spec"]["template"]["spec"]["containers"]),
            ",".join("%s=%s" % kv for kv in sorted(o["spec"]["selector"]["matchLabels"].items())),
        ],
        "subresources": [("scale", "Scale", ["get", "patch", "update"], "autoscaling", "v1"),
                         ("status", "Deployment", ["get", "patch", "update"])],
    },
}
for _r, _d in KINDS.items():
    _d.setdefault("group", "")
    _d["version"] = "v1"
    _d["apiVersion"] = (_d["group"] + "/v1") if _d["group"] else "v1"


def resource_list(group):
    out = []
    for name, d in KINDS.items():
        if d["group"] != group:
            continue
        r = {"name": name, "singularName": d["singular"], "namespaced": d["namespaced"], "kind": d["kind"],
             "verbs": d["verbs"]}
        if d.get("short"):
            r["shortNames"] = d["short"]
        if d.get("categories"):
            r["categories"] = d["categories"]
        r["storageVersionHash"] = d["hash"]
        out.append(r)
        for sub in d.get("subresources", []):
            s = {"name": name + "/" + sub[0], "singularName": "", "namespaced": d["namespaced"]}
            if len(sub) > 3:
                s["group"], s["version"] = sub[3], sub[4]
            s["kind"] = sub[1]
            s["verbs"] = sub[2]
            out.append(s)
    if group == "authentication.k8s.io":
        out = [
            {"name": "selfsubjectreviews", "singularName": "selfsubjectreview", "namespaced": False,
             "kind": "SelfSubjectReview", "verbs": ["create"]},
            {"name": "tokenreviews", "singularName": "tokenreview", "namespaced": False, "kind": "TokenReview",
             "verbs": ["create"]},
        ]
    return sorted(out, key=lambda r: r["name"])


class Store:
    """Objects by (resource, namespace, name), a resourceVersion counter and the event history
    that watches replay from."""

    def __init__(self, root, started):
        self.root = root
        self.rv = 1000
        self.objects = {}
        self.history = []  # (rv, type, resource, namespace, object)
        self.watchers = set()
        self.started = started

    def next_rv(self):
        self.rv += 1
        return str(self.rv)

    def list(self, resource, namespace=None):
        out = [o for (r, ns, _n), o in self.objects.items() if r == resource and (namespace is None or ns == namespace)]
        return sorted(out, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"]))

    def get(self, resource, namespace, name):
        return self.objects.get((resource, namespace or "", name))

    def _emit(self, etype, resource, obj):
        ns = obj["metadata"].get("namespace", "")
        self.history.append((int(obj["metadata"]["resourceVersion"]), etype, resource, ns, copy.deepcopy(obj)))
        for w in list(self.watchers):
            w(etype, resource, ns, obj)

    def create(self, resource, obj, created=None):
        md = obj.setdefault("metadata", {})
        ns = md.get("namespace", "") if KINDS[resource]["namespaced"] else ""
        ordered = {"name": md["name"]}
        if KINDS[resource]["namespaced"]:
            ordered["namespace"] = ns
        ordered["uid"] = md.get("uid") or str(uuid.uuid4())
        ordered["resourceVersion"] = self.next_rv()
        ordered["generation"] = md.get("generation") if md.get("generation") else None
        ordered["creationTimestamp"] = now_rfc3339(created)
        for k, v in md.items():
            if k not in ordered and k not in ("resourceVersion", "creationTimestamp", "selfLink"):
                ordered[k] = v
        if ordered["generation"] is None:
            del ordered["generation"]
        obj["metadata"] = ordered
        self.objects[(resource, ns, md["name"])] = obj
        if resource == "pods":
            os.makedirs(self.pod_dir(ns, md["name"]), exist_ok=True)
        self._emit("ADDED", resource, obj)
        return obj

    def update(self, resource, obj):
        obj["metadata"]["resourceVersion"] = self.next_rv()
        ns = obj["metadata"].get("namespace", "")
        self.objects[(resource, ns, obj["metadata"]["name"])] = obj
        self._emit("MODIFIED", resource, obj)
        return obj

    def delete(self, resource, namespace, name):
        obj = self.objects.pop((resource, namespace or "", name))
        obj["metadata"]["resourceVersion"] = self.next_rv()
        self._emit("DELETED", resource, obj)
        return obj

    def pod_dir(self, ns, name):
        return os.path.join(self.root, "pods", ns, name)


def fake_ip(seed, prefix="10.244.0."):
    return prefix + str(2 + int(hashlib.sha256(seed.encode()).hexdigest(), 16) % 250)


def make_pod(ns, name, containers=("main",), labels=None, image="docker.io/library/busybox:1.36", stdin=False,
             created=None):
    ts = now_rfc3339(created)
    ip = fake_ip(ns + "/" + name)
    cs = []
    for c in containers:
        spec = {"name": c, "image": image}
        if c == "main":
            spec["ports"] = [{"containerPort": 80, "protocol": "TCP"}]
        spec.update({"resources": {}, "terminationMessagePath": "/dev/termination-log",
                     "terminationMessagePolicy": "File", "imagePullPolicy": "IfNotPresent"})
        if stdin:
            spec["stdin"] = True
        cs.append(spec)
    return {
        "metadata": {"name": name, "namespace": ns, "labels": dict(labels or {"app": name.split("-")[0]})},
        "spec": {
            "containers": cs,
            "restartPolicy": "Always", "terminationGracePeriodSeconds": 30, "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default", "serviceAccount": "default", "nodeName": "node-1",
            "securityContext": {}, "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
                {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300},
            ],
            "priority": 0, "enableServiceLinks": True, "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [
                {"type": t, "status": "True", "lastProbeTime": None, "lastTransitionTime": ts}
                for t in ("PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled")
            ],
            "hostIP": "172.18.0.2", "hostIPs": [{"ip": "172.18.0.2"}], "podIP": ip, "podIPs": [{"ip": ip}],
            "startTime": ts,
            "containerStatuses": [
                {"name": c["name"], "state": {"running": {"startedAt": ts}}, "lastState": {}, "ready": True,
                 "restartCount": 0, "image": image,
                 "imageID": image.rsplit(":", 1)[0] + "@sha256:" + hashlib.sha256(image.encode()).hexdigest(),
                 "containerID": "containerd://" + hashlib.sha256((ns + name + c["name"]).encode()).hexdigest(),
                 "started": True}
                for c in sorted(cs, key=lambda c: c["name"])
            ],
            "qosClass": "BestEffort",
        },
    }


def seed(store, ca_pem):
    t0 = store.started
    for i, ns in enumerate(["default", "dev", "prod"]):
        store.create("namespaces", {"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}},
                                    "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}},
                     created=t0 - 86400 * 3 + i)
    store.create("nodes", {
        "metadata": {"name": "node-1", "labels": {
            "beta.kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "kubernetes.io/hostname": "node-1", "kubernetes.io/os": "linux",
            "node-role.kubernetes.io/control-plane": ""}},
        "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "kubelet is posting ready status"}],
            "addresses": [{"type": "InternalIP", "address": "172.18.0.2"}, {"type": "Hostname", "address": "node-1"}],
            "nodeInfo": {"kernelVersion": os.uname().release, "osImage": "Debian GNU/Linux 12 (bookworm)",
                         "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": SERVER_VERSION["gitVersion"],
                         "kubeProxyVersion": SERVER_VERSION["gitVersion"], "operatingSystem": "linux",
                         "architecture": "amd64"},
        },
    }, created=t0 - 86400 * 3)
    for ns in ["default", "dev", "prod"]:
        store.create("configmaps", {"metadata": {"name": "kube-root-ca.crt", "namespace": ns,
                                                 "annotations": {"kubernetes.io/description": "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions of Kubernetes clusters."}},
                                    "data": {"ca.crt": ca_pem}}, created=t0 - 86400 * 3 + 5)
    store.create("configmaps", {"metadata": {"name": "web-config", "namespace": "dev", "labels": {"app": "web"}},
                                "data": {"LISTEN": ":80", "GREETING": "hello from dev"}}, created=t0 - 7200)
    store.create("secrets", {"metadata": {"name": "web-tls", "namespace": "dev"}, "type": "kubernetes.io/tls",
                             "data": {"tls.crt": base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode(),
                                      "tls.key": base64.b64encode(b"-----BEGIN PRIVATE KEY-----\n").decode()}},
                 created=t0 - 7000)
    store.create("secrets", {"metadata": {"name": "db-password", "namespace": "prod"}, "type": "Opaque",
                             "data": {"password": base64.b64encode(b"s3cr3t-prod").decode()}}, created=t0 - 6000)
    store.create("services", {"metadata": {"name": "kubernetes", "namespace": "default",
                                           "labels": {"component": "apiserver", "provider": "kubernetes"}},
                              "spec": {"ports": [{"name": "https", "protocol": "TCP", "port": 443, "targetPort": 6443}],
                                       "clusterIP": "10.96.0.1", "clusterIPs": ["10.96.0.1"], "type": "ClusterIP",
                                       "sessionAffinity": "None", "ipFamilies": ["IPv4"],
                                       "ipFamilyPolicy": "SingleStack", "internalTrafficPolicy": "Cluster"},
                              "status": {"loadBalancer": {}}}, created=t0 - 86400 * 3)
    store.create("services", {"metadata": {"name": "web", "namespace": "dev", "labels": {"app": "web"}},
                              "spec": {"ports": [{"protocol": "TCP", "port": 80, "targetPort": 80}],
                                       "selector": {"app": "web"}, "clusterIP": "10.96.41.7",
                                       "clusterIPs": ["10.96.41.7"], "type": "ClusterIP", "sessionAffinity": "None",
                                       "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                                       "internalTrafficPolicy": "Cluster"},
                              "status": {"loadBalancer": {}}}, created=t0 - 7200)
    store.create("deployments", {
        "metadata": {"name": "web", "namespace": "dev", "generation": 1, "labels": {"app": "web"},
                     "annotations": {"deployment.kubernetes.io/revision": "1"}},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "main", "image": "docker.io/library/busybox:1.36"}]}},
                 "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
                 "revisionHistoryLimit": 10, "progressDeadlineSeconds": 600},
        "status": {"observedGeneration": 1, "replicas": 2, "updatedReplicas": 2, "readyReplicas": 2,
                   "availableReplicas": 2},
    }, created=t0 - 7200)
    store.create("pods", make_pod("dev", "web-1", ("main", "sidecar"), {"app": "web", "tier": "frontend"}),
                 created=t0 - 7100)
    store.create("pods", make_pod("dev", "web-2", ("main",), {"app": "web", "tier": "frontend"}), created=t0 - 7050)
    store.create("pods", make_pod("prod", "db-1", ("main",), {"app": "db"}, image="docker.io/library/postgres:16"),
                 created=t0 - 5900)
    store.create("pods", make_pod("default", "shell", ("main",), {"app": "shell"}, stdin=True), created=t0 - 600)


# ---- selectors -------------------------------------------------------------------------------------------
def label_matches(selector, labels):
    if not selector:
        return True
    for req in _split_selector(selector):
        req = req.strip()
        if not req:
            continue
        if " in " in req or " notin " in req:
            key, op, rest = req.partition(" notin " if " notin " in req else " in ")
            vals = {v.strip() for v in rest.strip().strip("()").split(",")}
            has = labels.get(key.strip()) in vals
            if (op.strip() == "in") != has:
                return False
        elif "!=" in req:
            k, _, v = req.partition("!=")
            if labels.get(k.strip()) == v.strip():
                return False
        elif "==" in req or "=" in req:
            k, _, v = req.partition("==" if "==" in req else "=")
            if labels.get(k.strip()) != v.strip():
                return False
        elif req.startswith("!"):
            if req[1:].strip() in labels:
                return False
        elif req not in labels:
            return False
    return True


def _split_selector(s):
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    out.append(cur)
    return out


def field_matches(selector, obj):
    if not selector:
        return True
    for req in selector.split(","):
        neg = "!=" in req
        k, _, v = req.partition("!=" if neg else ("==" if "==" in req else "="))
        k, v = k.strip(), v.strip()
        cur = obj
        for part in k.split("."):
            cur = cur.get(part, "") if isinstance(cur, dict) else ""
        if (str(cur) == v) == neg:
            return False
    return True


def unique_names(headers):
    """Header names once each (as first spelt), case-insensitively, as Go's canonical keys."""
    seen, out = set(), []
    for name in headers.keys():
        if name.lower() not in seen:
            seen.add(name.lower())
            out.append(name)
    return out


# ---- media types -------------------------------------------------------------------------------------------
def parse_accept(header):
    out = []
    for part in (header or "").split(","):
        part = part.strip()
        if not part:
            continue
        fields = [f.strip() for f in part.split(";")]
        params = {}
        for f in fields[1:]:
            k, _, v = f.partition("=")
            params[k.strip().lower()] = v.strip()
        out.append((fields[0].lower(), params))
    return out


def negotiate(request, prefer_protobuf):
    """-> ('json', None) | ('table', 'v1'|'v1beta1') | ('partial', 'v1'|'v1beta1'). Protobuf is never
    answered (the real server would): JSON is. With --prefer-protobuf an Accept that lists only
    protobuf is refused with 406, as a server would refuse a type it cannot produce."""
    accepts = parse_accept(request.headers.get("Accept"))
    if not accepts:
        return "json", None
    for mt, params in accepts:
        if mt in ("application/json", "application/*", "*/*"):
            if params.get("as") == "Table" and params.get("g") == "meta.k8s.io" and params.get("v") in ("v1", "v1beta1"):
                return "table", params["v"]
            if params.get("as") in ("PartialObjectMetadata", "PartialObjectMetadataList") and params.get("g") == "meta.k8s.io":
                return "partial", params.get("v", "v1")
            if params.get("as"):
                continue  # a conversion we do not offer: try the next
            return "json", None
        if mt == "application/vnd.kubernetes.protobuf":
            if prefer_protobuf:
                continue
            # we answer JSON where the real server would answer protobuf
            if not params.get("as"):
                return "json", None
            continue
    if prefer_protobuf or all(mt != "application/json" for mt, _ in accepts):
        raise ApiError(406, "NotAcceptable", "only the following media types are accepted: application/json, "
                       "application/yaml, application/vnd.kubernetes.protobuf")
    return "json", None


# ---- the server --------------------------------------------------------------------------------------------
class Fixture:
    def __init__(self, args):
        self.args = args
        self.dir = os.path.abspath(args.dir)
        self.token = open(os.path.join(self.dir, "token")).read().strip()
        self.store = Store(self.dir, time.time())
        self.forwards = {}
        for f in args.forward:
            pod_port, _, local = f.partition("=")
            self.forwards[int(pod_port)] = int(local)
        self.log_file = open(os.path.join(self.dir, "requests.jsonl"), "a", buffering=1)
        self.session_file = open(os.path.join(self.dir, "sessions.jsonl"), "a", buffering=1)
        seed(self.store, open(os.path.join(self.dir, "ca.crt")).read())

    # -- logging
    def write_session(self, rec):
        self.session_file.write(gojson(rec) + "\n")
        self.session_file.flush()

    def log(self, request, status):
        rec = request.get("log")
        if rec is None or rec.get("_written"):
            return
        rec["_written"] = True
        out = {k: v for k, v in rec.items() if not k.startswith("_")}
        out["status"] = status
        self.log_file.write(gojson(out) + "\n")
        self.log_file.flush()

    # -- authentication and impersonation
    def authenticate(self, request):
        sslobj = request.transport.get_extra_info("ssl_object") if request.transport else None
        cert = sslobj.getpeercert() if sslobj else None
        if cert:
            cn, orgs = "", []
            for rdn in cert.get("subject", ()):
                for k, v in rdn:
                    if k == "commonName":
                        cn = v
                    elif k == "organizationName":
                        orgs.append(v)
            der = sslobj.getpeercert(binary_form=True)
            return {"via": "x509", "cn": cn, "o": orgs, "user": cn, "groups": orgs + [AUTHENTICATED],
                    "extra": {"authentication.kubernetes.io/credential-id": ["X509SHA256=" + hashlib.sha256(der).hexdigest()]}}
        auth = request.headers.get("Authorization", "")
        parts = auth.strip().split(" ")
        if len(parts) >= 2 and parts[0].lower() == "bearer":
            tok = parts[-1].strip()
            if tok and hmac.compare_digest(tok.encode(), self.token.encode()):
                return {"via": "token", "user": TOKEN_USER, "groups": [MASTERS, AUTHENTICATED], "extra": {}}
        return None

    def impersonate(self, request, authn):
        h = request.headers
        requested_user = (h.getall("Impersonate-User", []) or [""])[0]
        groups = h.getall("Impersonate-Group", [])
        extras = {}
        for name in unique_names(h):
            if name.lower().startswith("impersonate-extra-"):
                key = urllib.parse.unquote(name[len("impersonate-extra-"):].lower())
                extras.setdefault(key, []).extend(h.getall(name))
        uid = (h.getall("Impersonate-Uid", []) or [""])[0]
        if not (requested_user or groups or extras or uid):
            return None

        def ref(kind, name, apiv="", field="", ns=""):
            return "{%s %s %s  %s  %s}" % (kind, ns, name, apiv, field)

        refs = []
        sa = requested_user.split(":") if requested_user.startswith("system:serviceaccount:") else None
        if requested_user:
            refs.append(("serviceaccounts", ref("ServiceAccount", sa[3], ns=sa[2])) if sa and len(sa) == 4 else
                        ("users", ref("User", requested_user)))
        refs += [("groups", ref("Group", g)) for g in groups]
        for k, vals in extras.items():
            refs += [("userextras/" + k, ref("UserExtra", v, "authentication.k8s.io/v1", k)) for v in vals]
        if uid:
            refs.append(("uids", ref("UID", uid, "authentication.k8s.io/v1")))
        if not requested_user:
            raise internal_error("requested [%s] without impersonating a user" % " ".join(r for _, r in refs))
        if MASTERS not in authn["groups"]:
            resource = refs[0][0]
            name = requested_user if resource != "serviceaccounts" else sa[3]
            ns_part = ' in the namespace "%s"' % sa[2] if resource == "serviceaccounts" else " at the cluster scope"
            msg = 'User "%s" cannot impersonate resource "%s" in API group ""%s' % (authn["user"], resource, ns_part)
            raise ApiError(403, "Forbidden", '%s "%s" is forbidden: %s' % (resource, name, msg),
                           {"name": name, "kind": resource})
        if sa and len(sa) == 4 and not groups:
            groups = ["system:serviceaccounts", "system:serviceaccounts:" + sa[2]]
        groups = list(groups)
        if requested_user != "system:anonymous":
            if AUTHENTICATED not in groups and "system:unauthenticated" not in groups:
                groups.append(AUTHENTICATED)
        elif "system:unauthenticated" not in groups:
            groups.append("system:unauthenticated")
        return {"user": requested_user, "groups": groups, "extra": extras, "uid": uid}

    @web.middleware
    async def middleware(self, request, handler):
        h = request.headers
        upgrade = None
        if "upgrade" in h.get("Connection", "").lower():
            protos = []
            for v in h.getall("Sec-WebSocket-Protocol", []) + h.getall("X-Stream-Protocol-Version", []):
                protos += [p.strip() for p in v.split(",") if p.strip()]
            upgrade = {"upgrade": h.get("Upgrade"), "protocols": protos}
        imp = {}
        for name in unique_names(h):
            if name.lower().startswith("impersonate-"):
                imp[name] = h.getall(name)
        peer = request.transport.get_extra_info("peername") if request.transport else None
        rec = {
            "time": now_rfc3339(), "remote": "%s:%s" % peer[:2] if peer else None, "method": request.method,
            "path": request.path, "query": request.query_string, "identity": None,
            "authorization": h.get("Authorization"), "impersonate": imp, "effective": None,
            "accept": h.get("Accept"), "accept_encoding": h.get("Accept-Encoding"),
            "content_type": h.get("Content-Type"), "user_agent": h.get("User-Agent"), "upgrade": upgrade,
        }
        request["log"] = rec
        try:
            authn = self.authenticate(request)
            if authn is None:
                raise ApiError(401, "Unauthorized", "Unauthorized")
            rec["identity"] = ({"via": "x509", "cn": authn["cn"], "o": authn["o"]} if authn["via"] == "x509"
                               else {"via": "token", "user": authn["user"]})
            eff = self.impersonate(request, authn)
            if eff is None:
                eff = {"user": authn["user"], "groups": authn["groups"], "extra": authn["extra"], "uid": ""}
            rec["effective"] = {"user": eff["user"], "groups": eff["groups"], "extra": eff["extra"], "uid": eff["uid"]}
            request["user"] = eff
            resp = await handler(request)
        except ApiError as e:
            resp = self.json_response(request, e.body, e.code, compress=False)
        except web.HTTPException as e:
            resp = e
        except Exception as e:  # noqa: BLE001 - a fixture answers 500 rather than drop the connection
            import traceback
            traceback.print_exc()
            resp = self.json_response(request, internal_error(str(e)).body, 500, compress=False)
        self.log(request, getattr(resp, "status", None))
        return resp

    def common_headers(self, resp):
        resp.headers["Audit-Id"] = str(uuid.uuid4())
        resp.headers["Cache-Control"] = "no-cache, private"
        resp.headers["X-Kubernetes-Pf-Flowschema-Uid"] = FLOWSCHEMA_UID
        resp.headers["X-Kubernetes-Pf-Prioritylevel-Uid"] = PRIORITYLEVEL_UID

    def json_response(self, request, obj, status=200, compress=True, text=None):
        body = (text if text is not None else gojson(obj) + "\n").encode()
        resp = web.Response(status=status, body=body)
        resp.content_type = "application/json"
        self.common_headers(resp)
        # responsewriters: gzip when asked for and the body is over the threshold (128 KiB there)
        if compress and "gzip" in request.headers.get("Accept-Encoding", "").lower() and len(body) >= self.args.gzip_threshold:
            resp.body = gzip.compress(body, compresslevel=1)
            resp.headers["Content-Encoding"] = "gzip"
            resp.headers["Vary"] = "Accept-Encoding"
        return resp

    # -- routing
    async def dispatch(self, request):
        path = request.path.rstrip("/") or "/"
        if path == "/version":
            return self.json_response(request, None, text=json.dumps(SERVER_VERSION, indent=2))
        if path in ("/healthz", "/livez", "/readyz"):
            resp = web.Response(text="ok")
            return resp
        if path == "/api":
            return self.json_response(request, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": [
                {"clientCIDR": "0.0.0.0/0", "serverAddress": "172.18.0.2:6443"}]})
        if path == "/apis":
            groups = []
            for g in ("apps", "authentication.k8s.io"):
                gv = {"groupVersion": g + "/v1", "version": "v1"}
                groups.append({"name": g, "versions": [gv], "preferredVersion": gv})
            return self.json_response(request, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
        if path == "/api/v1":
            return self.json_response(request, {"kind": "APIResourceList", "groupVersion": "v1",
                                                "resources": resource_list("")})
        if path in ("/apis/apps", "/apis/authentication.k8s.io"):
            g = path.split("/")[2]
            gv = {"groupVersion": g + "/v1", "version": "v1"}
            return self.json_response(request, {"kind": "APIGroup", "apiVersion": "v1", "name": g, "versions": [gv],
                                                "preferredVersion": gv})
        if path in ("/apis/apps/v1", "/apis/authentication.k8s.io/v1"):
            g = path.split("/")[2]
            return self.json_response(request, {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": g + "/v1",
                                                "resources": resource_list(g)})
        if path == "/apis/authentication.k8s.io/v1/selfsubjectreviews":
            if request.method != "POST":
                raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
            return self.whoami(request)
        if path.startswith("/fixture/pods/"):
            return await self.fixture_pod(request, path)
        segs = None
        group = ""
        if path.startswith("/api/v1/"):
            segs = path[len("/api/v1/"):].split("/")
        elif path.startswith("/apis/apps/v1/"):
            segs, group = path[len("/apis/apps/v1/"):].split("/"), "apps"
        if segs is None:
            raise no_such_path()
        ns = name = sub = None
        if segs[0] == "namespaces" and len(segs) >= 3:
            ns, resource = segs[1], segs[2]
            name = segs[3] if len(segs) > 3 else None
            sub = segs[4] if len(segs) > 4 else None
            if len(segs) > 5:
                raise no_such_path()
        elif segs[0] == "namespaces" and len(segs) == 2 and group == "":
            resource, name = "namespaces", segs[1]
        else:
            resource = segs[0]
            name = segs[1] if len(segs) > 1 else None
            sub = segs[2] if len(segs) > 2 else None
            if len(segs) > 3:
                raise no_such_path()
        d = KINDS.get(resource)
        if d is None or d["group"] != group or (ns is not None and not d["namespaced"]):
            raise no_such_path()
        if sub:
            if resource == "pods" and sub in ("exec", "attach", "portforward", "log"):
                return await self.pod_subresource(request, ns, name, sub)
            if sub == "status" and request.method == "GET":
                obj = self.store.get(resource, ns, name)
                if obj is None:
                    raise not_found(resource, name, group)
                return self.object_response(request, resource, obj)
            raise no_such_path()
        m = request.method
        if name is None:
            if m == "GET":
                if parse_bool(request.query.get("watch", "")):
                    return await self.watch(request, resource, ns)
                return self.list(request, resource, ns)
            if m == "POST":
                return await self.create(request, resource, ns)
            if m == "DELETE":
                return self.delete_collection(request, resource, ns)
        else:
            if m == "GET":
                obj = self.store.get(resource, ns, name)
                if obj is None:
                    raise not_found(resource, name, group)
                return self.object_response(request, resource, obj)
            if m == "DELETE":
                return self.delete(request, resource, ns, name)
            if m in ("PATCH", "PUT"):
                return await self.patch(request, resource, ns, name)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    # -- objects
    def with_type(self, resource, obj):
        d = KINDS[resource]
        return {"kind": d["kind"], "apiVersion": d["apiVersion"], **obj}

    def table(self, request, resource, objs, version, list_rv=None, headers=True):
        d = KINDS[resource]
        include = request.query.get("includeObject", "Metadata")
        rows = []
        for o in objs:
            if include == "Object":
                ob = self.with_type(resource, o)
            elif include == "None":
                ob = None
            else:
                ob = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + version, "metadata": o["metadata"]}
            rows.append({"cells": d["cells"](o), "object": ob})
        cols = d["columns"]
        rv = list_rv if list_rv is not None else (objs[0]["metadata"]["resourceVersion"] if objs else str(self.store.rv))
        return {"kind": "Table", "apiVersion": "meta.k8s.io/" + version, "metadata": {"resourceVersion": rv},
                "columnDefinitions": cols if headers else None, "rows": rows}

    def object_response(self, request, resource, obj, status=200):
        kind, version = negotiate(request, self.args.prefer_protobuf)
        if kind == "table":
            return self.json_response(request, self.table(request, resource, [obj], version), status)
        if kind == "partial":
            return self.json_response(request, {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + version,
                                                "metadata": obj["metadata"]}, status)
        return self.json_response(request, self.with_type(resource, obj), status)

    def select(self, request, resource, ns):
        objs = self.store.list(resource, ns)
        ls, fs = request.query.get("labelSelector", ""), request.query.get("fieldSelector", "")
        return [o for o in objs if label_matches(ls, o["metadata"].get("labels", {})) and field_matches(fs, o)]

    def list(self, request, resource, ns):
        kind, version = negotiate(request, self.args.prefer_protobuf)
        objs = self.select(request, resource, ns)
        rv = str(self.store.rv)
        if kind == "table":
            return self.json_response(request, self.table(request, resource, objs, version, list_rv=rv))
        if kind == "partial":
            return self.json_response(request, {"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/" + version,
                                                "metadata": {"resourceVersion": rv},
                                                "items": [{"metadata": o["metadata"]} for o in objs]})
        d = KINDS[resource]
        return self.json_response(request, {"kind": d["kind"] + "List", "apiVersion": d["apiVersion"],
                                            "metadata": {"resourceVersion": rv}, "items": objs})

    async def read_body(self, request):
        try:
            raw = await request.read()
            return json.loads(raw or b"{}")
        except ValueError as e:
            raise bad_request("the object provided is unrecognized: %s" % e)

    async def create(self, request, resource, ns, body=None):
        d = KINDS[resource]
        obj = body if body is not None else await self.read_body(request)
        obj.pop("kind", None)
        obj.pop("apiVersion", None)
        md = obj.setdefault("metadata", {})
        if not md.get("name") and md.get("generateName"):
            md["name"] = md["generateName"] + "".join(random.choice("bcdfghjklmnpqrstvwxz2456789") for _ in range(5))
        if not md.get("name"):
            raise ApiError(422, "Invalid", '%s "" is invalid: metadata.name: Required value: name or generateName is required'
                           % d["kind"], {"kind": d["kind"], "causes": [{"reason": "FieldValueRequired", "message":
                                         "Required value: name or generateName is required", "field": "metadata.name"}]})
        if d["namespaced"]:
            if md.get("namespace") and md["namespace"] != ns:
                raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
            md["namespace"] = ns
            if self.store.get("namespaces", None, ns) is None:
                raise not_found("namespaces", ns)
        if self.store.get(resource, ns, md["name"]) is not None:
            raise ApiError(409, "AlreadyExists", '%s "%s" already exists' % (resource, md["name"]),
                           {"name": md["name"], "kind": resource})
        if resource == "pods":
            full = make_pod(ns, md["name"], [c.get("name", "main") for c in obj.get("spec", {}).get("containers", [])]
                            or ("main",), md.get("labels") or {},
                            image=(obj.get("spec", {}).get("containers") or [{}])[0].get("image", "docker.io/library/busybox:1.36"))
            full["metadata"].update({k: v for k, v in md.items() if k not in ("name", "namespace")})
            full["metadata"]["labels"] = md.get("labels") or {}
            if not full["metadata"]["labels"]:
                del full["metadata"]["labels"]
            obj = full
        if parse_bool(request.query.get("dryRun", "")) or request.query.get("dryRun") == "All":
            return self.object_response(request, resource, obj, 201)
        self.store.create(resource, obj)
        return self.object_response(request, resource, obj, 201)

    def delete(self, request, resource, ns, name):
        obj = self.store.get(resource, ns, name)
        if obj is None:
            raise not_found(resource, name, KINDS[resource]["group"])
        if resource == "pods":
            # graceful deletion: the real server marks the pod (a MODIFIED event, "Terminating")
            # and answers with it; the kubelet would remove it after the grace period, here it
            # is removed at once (DELETED)
            marked = copy.deepcopy(obj)
            grace = 30
            if request.query.get("gracePeriodSeconds", "").isdigit():
                grace = int(request.query["gracePeriodSeconds"])
            marked["metadata"]["deletionTimestamp"] = now_rfc3339(time.time() + grace)
            marked["metadata"]["deletionGracePeriodSeconds"] = grace
            self.store.update(resource, marked)
            self.store.delete(resource, ns, name)
            return self.json_response(request, self.with_type(resource, marked))
        self.store.delete(resource, ns, name)
        return self.json_response(request, status_body(0, None, None, {"name": name, "kind": resource,
                                                                         "uid": obj["metadata"]["uid"]}, "Success"))

    def delete_collection(self, request, resource, ns):
        d = KINDS[resource]
        objs = self.select(request, resource, ns)
        for o in objs:
            self.store.delete(resource, o["metadata"].get("namespace"), o["metadata"]["name"])
        return self.json_response(request, {"kind": d["kind"] + "List", "apiVersion": d["apiVersion"],
                                            "metadata": {"resourceVersion": str(self.store.rv)}, "items": objs})

    async def patch(self, request, resource, ns, name):
        obj = self.store.get(resource, ns, name)
        if obj is None:
            raise not_found(resource, name, KINDS[resource]["group"])
        body = await self.read_body(request)

        def merge(target, patch):
            for k, v in patch.items():
                if k.startswith("$"):
                    continue
                if v is None:
                    target.pop(k, None)
                elif isinstance(v, dict) and isinstance(target.get(k), dict):
                    merge(target[k], v)
                else:
                    target[k] = copy.deepcopy(v)

        new = copy.deepcopy(obj)
        if request.method == "PUT":
            body.pop("kind", None)
            body.pop("apiVersion", None)
            keep = {k: new["metadata"][k] for k in ("uid", "creationTimestamp", "namespace", "name") if k in new["metadata"]}
            new = body
            new.setdefault("metadata", {}).update(keep)
        elif isinstance(body, dict):
            merge(new, body)
        else:
            raise ApiError(415, "UnsupportedMediaType", "JSON patch is not supported by this fixture")
        self.store.update(resource, new)
        return self.object_response(request, resource, new)

    def whoami(self, request):
        u = request["user"]
        info = {"username": u["user"]}
        if u.get("uid"):
            info["uid"] = u["uid"]
        info["groups"] = u["groups"]
        if u.get("extra"):
            info["extra"] = u["extra"]
        body = {"kind": "SelfSubjectReview", "apiVersion": "authentication.k8s.io/v1",
                "metadata": {"creationTimestamp": now_rfc3339()}, "status": {"userInfo": info}}
        return self.json_response(request, body, 201)

    async def fixture_pod(self, request, path):
        parts = path[len("/fixture/pods/"):].split("/")
        if len(parts) != 2 or request.method not in ("POST", "DELETE"):
            raise no_such_path()
        ns, name = parts
        if request.method == "DELETE":
            return self.delete(request, "pods", ns, name)
        body = await self.read_body(request) if request.can_read_body else {}
        body.setdefault("metadata", {})["name"] = name
        body["metadata"].setdefault("labels", {"app": name.split("-")[0]})
        return await self.create(request, "pods", ns, body)

    # -- watch
    async def watch(self, request, resource, ns):
        kind, version = negotiate(request, self.args.prefer_protobuf)
        rv_param = request.query.get("resourceVersion", "")
        ls, fs = request.query.get("labelSelector", ""), request.query.get("fieldSelector", "")
        try:
            timeout = float(request.query.get("timeoutSeconds", "")) if request.query.get("timeoutSeconds") else 1800.0
        except ValueError:
            raise bad_request("invalid timeoutSeconds")
        queue = asyncio.Queue()

        def matches(r, obj_ns, obj):
            return (r == resource and (ns is None or obj_ns == ns)
                    and label_matches(ls, obj["metadata"].get("labels", {})) and field_matches(fs, obj))

        def on_event(etype, r, obj_ns, obj):
            if matches(r, obj_ns, obj):
                queue.put_nowait((etype, copy.deepcopy(obj)))

        initial = []
        if rv_param in ("", "0"):
            initial = [("ADDED", copy.deepcopy(o)) for o in self.select(request, resource, ns)]
        else:
            try:
                since = int(rv_param)
            except ValueError:
                raise bad_request('invalid resource version: %s' % rv_param)
            if since > self.store.rv:
                pass  # a future version: wait for it, as the watch cache does (briefly)
            initial = [(t, copy.deepcopy(o)) for (rv, t, r, ons, o) in self.store.history
                       if rv > since and matches(r, ons, o)]
        self.store.watchers.add(on_event)
        resp = web.StreamResponse(status=200)
        resp.content_type = "application/json"
        self.common_headers(resp)
        resp.enable_chunked_encoding()
        self.log(request, 200)
        first = [True]

        def encode(etype, obj):
            if kind == "table":
                o = self.table(request, resource, [obj], version, headers=first[0])
                first[0] = False
            elif kind == "partial":
                o = {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/" + version, "metadata": obj["metadata"]}
            else:
                o = self.with_type(resource, obj)
            return (gojson({"type": etype, "object": o}) + "\n").encode()

        try:
            await resp.prepare(request)
            for etype, obj in initial:
                await resp.write(encode(etype, obj))
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:
                    etype, obj = await asyncio.wait_for(queue.get(), min(left, 1.0))
                except asyncio.TimeoutError:
                    if request.transport is None or request.transport.is_closing():
                        break
                    continue
                await resp.write(encode(etype, obj))
            await resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass
        finally:
            self.store.watchers.discard(on_event)
        return resp

    # -- exec, attach, port-forward, log
    async def pod_subresource(self, request, ns, name, sub):
        pod = self.store.get("pods", ns, name)
        if pod is None:
            raise not_found("pods", name)
        q = request.query
        containers = [c["name"] for c in pod["spec"]["containers"]]
        if sub == "log":
            return await self.pod_log(request, pod, containers)
        if request.method not in ("GET", "POST"):
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        h = request.headers
        is_upgrade = "upgrade" in h.get("Connection", "").lower()
        upgrade = h.get("Upgrade", "").lower()
        is_ws = is_upgrade and upgrade == "websocket"
        is_spdy = is_upgrade and "spdy/3.1" in upgrade
        ctx = {
            "namespace": ns, "pod": name, "pod_id": name, "uid": pod["metadata"]["uid"],
            "netns": "/var/run/netns/cni-" + str(uuid.UUID(hashlib.md5(pod["metadata"]["uid"].encode()).hexdigest())),
            "user": request["user"]["user"], "cwd": self.store.pod_dir(ns, name),
            "window_updates": not self.args.no_window_updates, "forwards": self.forwards, "kind": sub,
        }
        os.makedirs(ctx["cwd"], exist_ok=True)
        ws_protos = []
        for v in h.getall("Sec-WebSocket-Protocol", []):
            ws_protos += [p.strip() for p in v.split(",") if p.strip()]
        spdy_protos = []
        for v in h.getall("X-Stream-Protocol-Version", []):
            spdy_protos += [p.strip() for p in v.split(",") if p.strip()]

        if sub == "portforward":
            return await self.portforward(request, ctx, is_ws, is_spdy, ws_protos, spdy_protos)

        # exec / attach: the options
        container = q.get("container", "")
        if not container:
            if len(containers) == 1:
                container = containers[0]
            else:
                raise bad_request("a container name must be specified for pod %s, choose one of: [%s]"
                                  % (name, " ".join(containers)))
        if container not in containers:
            raise bad_request("container %s is not valid for pod %s" % (container, name))
        opts = {k: parse_bool(q.get(k, "")) for k in ("stdin", "stdout", "stderr", "tty")}
        if sub == "exec":
            argv = q.getall("command", [])
            if not argv:
                raise ApiError(422, "Invalid", 'PodExecOptions "" is invalid: command: Required value',
                               {"kind": "PodExecOptions", "causes": [{"reason": "FieldValueRequired",
                                                                       "message": "Required value", "field": "command"}]})
        else:
            argv = ["/bin/sh"]
        if not (opts["stdin"] or opts["stdout"] or opts["stderr"]):
            raise bad_request("you must specify at least 1 of stdin, stdout, stderr")
        if opts["tty"] and opts["stderr"]:
            opts["stderr"] = False  # the kubelet: "Access to exec with tty and stderr is not supported"
        ctx["container"] = container
        ctx["env"] = {
            "PATH": os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"),
            "HOSTNAME": name, "HOME": ctx["cwd"], "KUBERNETES_SERVICE_HOST": "10.96.0.1",
            "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        }
        if opts["tty"]:
            ctx["env"]["TERM"] = "xterm"
        if is_ws:
            proto = self.choose_ws_exec_protocol(ws_protos)
            if proto is None:
                return self.ws_refused(request, ws_protos)
            self.log(request, 101)
            return await streaming.exec_websocket(request, ctx, proto, opts, argv, self.write_session)
        if is_spdy:
            if self.args.no_spdy:
                raise bad_request("unable to upgrade: SPDY/3.1 is not supported by this server; use WebSockets")
            negotiated = self.spdy_handshake(request, spdy_protos, streaming.EXEC_SPDY_PROTOCOLS)
            if isinstance(negotiated, web.Response):
                return negotiated
            self.log(request, 101)
            return await streaming.exec_spdy(request, ctx, negotiated, opts, argv, self.write_session)
        raise bad_request("Upgrade request required")

    def choose_ws_exec_protocol(self, requested):
        if "v5.channel.k8s.io" in requested and not self.args.no_websocket:
            return "v5.channel.k8s.io"  # kube-apiserver's StreamTranslator
        for p in requested or [""]:
            if p in streaming.EXEC_WS_KUBELET_PROTOCOLS:
                return p  # the kubelet's wsstream, first client preference wins
        return None

    def ws_refused(self, request, requested):
        # x/net/websocket's answer to a handshake the kubelet's wsstream refused: 403, the error as text
        supported = " ".join(streaming.EXEC_WS_KUBELET_PROTOCOLS)
        resp = web.Response(status=403, text="requested protocol(s) are not supported: [%s]; supports [%s]"
                            % (" ".join(requested), supported))
        resp.force_close()
        return resp

    def spdy_handshake(self, request, client, server):
        """httpstream.Handshake as the kubelet answers it."""
        if not client:
            return self.go_http_error(400, "unable to upgrade: X-Stream-Protocol-Version is required")
        for c in client:
            if c in server:
                return c
        resp = self.go_http_error(403, "unable to upgrade: unable to negotiate protocol: client supports [%s], server "
                                       "accepts [%s]" % (" ".join(client), " ".join(server)))
        for s in server:
            resp.headers.add("X-Accepted-Stream-Protocol-Versions", s)
        return resp

    @staticmethod
    def go_http_error(code, text):
        """net/http's http.Error"""
        resp = web.Response(status=code, text=text + "\n")
        resp.content_type = "text/plain"
        resp.charset = "utf-8"
        resp.headers["X-Content-Type-Options"] = "nosniff"
        return resp

    async def portforward(self, request, ctx, is_ws, is_spdy, ws_protos, spdy_protos):
        if is_ws:
            tunnel = [p for p in ws_protos if p.startswith(streaming.TUNNEL_PREFIX) and p.endswith(".k8s.io")]
            if tunnel and not self.args.no_websocket:
                inner = [p[len(streaming.TUNNEL_PREFIX):] for p in tunnel]
                negotiated = self.spdy_handshake(request, inner, streaming.PORTFORWARD_SPDY_PROTOCOLS)
                if isinstance(negotiated, web.Response):
                    return negotiated  # the tunnel passes the kubelet's refusal through
                self.log(request, 101)
                return await streaming.portforward_tunnel(request, ctx, streaming.TUNNEL_PREFIX + negotiated,
                                                          self.write_session)
            # the kubelet's own WebSocket port-forward (what an older API server proxies to)
            ports = []
            for v in request.query.getall("ports", []):
                for p in v.split(","):
                    if not p.isdigit() or not 0 < int(p) < 65536:
                        return self.go_http_error(400, 'unable to parse "%s" as a port' % v)
                    ports.append(int(p))
            if not ports:
                return self.go_http_error(400, 'query parameter "port" is required')
            proto = None
            for p in ws_protos or [""]:
                if p in ("", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"):
                    proto = p
                    break
            if proto is None:
                resp = web.Response(status=403, text="requested protocol(s) are not supported: [%s]; supports "
                                    "[ v4.channel.k8s.io v4.base64.channel.k8s.io]" % " ".join(ws_protos))
                resp.force_close()
                return resp
            self.log(request, 101)
            return await streaming.portforward_websocket_v4(request, ctx, proto, ports, self.write_session)
        if is_spdy:
            if self.args.no_spdy:
                raise bad_request("unable to upgrade: SPDY/3.1 is not supported by this server; use WebSockets")
            negotiated = self.spdy_handshake(request, spdy_protos, streaming.PORTFORWARD_SPDY_PROTOCOLS)
            if isinstance(negotiated, web.Response):
                return negotiated
            self.log(request, 101)
            return await streaming.portforward_spdy(request, ctx, negotiated, self.write_session)
        raise bad_request("Upgrade request required")

    async def pod_log(self, request, pod, containers):
        container = request.query.get("container") or (containers[0] if len(containers) == 1 else "")
        if not container:
            raise bad_request("a container name must be specified for pod %s, choose one of: [%s]"
                              % (pod["metadata"]["name"], " ".join(containers)))
        if container not in containers:
            raise bad_request("container %s is not valid for pod %s" % (container, pod["metadata"]["name"]))
        md = pod["metadata"]
        lines = ["%s %s/%s/%s: started" % (md["creationTimestamp"], md["namespace"], md["name"], container),
                 "%s %s/%s/%s: ready" % (md["creationTimestamp"], md["namespace"], md["name"], container)]
        resp = web.StreamResponse(status=200)
        resp.content_type = "text/plain"
        self.common_headers(resp)
        self.log(request, 200)
        await resp.prepare(request)
        await resp.write(("\n".join(lines) + "\n").encode())
        if parse_bool(request.query.get("follow", "")):
            while request.transport is not None and not request.transport.is_closing():
                await asyncio.sleep(0.5)
        await resp.write_eof()
        return resp


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--no-websocket", action="store_true",
                    help="act as a cluster before 1.30: the v5 and SPDY-tunnelling WebSocket protocols are refused "
                         "as the kubelet refused them (the legacy v4 WebSocket protocols still work)")
    ap.add_argument("--no-spdy", action="store_true", help="refuse SPDY upgrades (400) like a WebSocket-only server")
    ap.add_argument("--forward", action="append", default=[], metavar="POD_PORT=LOCAL_PORT")
    ap.add_argument("--prefer-protobuf", action="store_true",
                    help="answer 406 to an Accept that lists only protobuf (else JSON is answered)")
    ap.add_argument("--gzip-threshold", type=int, default=0,
                    help="gzip responses of at least this many bytes when asked (the real server: 131072)")
    ap.add_argument("--no-window-updates", action="store_true",
                    help="send no SPDY WINDOW_UPDATE frames (as spdystream: byte-exact)")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    make_credentials(args.dir)
    fixture = Fixture(args)

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(os.path.join(args.dir, "server.crt"), os.path.join(args.dir, "server.key"))
    ctx.load_verify_locations(os.path.join(args.dir, "ca.crt"))
    ctx.verify_mode = ssl.CERT_OPTIONAL  # as kube-apiserver: VerifyClientCertIfGiven
    ctx.set_alpn_protocols(["http/1.1"])  # no HTTP/2 here (the real server offers h2 too)

    app = web.Application(middlewares=[fixture.middleware], client_max_size=16 << 20)
    app.router.add_route("*", "/{tail:.*}", fixture.dispatch)

    async def run():
        runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=2)
        await runner.setup()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", args.port))
        sock.listen(128)
        site = web.SockSite(runner, sock, ssl_context=ctx)
        await site.start()
        port = sock.getsockname()[1]
        write_kubeconfigs(args.dir, port)
        sys.stdout.write(json.dumps({"port": port}) + "\n")
        sys.stdout.flush()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        streaming.kill_all()
        await runner.cleanup()

    asyncio.run(run())


if __name__ == "__main__":
    main()
