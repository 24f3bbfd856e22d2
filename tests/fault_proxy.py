"""A small HTTP proxy in front of a real ``mlflow server`` that injects the faults of a sick network or server.

    proxy = FaultProxy(server.url).start(); proxy.hang_after = 3   # requests 4, 5, … are read and never answered

Every request is forwarded to the server unless a fault applies to it (checked in this order):

- ``hang_on``: once a request whose path holds this text arrives, it and every later request hang;
- ``hang_after``: requests after the first N hang (0: accept-and-never-answer from the start);
- ``error_every``: every K-th request is answered ``500`` without reaching the server;
- ``error_burst``: ``(text, n)``: the first n requests whose path holds the text are answered ``500``;
- ``delay_s``: every forwarded request waits this long first (a slow server, or one behind a slow proxy).

A hung request is read, then held until :meth:`heal` or :meth:`stop`; ``hung`` counts them and ``paths`` lists
what arrived, so a test waits for a hang with ``wait_until`` instead of sleeping.
"""

from __future__ import annotations

import http.client
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 (a free port) to ``upstream``, with faults set by attributes."""

    def __init__(self, upstream: str):
        self.upstream = urllib.parse.urlsplit(upstream)
        self.hang_on: str | None = None
        self.hang_after: int | None = None
        self.error_every = 0
        self.error_burst: tuple[str, int] | None = None
        self.delay_s = 0.0
        self.paths: list[str] = []
        self.hung = 0
        self._hanging = False
        self._release = threading.Event()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FaultProxy:
        """Serve in a daemon thread."""
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    def forward_to(self, upstream: str) -> None:
        """Send the next requests to another server at the same address: a server restarted on another database."""
        self.upstream = urllib.parse.urlsplit(upstream)

    def heal(self) -> None:
        """No more faults: held requests are dropped (their clients time out or retry), new ones are forwarded."""
        with self._lock:
            self.hang_on, self.hang_after, self.error_every, self._hanging = None, None, 0, False
            self.error_burst, self.delay_s = None, 0.0
            released, self._release = self._release, threading.Event()
        released.set()

    def stop(self) -> None:
        """Stop serving and let every held request go."""
        self._release.set()
        self._server.shutdown()
        self._server.server_close()

    def _fault(self, path: str) -> str | None:
        with self._lock:
            self.paths.append(path)
            count = len(self.paths)
            if self.hang_on is not None and self.hang_on in path:
                self._hanging = True
            if self._hanging or (self.hang_after is not None and count > self.hang_after):
                self.hung += 1
                return "hang"
            if self.error_every and count % self.error_every == 0:
                return "error"
            if self.error_burst and self.error_burst[0] in path and self.error_burst[1] > 0:
                self.error_burst = (self.error_burst[0], self.error_burst[1] - 1)
                return "error"
        return None

    def _handler(self):
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet: the test reads ``paths``
                pass

            def _relay(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                fault = proxy._fault(self.path)
                if fault == "hang":
                    proxy._release.wait()  # the event of the moment it hung: a later heal() lets it go
                    self.close_connection = True
                    return
                if fault == "error":
                    payload = b'{"error_code": "INTERNAL_ERROR", "message": "injected by the fault proxy"}'
                    self.send_response(500)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if proxy.delay_s:
                    proxy._release.wait(proxy.delay_s)  # a slow answer; heal() or stop() cut it short
                upstream = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=120)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
                upstream.request(self.command, self.path, body=body, headers=headers)
                answer = upstream.getresponse()
                payload = answer.read()
                self.send_response(answer.status)
                for key, value in answer.getheaders():
                    if key.lower() not in _HOP_HEADERS:
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                upstream.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _relay

        return Handler
