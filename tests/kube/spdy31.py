# SPDY/3.1 for the Kubernetes API server fixture (see apiserver.py): the framing and the
# server side of a session, as github.com/moby/spdystream speaks it for kubelet and
# kube-apiserver (exec, attach and port-forward, after `Upgrade: SPDY/3.1`).
#
# What spdystream does, and so what this does:
# - header blocks (SYN_STREAM, SYN_REPLY, HEADERS) are zlib streams with the SPDY/3 dictionary,
#   one compression context per direction for the whole connection, each block ended with a
#   sync flush; names are lower case, several values of one name are joined with NUL;
# - the server replies to each SYN_STREAM it accepts with a SYN_REPLY whose header block is empty,
#   answers client PINGs (odd ids) with the same frame, and stops reading at a GOAWAY;
# - a half close is a DATA frame with FIN (empty or not), an abort is RST_STREAM (CANCEL when the
#   server tears its streams down);
# - flow control: spdystream neither sends WINDOW_UPDATE nor waits for one (a window it receives is
#   an "unhandled frame" it ignores). This session never waits for the peer's window either (a
#   kubectl peer never opens it), but unlike spdystream it does tell the peer, with WINDOW_UPDATEs
#   for the stream and for the session, how much it has consumed, so a peer that honours SPDY/3.1
#   flow control (64 KiB initial windows, or what SETTINGS says) never stalls on a large upload.
#   `window_updates=False` turns that off for a byte-exact spdystream server.

import asyncio
import hashlib
import struct
import zlib

# The SPDY/3 header compression dictionary (draft-mbelshe-httpbis-spdy-00 section 2.6.10.1,
# byte for byte the one in spdystream's spdy/dictionary.go): 65 length-prefixed words (written
# here separated by spaces, "200 OK" as 200_OK), then text.
_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language "
    "accept-ranges age allow authorization cache-control connection content-base content-encoding "
    "content-language content-length content-location content-md5 content-range content-type date "
    "etag expect expires from host if-match if-modified-since if-none-match if-range "
    "if-unmodified-since last-modified location max-forwards pragma proxy-authenticate "
    "proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
    "user-agent vary via warning www-authenticate method get status 200_OK version HTTP/1.1 url "
    "public set-cookie keep-alive origin"
).split(" ")
_TAIL = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request"
    "401 Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented"
    "503 Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 "
    "Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    "application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    "gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
HEADER_DICTIONARY = b"".join(
    len(w).to_bytes(4, "big") + w.replace("_", " ").encode() for w in _WORDS
) + _TAIL.encode()
assert len(HEADER_DICTIONARY) == 1423
assert (
    hashlib.sha256(HEADER_DICTIONARY).hexdigest()
    == "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
)

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
# RST_STREAM status codes
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, UNSUPPORTED_VERSION, CANCEL = 1, 2, 3, 4, 5
INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_IN_USE, STREAM_ALREADY_CLOSED = 6, 7, 8, 9
SETTINGS_INITIAL_WINDOW_SIZE = 7
DEFAULT_WINDOW = 64 * 1024
MAX_DATA_CHUNK = 32 * 1024  # what io.Copy hands spdystream at a time


class Pipe:
    """An in-memory byte stream with end of file, fed by a transport or a WebSocket.

    When more than `high` bytes wait unread, `pause()` is called (e.g. the transport's
    pause_reading); once a reader brings it under `low`, `resume()`."""

    def __init__(self, high=1 << 20, low=1 << 18, pause=None, resume=None):
        self._buf = bytearray()
        self._eof = False
        self._high, self._low = high, low
        self._pause, self._resume = pause, resume
        self._paused = False
        self._changed = asyncio.Event()

    def feed(self, data):
        if not data:
            return
        self._buf += data
        self._changed.set()
        if len(self._buf) > self._high and not self._paused and self._pause:
            self._paused = True
            self._pause()

    def feed_eof(self):
        self._eof = True
        self._changed.set()

    @property
    def at_eof(self):
        return self._eof and not self._buf

    def buffered(self):
        return len(self._buf)

    def _took(self):
        if self._paused and len(self._buf) <= self._low:
            self._paused = False
            if self._resume:
                self._resume()
        if len(self._buf) <= self._low:
            self._changed.set()

    async def _wait(self):
        self._changed.clear()
        await self._changed.wait()

    async def readexactly(self, n):
        while len(self._buf) < n:
            if self._eof:
                partial = bytes(self._buf)
                self._buf.clear()
                raise asyncio.IncompleteReadError(partial, n)
            await self._wait()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._took()
        return out

    async def read(self, n=MAX_DATA_CHUNK):
        while not self._buf:
            if self._eof:
                return b""
            await self._wait()
        out = bytes(self._buf[:n])
        del self._buf[:n]
        self._took()
        return out

    async def wait_below_low(self):
        while len(self._buf) > self._low and not self._eof:
            await self._wait()


def _encode_header_block(headers):
    """headers: list of (name, [values]) -> uncompressed SPDY/3 name/value block."""
    out = [struct.pack(">I", len(headers))]
    for name, values in headers:
        n = name.lower().encode()
        v = b"\x00".join(x.encode() for x in values)
        out.append(struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v)
    return b"".join(out)


def _decode_header_block(raw):
    """-> dict name -> [values] (names lower case)."""
    pos = 0

    def u32():
        nonlocal pos
        if pos + 4 > len(raw):
            raise ValueError("truncated header block")
        (v,) = struct.unpack_from(">I", raw, pos)
        pos += 4
        return v

    def take(n):
        nonlocal pos
        if pos + n > len(raw):
            raise ValueError("truncated header block")
        b = raw[pos : pos + n]
        pos += n
        return b

    headers = {}
    for _ in range(u32()):
        name = take(u32()).decode("latin-1").lower()
        value = take(u32()).decode("latin-1")
        headers.setdefault(name, []).extend(value.split("\x00"))
    return headers


class ProtocolError(Exception):
    pass


class SpdyStream:
    """One client-initiated stream, as the server sees it."""

    def __init__(self, session, stream_id, headers, priority):
        self.session = session
        self.id = stream_id
        self.headers = headers
        self.priority = priority
        self.inbox = Pipe(high=1 << 20, low=1 << 18)
        self.replied = False
        self.remote_fin = False
        self.local_fin = False
        self.reset_received = False
        self.closed_event = asyncio.Event()  # remote FIN or RST
        self._unacked = 0  # consumed bytes not yet announced in a WINDOW_UPDATE

    def header(self, name, default=""):
        vals = self.headers.get(name.lower())
        return vals[0] if vals else default

    async def reply(self, headers=(), fin=False):
        if self.replied:
            return
        self.replied = True
        await self.session.send_syn_reply(self.id, list(headers), fin)
        if fin:
            self.local_fin = True

    async def read(self, n=MAX_DATA_CHUNK):
        data = await self.inbox.read(n)
        if data:
            await self.session._consumed(self, len(data))
        return data

    async def write(self, data):
        if self.local_fin or self.reset_received or self.session.closed:
            raise ConnectionResetError("write on closed stream %d" % self.id)
        mv = memoryview(data)
        for i in range(0, len(mv), MAX_DATA_CHUNK):
            await self.session.send_data(self.id, bytes(mv[i : i + MAX_DATA_CHUNK]), False)

    async def close(self):
        """Half close: an empty DATA frame with FIN, as spdystream's Stream.Close."""
        if self.local_fin or self.reset_received or self.session.closed:
            return
        self.local_fin = True
        await self.session.send_data(self.id, b"", True)

    async def reset(self, status=CANCEL):
        """As spdystream's Stream.Reset: RST_STREAM unless this side already sent FIN."""
        self._remote_done()
        if self.local_fin or self.session.closed:
            return
        self.local_fin = True
        await self.session.send_rst(self.id, status)

    def _remote_done(self):
        if not self.inbox._eof:
            self.inbox.feed_eof()
        self.closed_event.set()


class SpdySession:
    """The server side of a SPDY/3.1 connection over a byte source and sink.

    source: an object with `async readexactly(n)` (a Pipe); write: `async write(parts)` with
    parts a list of bytes (see _send);
    on_stream: `async on_stream(stream)` called for each SYN_STREAM, in order; it must call
    `await stream.reply()` to accept or `await stream.reset(REFUSED_STREAM)` to refuse, and
    must not block (start tasks for the long work)."""

    def __init__(self, source, write, on_stream, window_updates=True, log=None):
        self._source = source
        self._write = write
        self._on_stream = on_stream
        self._window_updates = window_updates
        self._log = log or (lambda msg: None)
        self._lock = asyncio.Lock()
        self._deflate = zlib.compressobj(9, zlib.DEFLATED, 15, 8, zlib.Z_DEFAULT_STRATEGY, HEADER_DICTIONARY)
        self._inflate = zlib.decompressobj(zdict=HEADER_DICTIONARY)
        self.streams = {}
        self.last_stream_id = 0
        self.closed = False
        self.goaway_received = False
        self.peer_initial_window = DEFAULT_WINDOW
        self._session_unacked = 0
        self.frames_in = {}  # frame type name -> count, for the session log
        self.frames_out = {}

    # ---- sending -------------------------------------------------------------------------
    # A frame is a list of parts, one per write spdystream's framer makes on its connection
    # (each binary.Write of a field is its own write). Over TCP they are joined; through the
    # WebSocket tunnel of port-forward each part is its own WebSocket message, as the real API
    # server's tunnel sends them (a DATA frame is three messages, the last maybe empty).
    async def _send(self, parts, kind):
        async with self._lock:
            if self.closed:
                raise ConnectionResetError("SPDY session closed")
            self.frames_out[kind] = self.frames_out.get(kind, 0) + 1
            await self._write(parts)

    @staticmethod
    def _control(ftype, flags, length, *fields):
        return [
            struct.pack(">H", 0x8000 | VERSION),
            struct.pack(">H", ftype),
            struct.pack(">I", (flags << 24) | length),
            *fields,
        ]

    async def send_syn_reply(self, stream_id, headers, fin=False):
        async with self._lock:
            if self.closed:
                raise ConnectionResetError("SPDY session closed")
            # compress under the lock: the zlib context must follow the order on the wire
            block = self._deflate.compress(_encode_header_block(headers)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)
            parts = self._control(SYN_REPLY, FLAG_FIN if fin else 0, 4 + len(block), struct.pack(">I", stream_id), block)
            self.frames_out["SYN_REPLY"] = self.frames_out.get("SYN_REPLY", 0) + 1
            await self._write(parts)

    async def send_data(self, stream_id, data, fin=False):
        parts = [
            struct.pack(">I", stream_id & 0x7FFFFFFF),
            struct.pack(">I", ((FLAG_FIN if fin else 0) << 24) | len(data)),
            data,
        ]
        await self._send(parts, "DATA")

    async def send_rst(self, stream_id, status):
        parts = self._control(RST_STREAM, 0, 8, struct.pack(">I", stream_id), struct.pack(">I", status))
        await self._send(parts, "RST_STREAM")

    async def send_goaway(self, status=0):
        # spdystream's Close: the last good stream is the last one received minus 2 (sic)
        last = self.last_stream_id - 2 if self.last_stream_id > 2 else 0
        parts = self._control(GOAWAY, 0, 8, struct.pack(">I", last), struct.pack(">I", status))
        await self._send(parts, "GOAWAY")

    async def send_window_update(self, stream_id, delta):
        parts = self._control(WINDOW_UPDATE, 0, 8, struct.pack(">I", stream_id), struct.pack(">I", delta))
        await self._send(parts, "WINDOW_UPDATE")

    async def _consumed(self, stream, n):
        if not self._window_updates or self.closed:
            return
        stream._unacked += n
        self._session_unacked += n
        try:
            if stream._unacked >= DEFAULT_WINDOW // 2 and not stream.remote_fin and not stream.reset_received:
                delta, stream._unacked = stream._unacked, 0
                await self.send_window_update(stream.id, delta)
            if self._session_unacked >= DEFAULT_WINDOW // 2:
                delta, self._session_unacked = self._session_unacked, 0
                await self.send_window_update(0, delta)
        except ConnectionError:
            pass

    async def close(self, goaway=True):
        """As spdystream's Connection.Close after httpstream's: reset every stream this side
        has not finished, send GOAWAY, then the caller closes the transport."""
        if self.closed:
            return
        try:
            for s in list(self.streams.values()):
                await s.reset(CANCEL)
            if goaway:
                await self.send_goaway(0)
        except ConnectionError:
            pass
        self.closed = True
        for s in list(self.streams.values()):
            s._remote_done()

    # ---- receiving -----------------------------------------------------------------------
    def _count_in(self, kind):
        self.frames_in[kind] = self.frames_in.get(kind, 0) + 1

    async def serve(self):
        """Read frames until the peer's EOF or GOAWAY (or a framing error). Returns a reason."""
        reason = "eof"
        try:
            while not self.closed:
                head = await self._source.readexactly(8)
                if head[0] & 0x80:
                    version = ((head[0] & 0x7F) << 8) | head[1]
                    ftype = (head[2] << 8) | head[3]
                    flags = head[4]
                    length = int.from_bytes(head[5:8], "big")
                    payload = await self._source.readexactly(length)
                    if version != VERSION:
                        self._log("SPDY control frame of version %d ignored" % version)
                        continue
                    if ftype == GOAWAY:
                        self._count_in("GOAWAY")
                        self.goaway_received = True
                        reason = "goaway"
                        break
                    await self._control_frame(ftype, flags, payload)
                else:
                    stream_id = int.from_bytes(head[0:4], "big") & 0x7FFFFFFF
                    flags = head[4]
                    length = int.from_bytes(head[5:8], "big")
                    data = await self._source.readexactly(length)
                    self._count_in("DATA")
                    await self._data_frame(stream_id, flags, data)
        except asyncio.IncompleteReadError:
            reason = "eof"
        except (ProtocolError, zlib.error, ValueError) as e:
            self._log("SPDY protocol error: %s" % e)
            reason = "protocol error: %s" % e
        except ConnectionError:
            reason = "connection reset"
        for s in list(self.streams.values()):
            s._remote_done()
        return reason

    def _inflate_block(self, block):
        raw = self._inflate.decompress(block)
        if self._inflate.unconsumed_tail:
            raise ProtocolError("header block left input unconsumed")
        return _decode_header_block(raw)

    async def _control_frame(self, ftype, flags, payload):
        if ftype == SYN_STREAM:
            self._count_in("SYN_STREAM")
            if len(payload) < 10:
                raise ProtocolError("short SYN_STREAM")
            stream_id, _assoc = struct.unpack_from(">II", payload, 0)
            stream_id &= 0x7FFFFFFF
            priority = payload[8] >> 5
            headers = self._inflate_block(payload[10:])
            if stream_id == 0 or stream_id % 2 == 0 or stream_id in self.streams or stream_id <= self.last_stream_id:
                # spdystream's checkStreamFrame: a bad id is answered with PROTOCOL_ERROR
                await self.send_rst(stream_id, PROTOCOL_ERROR)
                return
            self.last_stream_id = stream_id
            s = SpdyStream(self, stream_id, headers, priority)
            self.streams[stream_id] = s
            if flags & FLAG_FIN:
                s.remote_fin = True
                s._remote_done()
            await self._on_stream(s)
        elif ftype == SYN_REPLY:
            self._count_in("SYN_REPLY")
            self._inflate_block(payload[4:])  # keep the zlib context in step; we open no streams
        elif ftype == HEADERS:
            self._count_in("HEADERS")
            (stream_id,) = struct.unpack_from(">I", payload, 0)
            self._inflate_block(payload[4:])
            s = self.streams.get(stream_id & 0x7FFFFFFF)
            if s and flags & FLAG_FIN:
                s.remote_fin = True
                s._remote_done()
        elif ftype == RST_STREAM:
            self._count_in("RST_STREAM")
            stream_id, _status = struct.unpack_from(">II", payload, 0)
            s = self.streams.get(stream_id & 0x7FFFFFFF)
            if s:
                s.reset_received = True
                s.local_fin = True  # nothing more may be sent on it
                s._remote_done()
        elif ftype == SETTINGS:
            self._count_in("SETTINGS")
            (n,) = struct.unpack_from(">I", payload, 0)
            for i in range(n):
                idf, value = struct.unpack_from(">II", payload, 4 + 8 * i)
                if idf & 0xFFFFFF == SETTINGS_INITIAL_WINDOW_SIZE:
                    self.peer_initial_window = value
        elif ftype == PING:
            self._count_in("PING")
            (ping_id,) = struct.unpack_from(">I", payload, 0)
            if ping_id % 2 == 1:  # the client's: echo it, as spdystream does
                await self._send(self._control(PING, 0, 4, payload[:4]), "PING")
        elif ftype == WINDOW_UPDATE:
            self._count_in("WINDOW_UPDATE")  # noted, never waited for (see the top of the file)
        else:
            self._count_in("type%d" % ftype)

    async def _data_frame(self, stream_id, flags, data):
        s = self.streams.get(stream_id)
        if s is None or s.remote_fin or s.reset_received or s.inbox._eof:
            return  # spdystream drops data for streams it does not know
        if data:
            # back-pressure: a stream whose reader is behind holds up the connection,
            # as spdystream's unbuffered per-stream channel does
            await s.inbox.wait_below_low()
            s.inbox.feed(data)
        if flags & FLAG_FIN:
            s.remote_fin = True
            s._remote_done()
