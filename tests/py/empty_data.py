#!/usr/bin/env python3
"""A `-L` forward through the proxy that carries zero-length CHANNEL_DATA and
CHANNEL_EXTENDED_DATA, for tests/tests/forward_empty_data.rs. RFC 4254 allows empty data and
OpenSSH never sends it; neither can OpenSSH's nor russh's client API, so this is paramiko, with
the two messages written raw (`Transport._send_user_message`).

usage: empty_data.py PROXY_PORT USER KEY KNOWN_HOSTS NODE LOGIN ECHO_PORT

As `ssh -J proxy LOGIN@NODE -L ...` does: the outer connection to 127.0.0.1:PROXY_PORT as USER,
a direct-tcpip channel to NODE, the inner connection over it as LOGIN, both authenticated with
KEY and its Sallyport certificate KEY-cert.pub, each server's host certificate checked against
KNOWN_HOSTS' @cert-authority lines. On the inner connection, a direct-tcpip channel to the echo
server on 127.0.0.1:ECHO_PORT: "hello" and its echo, then an empty CHANNEL_DATA and an empty
CHANNEL_EXTENDED_DATA, then "world", whose echo must still come (the forward did not take the
empty data for end of file); then a second channel, "again" and its echo (the connection is not
stalled). Each step is printed on stdout; then `READY`, and the connections stay open until a
line arrives on stdin (the test checks meanwhile that the echo server saw no end of file).
A failed step prints `FAIL: why` and exits 1. Needs paramiko (scripts/test installs it).
"""
import base64
import fnmatch
import socket
import sys
import time

import paramiko
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from paramiko.common import cMSG_CHANNEL_DATA, cMSG_CHANNEL_EXTENDED_DATA

# How long one echo may take: the forward answers in milliseconds when it works.
TIMEOUT = 10.0
HOST_CERT_TYPE = "ssh-ed25519-cert-v01@openssh.com"


class Fail(Exception):
    pass


def step(what):
    print(what, flush=True)


def host_cas(known_hosts):
    """The Ed25519 CA keys of KNOWN_HOSTS' @cert-authority lines: (host patterns, key blob)."""
    cas = []
    for line in open(known_hosts):
        parts = line.split()
        if len(parts) >= 4 and parts[0] == "@cert-authority" and parts[2] == "ssh-ed25519":
            cas.append((parts[1].split(","), base64.b64decode(parts[3])))
    if not cas:
        raise Fail(f"no @cert-authority line in {known_hosts}")
    return cas


def matches(patterns, host):
    return any(fnmatch.fnmatchcase(host, p) for p in patterns if not p.startswith("!"))


def check_host_cert(transport, cas, host):
    """As OpenSSH's StrictHostKeyChecking with @cert-authority: the server's host key is a host
    certificate for `host`, valid now, signed by a CA trusted for `host`. (paramiko checked that
    the server holds the certified key: it signed the key exchange with it.)"""
    key = transport.get_remote_server_key()
    blob = key.public_blob.key_blob if key.public_blob else None
    if blob is None:
        raise Fail(f"{host}: the server offered a plain key, not a host certificate")
    m = paramiko.Message(blob)
    if m.get_text() != HOST_CERT_TYPE:
        raise Fail(f"{host}: host key is not an {HOST_CERT_TYPE}")
    m.get_string()  # nonce
    m.get_string()  # the certified key
    m.get_int64()  # serial
    if m.get_int() != 2:
        raise Fail(f"{host}: not a host certificate")
    m.get_string()  # key id
    principals = paramiko.Message(m.get_string())
    names = []
    while principals.get_remainder():
        names.append(principals.get_text())
    after, before = m.get_int64(), m.get_int64()
    m.get_string()  # critical options
    m.get_string()  # extensions
    m.get_string()  # reserved
    ca = m.get_string()
    signed = m.get_so_far()
    sig = paramiko.Message(m.get_string())
    if host not in names:
        raise Fail(f"{host}: not among the certificate's principals {names}")
    if not after <= time.time() < before:
        raise Fail(f"{host}: certificate not valid now ({after}..{before})")
    trusted = [blob for patterns, blob in cas if matches(patterns, host)]
    if ca not in trusted:
        raise Fail(f"{host}: certificate signed by a CA not trusted for it")
    if sig.get_text() != "ssh-ed25519":
        raise Fail(f"{host}: certificate signature is not Ed25519")
    ca_key = paramiko.Message(ca)
    ca_key.get_text()
    try:
        Ed25519PublicKey.from_public_bytes(ca_key.get_binary()).verify(sig.get_binary(), signed)
    except InvalidSignature:
        raise Fail(f"{host}: certificate signature does not verify") from None


def connect(sock, user, key, cas, host):
    t = paramiko.Transport(sock)
    # Only a host certificate will do (OpenSSH asks for one first when it has a CA for the host).
    t.get_security_options().key_types = (HOST_CERT_TYPE,)
    t.start_client(timeout=TIMEOUT)
    check_host_cert(t, cas, host)
    t.auth_publickey(user, key)
    if not t.is_authenticated():
        raise Fail(f"{user}@{host}: not authenticated")
    return t


def recv_exactly(chan, n, what):
    data = b""
    try:
        while len(data) < n:
            got = chan.recv(n - len(data))
            if not got:
                raise Fail(f"{what}: the channel was closed after {data!r}")
            data += got
    except socket.timeout:
        raise Fail(f"{what}: no echo within {TIMEOUT:.0f} s (got {data!r})") from None
    return data


def echo(chan, payload, what):
    chan.sendall(payload)
    got = recv_exactly(chan, len(payload), what)
    if got != payload:
        raise Fail(f"{what}: echoed {got!r}, sent {payload!r}")
    step(f"echoed {payload.decode()}")


def forward(inner, echo_port):
    chan = inner.open_channel(
        "direct-tcpip", ("127.0.0.1", echo_port), ("127.0.0.1", 40000), timeout=TIMEOUT
    )
    chan.settimeout(TIMEOUT)
    return chan


def main():
    proxy_port, user, key_path, known_hosts, node, login, echo_port = sys.argv[1:8]
    proxy_port, echo_port = int(proxy_port), int(echo_port)
    key = paramiko.Ed25519Key.from_private_key_file(key_path)
    key.load_certificate(key_path + "-cert.pub")
    cas = host_cas(known_hosts)

    sock = socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT)
    outer = connect(sock, user, key, cas, "127.0.0.1")
    step("outer connection authenticated")
    jump = outer.open_channel("direct-tcpip", (node, 22), ("127.0.0.1", 0), timeout=TIMEOUT)
    inner = connect(jump, login, key, cas, node)
    step("inner connection authenticated")

    chan = forward(inner, echo_port)
    echo(chan, b"hello", "hello")

    m = paramiko.Message()
    m.add_byte(cMSG_CHANNEL_DATA)
    m.add_int(chan.remote_chanid)
    m.add_string(b"")
    inner._send_user_message(m)
    m = paramiko.Message()
    m.add_byte(cMSG_CHANNEL_EXTENDED_DATA)
    m.add_int(chan.remote_chanid)
    m.add_int(1)  # SSH_EXTENDED_DATA_STDERR
    m.add_string(b"")
    inner._send_user_message(m)
    step("sent empty data and empty extended data")

    echo(chan, b"world", "world after the empty data")
    second = forward(inner, echo_port)
    echo(second, b"again", "a second channel after the empty data")

    step("READY")
    sys.stdin.readline()
    for c in (second, chan):
        c.close()
    inner.close()
    outer.close()


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print(f"FAIL: {e}", flush=True)
        sys.exit(1)
