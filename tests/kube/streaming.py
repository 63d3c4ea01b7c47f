# exec, attach and port-forward for the Kubernetes API server fixture (see apiserver.py):
# the commands run as local processes, relayed over the wire protocols real clients meet.
#
# Who serves what in a real cluster (1.30+), and so here:
# - WebSocket `v5.channel.k8s.io`: kube-apiserver itself (the StreamTranslator, KEP-4006): it
#   sends an empty message on the lowest writable channel first, honours the v5 CLOSE signal
#   ([255, channel]), and writes the Status it got over SPDY from the kubelet on channel 3.
# - WebSocket `v4.channel.k8s.io`, `v4.base64.channel.k8s.io`, `channel.k8s.io`,
#   `base64.channel.k8s.io` or none: proxied to the kubelet's streaming server (wsstream): the
#   same empty first message, no CLOSE signal, the base64 ones as text messages "<digit><base64>";
#   v3/v2 WebSocket protocols do not exist there and are refused (403) as x/net/websocket does.
# - SPDY/3.1 with X-Stream-Protocol-Version v4/v3/v2/channel.k8s.io: the kubelet; kubectl also
#   offers v5, which the kubelet does not list, so v4 is chosen.
# - port-forward: SPDY `portforward.k8s.io` (kubelet); WebSocket `SPDY/3.1+portforward.k8s.io`
#   (kube-apiserver tunnels that SPDY inside binary messages); WebSocket `v4.channel.k8s.io`
#   with ?ports= (kubelet: per port a data and an error channel, each opened by 2 bytes of port).

import asyncio
import base64
import ctypes
import errno
import fcntl
import json
import os
import pty
import signal
import struct
import termios
import time

from aiohttp import WSMsgType, web

import spdy31

EXEC_SPDY_PROTOCOLS = ["v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io"]
EXEC_WS_KUBELET_PROTOCOLS = ["", "channel.k8s.io", "base64.channel.k8s.io", "v4.channel.k8s.io", "v4.base64.channel.k8s.io"]
PORTFORWARD_SPDY_PROTOCOLS = ["portforward.k8s.io"]
TUNNEL_PREFIX = "SPDY/3.1+"
STREAM_CREATION_TIMEOUT = 30.0


# ---- metav1.Status bodies, as json.Marshal(status.Status()) writes them (no kind/apiVersion) ---
def status_success():
    return {"metadata": {}, "status": "Success"}


def status_nonzero_exit(code, message):
    return {
        "metadata": {},
        "status": "Failure",
        "message": "command terminated with non-zero exit code: " + message,
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": str(code)}]},
    }


def status_internal(err):
    return {
        "metadata": {},
        "status": "Failure",
        "message": "Internal error occurred: " + err,
        "reason": "InternalError",
        "details": {"causes": [{"message": err}]},
        "code": 500,
    }


def go_list(argv):
    """fmt.Sprintf("%v", []string{...})"""
    return "[" + " ".join(argv) + "]"


class ExecOutcome:
    def __init__(self, exit_code=None, error=None, gone=False):
        self.exit_code, self.error, self.gone = exit_code, error, gone

    def kubelet_status(self, argv):
        """The Status the kubelet (containerd's CRI streaming) writes on the error stream."""
        if self.error is not None:
            return status_internal("error executing command in container: " + self.error)
        if self.exit_code:
            # containerd: exec.CodeExitError{Err: fmt.Errorf("error executing command %v, exit code %d", cmd, code)}
            return status_nonzero_exit(
                self.exit_code, "error executing command %s, exit code %d" % (go_list(argv), self.exit_code)
            )
        return status_success()

    def translator_status(self, argv):
        """What kube-apiserver's v5 StreamTranslator writes, having read the kubelet's v4 status
        with client-go's SPDY executor."""
        if self.error is not None:
            # the v4 decoder turns a non-exit failure into errors.New(message); the translator
            # wraps that in NewInternalError again
            return status_internal(self.kubelet_status(argv)["message"])
        if self.exit_code:
            return status_nonzero_exit(self.exit_code, "command terminated with exit code %d" % self.exit_code)
        return status_success()


def v1_status_text(status):
    """v1WriteStatusFunc: nothing on success, else StatusError.Error() (the message)."""
    if status["status"] == "Success":
        return None
    return status.get("message", "")


# ---- running a command ------------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent():
    # PR_SET_PDEATHSIG: the command is killed if the fixture is (a test harness may SIGKILL it)
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


def _set_ctty():
    _die_with_parent()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _wait_fd(fd, writable=False):
    loop = asyncio.get_running_loop()
    fut = loop.create_future()

    def ready():
        if not fut.done():
            fut.set_result(None)

    (loop.add_writer if writable else loop.add_reader)(fd, ready)
    try:
        await fut
    finally:
        (loop.remove_writer if writable else loop.remove_reader)(fd)


LIVE = set()


def kill_all():
    for p in list(LIVE):
        p.kill()


class Process:
    """A command of a pod's container, run locally in the pod's directory."""

    def __init__(self, argv, cwd, env, tty, stdin, stdout, stderr, record):
        self.argv, self.cwd, self.env, self.tty = argv, cwd, env, tty
        self.want_stdin, self.want_stdout, self.want_stderr = stdin, stdout, stderr
        self.record = record
        self.proc = None
        self.master = None

    async def start(self):
        """Returns None, or the runtime's error text when the command cannot be started."""
        try:
            if self.tty:
                self.master, slave = pty.openpty()
                os.set_blocking(self.master, False)
                try:
                    self.proc = await asyncio.create_subprocess_exec(
                        *self.argv, stdin=slave, stdout=slave, stderr=slave, cwd=self.cwd, env=self.env,
                        start_new_session=True, preexec_fn=_set_ctty,
                    )
                finally:
                    os.close(slave)
            else:
                P, N = asyncio.subprocess.PIPE, asyncio.subprocess.DEVNULL
                self.proc = await asyncio.create_subprocess_exec(
                    *self.argv, stdin=P if self.want_stdin else N, stdout=P if self.want_stdout else N,
                    stderr=P if self.want_stderr else N, cwd=self.cwd, env=self.env, start_new_session=True,
                    preexec_fn=_die_with_parent, limit=1 << 16,
                )
            LIVE.add(self)
        except OSError as e:
            if self.master is not None:
                os.close(self.master)
                self.master = None
            exe = self.argv[0] if self.argv else ""
            if isinstance(e, FileNotFoundError) or e.errno == errno.ENOENT:
                why = 'exec: "%s": executable file not found in $PATH' % exe
            elif isinstance(e, PermissionError):
                why = 'exec: "%s": permission denied' % exe
            else:
                why = "exec: %s" % e.strerror
            return (
                'failed to exec in container: failed to start exec "%s": OCI runtime exec failed: exec failed: '
                "unable to start container process: %s: unknown" % (os.urandom(32).hex(), why)
            )
        return None

    async def write_stdin(self, data):
        try:
            if self.tty:
                view = memoryview(data)
                while view:
                    try:
                        n = os.write(self.master, view)
                        view = view[n:]
                    except BlockingIOError:
                        await _wait_fd(self.master, writable=True)
            elif self.proc.stdin is not None:
                self.proc.stdin.write(data)
                await self.proc.stdin.drain()
        except (OSError, ConnectionError):
            pass  # the process closed its stdin or exited: what it does not read is lost

    def close_stdin(self):
        try:
            if self.tty:
                # a terminal has no half close: what a runtime can do is type the EOF character
                os.write(self.master, b"\x04")
            elif self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def resize(self, width, height):
        if self.tty and self.master is not None:
            try:
                fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, 0, 0))
            except OSError:
                pass

    async def _pump_reader(self, reader, sink, key):
        while True:
            chunk = await reader.read(32 * 1024)
            if not chunk:
                return
            self.record["bytes"][key] += len(chunk)
            await sink(chunk)

    async def _pump_master(self, sink):
        while True:
            try:
                chunk = os.read(self.master, 32 * 1024)
            except BlockingIOError:
                await _wait_fd(self.master)
                continue
            except OSError:  # EIO once no process holds the terminal any more
                return
            if not chunk:
                return
            self.record["bytes"]["stdout"] += len(chunk)
            await sink(chunk)

    async def run(self, stdin_src, out_sink, err_sink, resize_src, gone):
        """Relay until the command exits (-> ExecOutcome) or `gone` is set (client went away:
        the process group is killed)."""
        pumps = []
        if self.tty:
            pumps.append(asyncio.ensure_future(self._pump_master(out_sink)))
        else:
            if self.proc.stdout is not None:
                pumps.append(asyncio.ensure_future(self._pump_reader(self.proc.stdout, out_sink, "stdout")))
            if self.proc.stderr is not None:
                pumps.append(asyncio.ensure_future(self._pump_reader(self.proc.stderr, err_sink, "stderr")))
        side = []
        if stdin_src is not None:
            side.append(asyncio.ensure_future(self._pump_stdin(stdin_src)))
        if resize_src is not None:
            side.append(asyncio.ensure_future(self._pump_resize(resize_src)))
        waiter = asyncio.ensure_future(self.proc.wait())
        gone_w = asyncio.ensure_future(gone.wait())
        try:
            await asyncio.wait([waiter, gone_w], return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                self.kill()
                await waiter
                return ExecOutcome(gone=True)
            # the command exited: drain what it wrote (a background child keeping the pipes
            # open gets 5 seconds)
            if pumps:
                _, pending = await asyncio.wait(pumps, timeout=5)
                for p in pending:
                    p.cancel()
            rc = waiter.result()
            return ExecOutcome(exit_code=(128 - rc) if rc < 0 else rc)
        finally:
            LIVE.discard(self)
            for t in side + pumps + [gone_w]:
                t.cancel()
            await asyncio.gather(*side, *pumps, gone_w, return_exceptions=True)
            if self.master is not None:
                os.close(self.master)
                self.master = None

    async def _pump_stdin(self, src):
        while True:
            data = await src.read()
            if not data:
                self.record["stdin_closed"] = True
                self.close_stdin()
                return
            self.record["bytes"]["stdin"] += len(data)
            await self.write_stdin(data)

    async def _pump_resize(self, src):
        buf = ""
        dec = json.JSONDecoder()
        while True:
            data = await src.read()
            if not data:
                return
            buf += data.decode("utf-8", "replace")
            while True:
                buf = buf.lstrip()
                if not buf:
                    break
                try:
                    obj, end = dec.raw_decode(buf)
                except ValueError:
                    break
                buf = buf[end:]
                if isinstance(obj, dict):
                    low = {k.lower(): v for k, v in obj.items()}  # encoding/json matches names case-insensitively
                    w, h = int(low.get("width", 0) or 0), int(low.get("height", 0) or 0)
                    self.record["resizes"].append([w, h])
                    self.resize(w, h)

    def kill(self):
        if self.proc and self.proc.returncode is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass


# ---- adapters: what the process pumps read from -----------------------------------------------
class PipeSource:
    def __init__(self, pipe):
        self.pipe = pipe

    async def read(self):
        return await self.pipe.read(32 * 1024)


class SpdySource:
    def __init__(self, stream):
        self.stream = stream

    async def read(self):
        return await self.stream.read(32 * 1024)


def base_record(ctx, kind, transport, protocol):
    rec = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kind": kind,
        "transport": transport,
        "protocol": protocol,
        "namespace": ctx["namespace"],
        "pod": ctx["pod"],
        "user": ctx["user"],
    }
    if kind != "portforward":
        rec.update(bytes={"stdin": 0, "stdout": 0, "stderr": 0}, resizes=[], stdin_closed=False)
    return rec


# ---- exec / attach over WebSocket -----------------------------------------------------------------
async def exec_websocket(request, ctx, protocol, opts, argv, write_session):
    """opts: dict stdin/stdout/stderr/tty (stderr already off when tty)."""
    binary = "base64" not in protocol
    v5 = protocol == "v5.channel.k8s.io"
    ws = web.WebSocketResponse(protocols=(protocol,) if protocol else (), autoping=True, max_msg_size=0, compress=False)
    await ws.prepare(request)
    rec = base_record(ctx, ctx["kind"], "websocket", protocol or "(none)")
    rec.update(command=argv, container=ctx["container"], tty=opts["tty"], stdin=opts["stdin"],
               stdout=opts["stdout"], stderr=opts["stderr"])
    send_lock = asyncio.Lock()
    closed = asyncio.Event()

    async def send(channel, data):
        if closed.is_set():
            raise ConnectionResetError("websocket closed")
        async with send_lock:
            if binary:
                await ws.send_bytes(bytes([channel]) + data)
            else:
                await ws.send_str(chr(ord("0") + channel) + base64.b64encode(data).decode())

    # "Send an empty message to the lowest writable channel to notify the client the connection
    # is established" (kubelet and apiserver alike)
    first = 1 if opts["stdout"] else 2 if opts["stderr"] else 3
    await send(first, b"")

    stdin_pipe = spdy31.Pipe() if opts["stdin"] else None
    resize_pipe = spdy31.Pipe()

    async def reader():
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    data = msg.data
                elif msg.type == WSMsgType.TEXT:
                    data = msg.data.encode("latin-1", "replace")
                else:
                    break
                if not data:
                    continue
                if v5 and data[0] == 255:
                    if len(data) != 2:
                        break  # wsstream ends the connection on a malformed close signal
                    if data[1] == 0 and stdin_pipe is not None:
                        stdin_pipe.feed_eof()
                    elif data[1] == 4:
                        resize_pipe.feed_eof()
                    continue
                channel = data[0] - (ord("0") if not binary else 0)
                payload = data[1:]
                if not binary:
                    try:
                        payload = base64.b64decode(payload)
                    except ValueError:
                        continue
                if channel == 0 and stdin_pipe is not None:
                    await stdin_pipe.wait_below_low()
                    stdin_pipe.feed(payload)
                elif channel == 4:
                    resize_pipe.feed(payload)
                # other channels are not read channels: ignored, as wsstream does
        finally:
            closed.set()
            if stdin_pipe is not None:
                stdin_pipe.feed_eof()
            resize_pipe.feed_eof()

    read_task = asyncio.ensure_future(reader())
    proc = Process(argv, ctx["cwd"], ctx["env"], opts["tty"], opts["stdin"], opts["stdout"], opts["stderr"], rec)
    err = await proc.start()
    if err is not None:
        outcome = ExecOutcome(error=err)
    else:
        outcome = await proc.run(
            PipeSource(stdin_pipe) if stdin_pipe else None,
            lambda d: send(1, d), lambda d: send(2, d),
            PipeSource(resize_pipe) if opts["tty"] else None, closed,
        )
    if outcome.gone:
        rec["result"] = "client went away"
    else:
        status = outcome.translator_status(argv) if v5 else outcome.kubelet_status(argv)
        rec["result"] = status
        if v5 or protocol.startswith("v4."):
            body = json.dumps(status, separators=(",", ":")).encode()
        else:
            text = v1_status_text(status)
            body = text.encode() if text is not None else None
        if body is not None:
            try:
                await send(3, body)
            except (ConnectionError, RuntimeError):
                pass
    try:
        await ws.close()
    except (ConnectionError, RuntimeError):
        pass
    read_task.cancel()
    await asyncio.gather(read_task, return_exceptions=True)
    write_session(rec)
    return ws


# ---- SPDY upgrades -------------------------------------------------------------------------------
class _RawParser:
    """Takes the place of aiohttp's HTTP parser once a connection is upgraded to SPDY: every byte
    the client sends from then on goes to a Pipe."""

    def __init__(self, pipe):
        self.pipe = pipe

    def feed_data(self, data):
        self.pipe.feed(data)
        return False, b""

    def feed_eof(self):
        self.pipe.feed_eof()


async def spdy_upgrade(request, negotiated):
    """Answer 101 Switching Protocols (Connection: Upgrade, Upgrade: SPDY/3.1,
    X-Stream-Protocol-Version) and take the connection over. -> (source Pipe, write, finish)."""
    transport = request.transport
    protocol = request._protocol  # aiohttp's RequestHandler (a BaseProtocol)
    pipe = spdy31.Pipe(pause=transport.pause_reading, resume=transport.resume_reading)
    protocol.set_parser(_RawParser(pipe))
    resp = web.StreamResponse(status=101, reason="Switching Protocols")
    resp.headers["Connection"] = "Upgrade"
    resp.headers["Upgrade"] = "SPDY/3.1"
    resp.headers["X-Stream-Protocol-Version"] = negotiated
    await resp.prepare(request)

    async def write(parts):
        t = request.transport
        if t is None or t.is_closing():
            raise ConnectionResetError("connection closed")
        t.write(b"".join(parts))
        if protocol._paused:
            await protocol._drain_helper()

    def finish():
        protocol.force_close()

    return resp, pipe, write, finish


async def exec_spdy(request, ctx, negotiated, opts, argv, write_session):
    resp, pipe, write, finish = await spdy_upgrade(request, negotiated)
    rec = base_record(ctx, ctx["kind"], "spdy", negotiated)
    rec.update(command=argv, container=ctx["container"], tty=opts["tty"], stdin=opts["stdin"],
               stdout=opts["stdout"], stderr=opts["stderr"])
    version = {"v4.channel.k8s.io": 4, "v3.channel.k8s.io": 3, "v2.channel.k8s.io": 2}.get(negotiated, 1)
    expected = 1 + opts["stdin"] + opts["stdout"] + opts["stderr"] + (1 if opts["tty"] and version >= 3 else 0)
    streams = {}
    ready = asyncio.Event()
    replied = 0

    async def on_stream(s):
        # the kubelet replies to every stream and counts the replies, whatever their type
        nonlocal replied
        await s.reply()
        kind = s.header("streamtype")
        if kind in ("error", "stdin", "stdout", "stderr", "resize"):
            streams[kind] = s
        rec.setdefault("streams", []).append({"id": s.id, "streamType": kind})
        replied += 1
        if replied >= expected:
            ready.set()

    session = spdy31.SpdySession(pipe, write, on_stream, window_updates=ctx["window_updates"])
    serve_task = asyncio.ensure_future(session.serve())
    gone = asyncio.Event()
    serve_task.add_done_callback(lambda _t: gone.set())
    try:
        try:
            await asyncio.wait_for(asyncio.shield(_wait_either(ready, gone)), STREAM_CREATION_TIMEOUT)
        except asyncio.TimeoutError:
            pass
        if not ready.is_set():
            rec["result"] = "timed out waiting for client to create streams" if not gone.is_set() else "client went away"
            return resp
        if version == 1 and "stdin" in streams:
            await streams["stdin"].close()  # the v1 handler closes stdin right away (sic)

        def sink(kind):
            s = streams.get(kind)

            async def w(data):
                if s is not None:
                    await s.write(data)
            return w

        proc = Process(argv, ctx["cwd"], ctx["env"], opts["tty"], opts["stdin"], opts["stdout"], opts["stderr"], rec)
        err = await proc.start()
        if err is not None:
            outcome = ExecOutcome(error=err)
        else:
            outcome = await proc.run(
                SpdySource(streams["stdin"]) if "stdin" in streams and version > 1 else None,
                sink("stdout"), sink("stderr"),
                SpdySource(streams["resize"]) if "resize" in streams else None, gone,
            )
        if outcome.gone:
            rec["result"] = "client went away"
        else:
            status = outcome.kubelet_status(argv)
            rec["result"] = status
            body = json.dumps(status, separators=(",", ":")).encode() if version == 4 else (
                (v1_status_text(status) or "").encode() or None)
            if body is not None and "error" in streams:
                try:
                    await streams["error"].write(body)
                except ConnectionError:
                    pass
        return resp
    finally:
        await session.close()
        rec["spdy_frames_in"] = session.frames_in
        rec["spdy_frames_out"] = session.frames_out
        serve_task.cancel()
        await asyncio.gather(serve_task, return_exceptions=True)
        finish()
        write_session(rec)


async def _wait_either(*events):
    tasks = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()


# ---- port-forward ----------------------------------------------------------------------------------
class PortForwardHandler:
    """The kubelet's httpStreamHandler: pairs of (error, data) streams per requestID; each pair is
    one connection to the pod's port, here 127.0.0.1:LOCAL per the --forward map."""

    def __init__(self, ctx, rec):
        self.ctx, self.rec = ctx, rec
        self.pairs = {}
        self.tasks = set()

    async def on_stream(self, s):
        port_s = s.header("port")
        kind = s.header("streamtype")
        ok = port_s.isdigit() and 0 < int(port_s) < 65536 and kind in ("error", "data")
        if not ok:
            # httpStreamReceived returns an error: spdystream resets the stream (CANCEL)
            await s.reset(spdy31.CANCEL)
            return
        await s.reply()
        rid = s.header("requestid")
        if not rid:  # old clients: the kubelet derives one from the stream ids
            rid = str(s.id if kind == "error" else s.id - 2)
        pair = self.pairs.get(rid)
        if pair is None:
            pair = self.pairs[rid] = {"error": None, "data": None}
            t = asyncio.ensure_future(self._monitor(rid, pair))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)
        if pair[kind] is not None:
            msg = "error processing stream for request %s: %s stream already assigned" % (rid, kind)
            if pair["error"] is not None:
                await _quiet(pair["error"].write(msg.encode()))
            return
        pair[kind] = s
        if pair["error"] is not None and pair["data"] is not None:
            t = asyncio.ensure_future(self._forward(rid, pair))
            self.tasks.add(t)
            t.add_done_callback(self.tasks.discard)

    async def _monitor(self, rid, pair):
        await asyncio.sleep(STREAM_CREATION_TIMEOUT)
        if pair["error"] is None or pair["data"] is None:
            if pair["error"] is not None:
                await _quiet(pair["error"].write(b"(conn=spdy, request=%s) timed out waiting for streams" % rid.encode()))
            self.pairs.pop(rid, None)

    async def _forward(self, rid, pair):
        data, error = pair["data"], pair["error"]
        port = int(data.header("port"))
        local = self.ctx["forwards"].get(port)
        conn = {"port": port, "requestID": rid, "local": local, "bytes_in": 0, "bytes_out": 0}
        self.rec.setdefault("connections", []).append(conn)
        writer = None
        try:
            try:
                if local is None:
                    raise ConnectionRefusedError("connection refused")
                reader, writer = await asyncio.open_connection("127.0.0.1", local)
            except OSError:
                msg = (
                    'error forwarding port %d to pod %s, uid %s: failed to connect to localhost:%d inside namespace '
                    '"%s", IPv4: dial tcp4 127.0.0.1:%d: connect: connection refused IPv6 dial tcp6 [::1]:%d: '
                    "connect: connection refused " % (
                        port, self.ctx["pod_id"], self.ctx["uid"], port, self.ctx["netns"], port, port)
                )
                conn["error"] = msg
                await _quiet(error.write(msg.encode()))
                return

            async def up():
                while True:
                    chunk = await data.read()
                    if not chunk:
                        break
                    conn["bytes_in"] += len(chunk)
                    writer.write(chunk)
                    await writer.drain()
                if writer.can_write_eof():
                    writer.write_eof()

            async def down():
                while True:
                    chunk = await reader.read(32 * 1024)
                    if not chunk:
                        break
                    conn["bytes_out"] += len(chunk)
                    await data.write(chunk)
                await data.close()

            t_up, t_down = asyncio.ensure_future(up()), asyncio.ensure_future(down())
            # PortForward returns once the pod side is done; a reset from the client ends it too
            done, _ = await asyncio.wait([t_down, asyncio.ensure_future(data.closed_event.wait())],
                                         return_when=asyncio.FIRST_COMPLETED)
            if not t_down.done():
                if data.reset_received:
                    t_down.cancel()
                else:
                    await asyncio.wait([t_down], timeout=None)
            await asyncio.wait([t_up], timeout=1)
            for t in (t_up, t_down):
                t.cancel()
            await asyncio.gather(t_up, t_down, return_exceptions=True)
        except ConnectionError:
            pass
        finally:
            if writer is not None:
                writer.close()
            # defer dataStream.Close(); defer errorStream.Close()
            await _quiet(error.close())
            await _quiet(data.close())
            self.pairs.pop(rid, None)

    async def shutdown(self):
        for t in list(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


async def _quiet(coro):
    try:
        await coro
    except (ConnectionError, RuntimeError):
        pass


async def portforward_spdy(request, ctx, negotiated, write_session):
    resp, pipe, write, finish = await spdy_upgrade(request, negotiated)
    await _portforward_session(ctx, "spdy", negotiated, pipe, write, write_session)
    finish()
    return resp


async def portforward_tunnel(request, ctx, ws_protocol, write_session):
    """kube-apiserver's TunnelingHandler: SPDY carried in WebSocket binary messages."""
    ws = web.WebSocketResponse(protocols=(ws_protocol,), autoping=True, max_msg_size=0, compress=False)
    await ws.prepare(request)
    pipe = spdy31.Pipe()

    async def feeder():
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    break
                await pipe.wait_below_low()
                pipe.feed(msg.data)
        finally:
            pipe.feed_eof()

    lock = asyncio.Lock()

    async def write(parts):
        async with lock:
            for p in parts:  # one message per framer write, as the real tunnel sends
                await ws.send_bytes(p)

    feed_task = asyncio.ensure_future(feeder())
    await _portforward_session(ctx, "websocket-tunnel", ws_protocol, pipe, write, write_session)
    try:
        await ws.close()
    except (ConnectionError, RuntimeError):
        pass
    feed_task.cancel()
    await asyncio.gather(feed_task, return_exceptions=True)
    return ws


async def _portforward_session(ctx, transport, protocol, pipe, write, write_session):
    rec = base_record(ctx, "portforward", transport, protocol)
    handler = PortForwardHandler(ctx, rec)
    session = spdy31.SpdySession(pipe, write, handler.on_stream, window_updates=ctx["window_updates"])
    try:
        rec["end"] = await session.serve()
    finally:
        await handler.shutdown()
        await session.close()
        rec["spdy_frames_in"] = session.frames_in
        rec["spdy_frames_out"] = session.frames_out
        write_session(rec)


async def portforward_websocket_v4(request, ctx, protocol, ports, write_session):
    """The kubelet's WebSocket port-forward: channels 2i (data, read/write) and 2i+1 (error) for
    the i-th ?ports= value, each first written the port as 2 bytes little endian."""
    binary = "base64" not in protocol
    ws = web.WebSocketResponse(protocols=(protocol,) if protocol else (), autoping=True, max_msg_size=0, compress=False)
    await ws.prepare(request)
    rec = base_record(ctx, "portforward", "websocket", protocol or "(none)")
    rec["ports"] = ports
    lock = asyncio.Lock()

    async def send(channel, data):
        async with lock:
            if binary:
                await ws.send_bytes(bytes([channel]) + data)
            else:
                await ws.send_str(chr(ord("0") + channel) + base64.b64encode(data).decode())

    inboxes = [spdy31.Pipe() for _ in ports]
    for i, port in enumerate(ports):
        await send(2 * i, struct.pack("<H", port))
        await send(2 * i + 1, struct.pack("<H", port))

    async def reader():
        try:
            async for msg in ws:
                if msg.type == WSMsgType.BINARY:
                    data = msg.data
                elif msg.type == WSMsgType.TEXT:
                    data = msg.data.encode("latin-1", "replace")
                else:
                    break
                if not data:
                    continue
                ch = data[0] - (0 if binary else ord("0"))
                payload = data[1:] if binary else base64.b64decode(data[1:])
                if ch % 2 == 0 and ch // 2 < len(inboxes):
                    await inboxes[ch // 2].wait_below_low()
                    inboxes[ch // 2].feed(payload)
        finally:
            for p in inboxes:
                p.feed_eof()

    async def one(i, port):
        local = ctx["forwards"].get(port)
        try:
            if local is None:
                raise ConnectionRefusedError()
            reader_, writer = await asyncio.open_connection("127.0.0.1", local)
        except OSError:
            await _quiet(send(2 * i + 1, (
                'error forwarding port %d to pod %s, uid %s: failed to connect to localhost:%d inside namespace "%s", '
                "IPv4: dial tcp4 127.0.0.1:%d: connect: connection refused " % (
                    port, ctx["pod_id"], ctx["uid"], port, ctx["netns"], port)).encode()))
            return

        async def up():
            while True:
                chunk = await inboxes[i].read()
                if not chunk:
                    break
                writer.write(chunk)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

        u = asyncio.ensure_future(up())
        try:
            while True:
                chunk = await reader_.read(32 * 1024)
                if not chunk:
                    break
                await send(2 * i, chunk)
        except ConnectionError:
            pass
        finally:
            u.cancel()
            await asyncio.gather(u, return_exceptions=True)
            writer.close()

    rt = asyncio.ensure_future(reader())
    await asyncio.gather(*(one(i, p) for i, p in enumerate(ports)), return_exceptions=True)
    try:
        await ws.close()
    except (ConnectionError, RuntimeError):
        pass
    rt.cancel()
    await asyncio.gather(rt, return_exceptions=True)
    write_session(rec)
    return ws
