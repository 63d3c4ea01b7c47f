#!/usr/bin/env python3
# Checks the WebSocket protocols of the API server fixture (apiserver.py) that kubectl 1.32 does
# not speak but other clients (the Python and Java clients, older tools) do: exec over
# v4.channel.k8s.io, v4.base64.channel.k8s.io and channel.k8s.io, a v3 request refused, and the
# kubelet's WebSocket port-forward (?ports=). Used by check.sh:
#   python3 tests/kube/wsclient_check.py DIR [HTTP_PORT]
# Prints PASS/FAIL lines; exits non-zero on a failure.

import asyncio
import base64
import json
import os
import ssl
import struct
import sys
import urllib.parse

import aiohttp

DIR = sys.argv[1]
HTTP_PORT = int(sys.argv[2]) if len(sys.argv) > 2 else None
PORT = int(open(os.path.join(DIR, "kubeconfig")).read().split("https://127.0.0.1:")[1].split('"')[0])
failed = 0


def result(name, ok, why=""):
    global failed
    print(("PASS " if ok else "FAIL ") + name + ("" if ok else ": " + why))
    if not ok:
        failed += 1


def ssl_ctx():
    ctx = ssl.create_default_context(cafile=os.path.join(DIR, "ca.crt"))
    ctx.load_cert_chain(os.path.join(DIR, "agent.crt"), os.path.join(DIR, "agent.key"))
    return ctx


async def exec_ws(session, base, protocol, command, stdin=None):
    params = [("command", c) for c in command] + [("stdout", "true"), ("stderr", "true")]
    if stdin is not None:
        params.append(("stdin", "true"))
    q = urllib.parse.urlencode(params)
    url = base + "/api/v1/namespaces/dev/pods/web-2/exec?" + q
    out = {1: b"", 2: b"", 3: b""}
    first = None
    async with session.ws_connect(url, protocols=[protocol] if protocol else [], ssl=ssl_ctx()) as ws:
        got = ws.protocol
        if stdin is not None:
            if "base64" in protocol:
                await ws.send_str("0" + base64.b64encode(stdin).decode())
            else:
                await ws.send_bytes(b"\x00" + stdin)
        async for msg in ws:
            if msg.type == aiohttp.WSMsgType.BINARY:
                ch, data = msg.data[0], msg.data[1:]
            elif msg.type == aiohttp.WSMsgType.TEXT:
                ch, data = ord(msg.data[0]) - ord("0"), base64.b64decode(msg.data[1:])
            else:
                break
            if first is None:
                first = (ch, data)
            out[ch] += data
    return got, first, out


async def main():
    base = "https://127.0.0.1:%d" % PORT
    async with aiohttp.ClientSession() as s:
        got, first, out = await exec_ws(s, base, "v4.channel.k8s.io", ["sh", "-c", "echo out; echo err >&2; exit 7"])
        status = json.loads(out[3]) if out[3] else {}
        result("v4.channel.k8s.io exec", got == "v4.channel.k8s.io" and first == (1, b"") and out[1] == b"out\n"
               and out[2] == b"err\n" and status.get("reason") == "NonZeroExitCode"
               and status["details"]["causes"] == [{"reason": "ExitCode", "message": "7"}]
               and status["message"] == "command terminated with non-zero exit code: error executing command "
                                        "[sh -c echo out; echo err >&2; exit 7], exit code 7", repr((got, first, out)))
        # (v4 has no way to close stdin: the command must end by itself)
        got, first, out = await exec_ws(s, base, "v4.base64.channel.k8s.io", ["head", "-c", "3"], stdin=b"abc")
        result("v4.base64.channel.k8s.io exec (text frames, stdin)", got == "v4.base64.channel.k8s.io"
               and first == (1, b"") and out[1] == b"abc", repr((got, first, out)))
        got, first, out = await exec_ws(s, base, "v4.base64.channel.k8s.io", ["echo", "b64"])
        result("v4.base64 exec output and Success", out[1] == b"b64\n" and json.loads(out[3]) == {
            "metadata": {}, "status": "Success"}, repr(out))
        got, first, out = await exec_ws(s, base, "channel.k8s.io", ["sh", "-c", "exit 2"])
        result("channel.k8s.io (v1): failure as text", got == "channel.k8s.io" and out[3].startswith(
            b"command terminated with non-zero exit code"), repr((got, out)))
        try:
            await exec_ws(s, base, "v3.channel.k8s.io", ["true"])
            result("v3.channel.k8s.io WebSocket refused", False, "accepted")
        except aiohttp.WSServerHandshakeError as e:
            result("v3.channel.k8s.io WebSocket refused (403)", e.status == 403, str(e))

        if HTTP_PORT:
            url = base + "/api/v1/namespaces/dev/pods/web-1/portforward?ports=80"
            async with s.ws_connect(url, protocols=["v4.channel.k8s.io"], ssl=ssl_ctx()) as ws:
                hello = [await ws.receive() for _ in range(2)]
                ok = [m.data for m in hello] == [b"\x00" + struct.pack("<H", 80), b"\x01" + struct.pack("<H", 80)]
                await ws.send_bytes(b"\x00GET / HTTP/1.0\r\nHost: x\r\n\r\n")
                body = b""
                async for msg in ws:
                    if msg.type != aiohttp.WSMsgType.BINARY:
                        break
                    if msg.data[0] == 0:
                        body += msg.data[1:]
                    if b"hello from pod port 80" in body:
                        break
                result("WebSocket port-forward (kubelet v4, ?ports=80)", ok and b"hello from pod port 80" in body,
                       repr((hello, body[:200])))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    asyncio.run(main())
