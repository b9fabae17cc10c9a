"""A hub name behind a proxy that refuses, never answers or cannot reach the hub: one error line
within seconds, not the hub client's minute of retries and a line per retry.

Every address here is 127.0.0.1: the hub's endpoint is a closed local port, the proxies are
local sockets (one that refuses, one that accepts and never answers, one that answers a status).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import python_script

pytest.importorskip("huggingface_hub")
pytest.importorskip("transformers")

from packer.tokenize import loading  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROXY_VARS = [
    v for n in ("https", "http", "all", "no") for v in (f"{n}_proxy", f"{n.upper()}_PROXY")
]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def silent_proxy():
    """A port that accepts connections (the kernel's backlog) and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(16)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


class AnsweringProxy:
    """Answers every request with one status line and keeps what it was asked."""

    def __init__(self, status: str):
        self.status = status
        self.requests: list[bytes] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.requests.append(data)
                conn.sendall(f"HTTP/1.1 {self.status}\r\nContent-Length: 0\r\n\r\n".encode())

    def close(self):
        self.sock.close()


@pytest.fixture
def answering():
    proxies = []

    def make(status: str) -> AnsweringProxy:
        proxies.append(AnsweringProxy(status))
        return proxies[-1]

    yield make
    for p in proxies:
        p.close()


@pytest.fixture
def hub(monkeypatch):
    """The hub's endpoint at a closed local port, no proxy and not offline; returns a setter
    for the endpoint and the proxy variables."""
    import huggingface_hub.constants

    for name in PROXY_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    port = closed_port()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"https://127.0.0.1:{port}")

    def use(endpoint: str | None = None, **proxies: str):
        if endpoint is not None:
            monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
        for name, value in proxies.items():
            monkeypatch.setenv(name, value)

    use.port = port
    return use


def test_a_refusing_proxy_is_unreachable(hub):
    refused = closed_port()
    hub(HTTPS_PROXY=f"http://127.0.0.1:{refused}")
    assert loading.hub_unreachable() == f"the proxy http://127.0.0.1:{refused}: Connection refused"


def test_a_silent_proxy_is_unreachable_after_the_probe_seconds(hub, silent_proxy):
    hub(https_proxy=silent_proxy)
    start = time.monotonic()
    reason = loading.hub_unreachable()
    seconds = time.monotonic() - start
    assert reason == f"the proxy {silent_proxy}: no answer in {loading.HUB_PROBE_SECONDS:g} s"
    assert loading.HUB_PROBE_SECONDS - 0.5 < seconds < loading.HUB_PROBE_SECONDS + 3


def test_a_proxy_that_cannot_reach_the_hub_is_unreachable(hub, answering):
    proxy = answering("502 Bad Gateway")
    hub(ALL_PROXY=proxy.url)
    assert loading.hub_unreachable() == (
        f"the proxy {proxy.url}: answered 'HTTP/1.1 502 Bad Gateway' to "
        f"CONNECT 127.0.0.1:{hub.port}"
    )
    assert proxy.requests[0].startswith(f"CONNECT 127.0.0.1:{hub.port} HTTP/1.1\r\n".encode())


def test_a_proxy_that_tunnels_is_reachable_and_gets_the_credentials(hub, answering):
    proxy = answering("200 Connection established")
    hub(HTTPS_PROXY=proxy.url.replace("http://", "http://us%40er:s3cret@"))
    assert loading.hub_unreachable() is None
    assert b"Proxy-Authorization: Basic dXNAZXI6czNjcmV0\r\n" in proxy.requests[0]  # us@er:s3cret


def test_a_message_never_shows_the_proxy_credentials(hub, answering):
    proxy = answering("407 Proxy Authentication Required")
    hub(HTTPS_PROXY=proxy.url.replace("http://", "http://user:s3cret@"))
    reason = loading.hub_unreachable()
    assert reason.startswith(f"the proxy {proxy.url}: answered 'HTTP/1.1 407 Proxy") and (
        "s3cret" not in reason
    )


def test_an_http_hub_is_asked_through_the_proxy_as_the_client_asks(hub, answering, silent_proxy):
    proxy = answering("404 Not Found")  # an answer from the hub itself: reachable
    port = closed_port()
    hub(f"http://127.0.0.1:{port}", HTTP_PROXY=proxy.url, HTTPS_PROXY=silent_proxy)
    assert loading.hub_unreachable() is None
    assert proxy.requests[0].startswith(f"HEAD http://127.0.0.1:{port}/ HTTP/1.1\r\n".encode())


def test_no_proxy_goes_straight_to_the_hub(hub, silent_proxy):
    hub(HTTPS_PROXY=silent_proxy, NO_PROXY="127.0.0.1")
    assert loading.hub_unreachable() == f"127.0.0.1:{hub.port}: Connection refused"


def test_the_hub_clients_warnings_stay_off_stderr():
    res = python_script(
        "from huggingface_hub.utils import logging\n"
        "from packer.tokenize.loading import quiet_hub\n"
        "http = logging.get_logger('huggingface_hub.utils._http')\n"
        "http.warning('Retrying in 1s [Retry 1/5].')\n"
        "with quiet_hub():\n"
        "    http.warning('Retrying in 2s [Retry 2/5].')\n"
        "    http.error('a real error')\n"
        "http.warning('after')\n"
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr == "Retrying in 1s [Retry 1/5].\na real error\nafter\n"


@pytest.mark.slow  # 8-17 s each under load: the probes above run in `make check`
@pytest.mark.parametrize("kind", ["refusing", "silent"])
def test_tokenize_behind_an_unreachable_proxy_is_one_line_in_seconds(kind, tmp_path, silent_proxy):
    """The command as a user runs it: HTTPS_PROXY set, no HF_HUB_OFFLINE, an empty cache."""
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    proxy = f"http://127.0.0.1:{closed_port()}" if kind == "refusing" else silent_proxy
    env = {k: v for k, v in os.environ.items() if k.lower() not in PROXY_VARS}
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(name, None)
    env.update(
        HTTPS_PROXY=proxy,
        HF_ENDPOINT=f"https://127.0.0.1:{closed_port()}",
        HF_HOME=str(tmp_path / "hf"),
        PYTHONPATH=str(ROOT),
    )
    start = time.monotonic()
    res = subprocess.run(
        [sys.executable, "-m", "packer", "tokenize", str(chats)]
        + ["--tokenizer", "some-org/some-model", "-o", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        env=env,
        timeout=150,
    )
    seconds = time.monotonic() - start
    why = "Connection refused" if kind == "refusing" else "no answer in"
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith(
        "error: --tokenizer: some-org/some-model is not a local directory and cannot be loaded "
        f"from the Hugging Face hub: the hub is unreachable (the proxy {proxy}: {why}"
    ), res.stderr
    assert len(res.stderr.splitlines()) == 1, res.stderr
    assert not (tmp_path / "out").exists()
    assert seconds < 30, seconds  # 50 s and 22 retry lines behind a refusing proxy before
