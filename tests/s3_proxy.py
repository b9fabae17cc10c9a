"""A fault-injecting HTTP proxy in front of the local S3 server (127.0.0.1 only).

Requests pass through unchanged, except those that a rule picks: a rule matches a method and a
substring of the path and either drops the connection half-way through the request body
("drop"), answers an S3 error without forwarding ("refuse"), or waits before forwarding
("slow"). `times` bounds how often a rule fires (None: always). Closing the proxy ends a
"slow" wait at once: the held request is forwarded then, not after the rest of its delay.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class Rule:
    action: str  # "drop", "refuse" or "slow"
    method: str = "PUT"
    contains: str = ""
    times: int | None = None
    seconds: float = 0.0
    status: int = 503
    code: str = "SlowDown"
    fired: int = 0


class Proxy:
    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream).netloc
        self.rules: list[Rule] = []
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.idle = threading.Condition(self.lock)
        self.closing = threading.Event()  # ends the waits of "slow" rules
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _body(self) -> bytes:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    raw = b""
                    while True:
                        line = self.rfile.readline()
                        raw += line
                        size = int(line.split(b";")[0].strip() or b"0", 16)
                        chunk = self.rfile.read(size + 2)
                        raw += chunk
                        if size == 0:
                            while chunk not in (b"\r\n", b""):
                                chunk = self.rfile.readline()
                                raw += chunk
                            return raw
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _handle(self) -> None:
                with proxy.lock:
                    proxy.in_flight += 1
                try:
                    self._forward()
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1
                        proxy.idle.notify_all()

            def _forward(self) -> None:
                rule = proxy.pick(self.command, self.path)
                if rule is not None and rule.action == "drop":
                    length = int(self.headers.get("Content-Length") or 0)
                    self.rfile.read(min(length // 2, 1 << 16))
                    self.close_connection = True
                    self.connection.shutdown(2)
                    return
                body = self._body()
                if rule is not None and rule.action == "refuse":
                    xml = (
                        f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{rule.code}</Code>"
                        f"<Message>injected</Message></Error>"
                    ).encode()
                    self.send_response(rule.status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.end_headers()
                    self.wfile.write(xml)
                    return
                if rule is not None and rule.action == "slow":
                    proxy.closing.wait(rule.seconds)
                conn = http.client.HTTPConnection(proxy.upstream, timeout=60)
                conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    conn.putheader(name, value)
                conn.endheaders(body or None)
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                length = str(len(data))
                for name, value in response.getheaders():
                    if name.lower() == "content-length" and self.command == "HEAD":
                        length = value  # the object's size, with no body
                    elif name.lower() not in ("transfer-encoding", "content-length", "connection"):
                        self.send_header(name, value)
                self.send_header("Content-Length", length)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"

    def pick(self, method: str, path: str) -> Rule | None:
        with self.lock:
            self.requests.append((method, path))
            for rule in self.rules:
                fires = rule.times is None or rule.fired < rule.times
                if rule.method == method and rule.contains in path and fires:
                    rule.fired += 1
                    return rule
        return None

    def close(self) -> None:
        """Stop serving once every request already received has reached the server: a killed
        client's last upload may still be on its way upstream, and a test that lists the bucket
        right after must see the final state. A request a "slow" rule holds goes on now."""
        self.closing.set()
        with self.lock:
            self.idle.wait_for(lambda: self.in_flight == 0, timeout=30)
        self.server.shutdown()
        self.server.server_close()
