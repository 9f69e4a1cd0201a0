"""A real S3-protocol server on 127.0.0.1 for the tests and benchmarks, and a fault-injecting proxy.

:class:`S3Server` runs moto's server (``moto[server]``) in a subprocess bound to
127.0.0.1 and stops it; clients reach it through ``s3fs`` with dummy credentials.
:class:`FaultProxy` is a small HTTP proxy in front of it that answers a share of
requests 503 SlowDown, resets connections in the middle of a body, delays
responses, and counts the requests and body bytes it forwards (what a node
fetched). Faults are drawn from a seeded generator, one draw per request.
"""

from __future__ import annotations

import http.client
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

KEY = "zephon-test-key-id"
SECRET = "zephon-TEST-secret-0123456789abcdef"  # a dummy: grepped for in every output


def _die_with_parent() -> None:
    """In the child before exec: a SIGTERM when the process that started it dies (Linux), so a
    killed test run leaves no server behind."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto's S3 server in a subprocess on 127.0.0.1 (a context manager: started, then stopped)."""

    def __init__(self, deadline: float = 60.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent,
        )
        end = time.monotonic() + deadline
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=5).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    self.stop()
                    raise RuntimeError(f"moto's S3 server did not start on {self.url}") from None
                time.sleep(0.1)

    def options(self, endpoint: str | None = None, **extra) -> dict:
        """``storage_options`` for s3fs: dummy credentials, this server (or ``endpoint``)."""
        return {"key": KEY, "secret": SECRET, "endpoint_url": endpoint or self.url, **extra}

    def filesystem(self):
        import s3fs

        return s3fs.S3FileSystem(**self.options(), skip_instance_cache=True)

    def set_auth(self, free_requests: float) -> None:
        """Check credentials (moto's IAM) after ``free_requests`` more requests; ``inf``: never."""
        req = urllib.request.Request(f"{self.url}/moto-api/reset-auth", data=str(free_requests).encode(),
                                     headers={"Content-Type": "text/plain"}, method="POST")
        urllib.request.urlopen(req, timeout=10).read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def __enter__(self) -> S3Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


_SLOWDOWN = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class FaultProxy:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` injecting faults into GET and HEAD.

    Each request draws once: with probability ``slowdown`` it is answered 503 SlowDown,
    with ``reset`` it is forwarded and its connection reset halfway through the body,
    with ``cut`` its connection closed cleanly halfway through the body (the client has
    that half), with ``delay`` it waits ``delay_s`` first. ``requests``, ``body_bytes`` and
    ``faults`` count what passed, ``methods`` the requests per HTTP method and
    ``connections`` the connections accepted (read them between runs; :meth:`reset_counts`).
    """

    def __init__(self, upstream: str, *, slowdown: float = 0.0, reset: float = 0.0, cut: float = 0.0,
                 delay: float = 0.0, delay_s: float = 0.2, seed: int = 0) -> None:
        self.upstream = upstream.removeprefix("http://")
        self.slowdown, self.reset, self.cut, self.delay, self.delay_s = slowdown, reset, cut, delay, delay_s
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.local = threading.local()  # one upstream connection per handler thread, kept
        self.reset_counts()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                # a response's head and body are two writes: sent at once, as a store does
                self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                with proxy.lock:
                    proxy.connections += 1

            def _any(self) -> None:
                proxy.handle(self)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def reset_counts(self) -> None:
        with self.lock:
            self.requests = 0
            self.connections = 0
            self.body_bytes = 0
            self.faults = {"slowdown": 0, "reset": 0, "cut": 0, "delay": 0}
            self.methods: Counter[str] = Counter()

    def _draw(self, method: str) -> str | None:
        with self.lock:
            self.requests += 1
            self.methods[method] += 1
            if method not in ("GET", "HEAD"):
                return None
            x = self.rng.random()
            for name, share in (("slowdown", self.slowdown), ("reset", self.reset), ("cut", self.cut),
                                ("delay", self.delay)):
                if x < share:
                    self.faults[name] += 1
                    return name
                x -= share
        return None

    def handle(self, h: BaseHTTPRequestHandler) -> None:
        length = int(h.headers.get("Content-Length") or 0)
        body = h.rfile.read(length) if length else None
        fault = self._draw(h.command)
        if fault == "slowdown":
            h.send_response(503)
            h.send_header("Content-Type", "application/xml")
            h.send_header("Content-Length", str(len(_SLOWDOWN)))
            h.end_headers()
            if h.command != "HEAD":
                h.wfile.write(_SLOWDOWN)
            return
        if fault == "delay":
            time.sleep(self.delay_s)
        headers = {k: v for k, v in h.headers.items() if k.lower() not in _HOP}
        for attempt in range(2):  # a kept connection the server closed meanwhile: a new one
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.upstream, timeout=60)
            try:
                conn.request(h.command, h.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
        h.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in _HOP and k.lower() != "content-length":
                h.send_header(k, v)
        sent = len(data) if h.command != "HEAD" else 0
        h.send_header("Content-Length", resp.getheader("Content-Length") or str(len(data)))
        if fault in ("reset", "cut") and sent > 1:
            with self.lock:  # counted before it is sent: the client may look once it has it
                self.body_bytes += sent // 2
            h.end_headers()
            h.wfile.write(data[: sent // 2])
            h.wfile.flush()
            if fault == "reset":  # an abortive close: the peer sees a connection reset mid-body
                h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.close_connection = True
            return
        with self.lock:
            self.body_bytes += sent
        h.end_headers()
        if sent:
            h.wfile.write(data)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
