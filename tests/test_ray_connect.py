"""`--engine ray --ray-address` where no Ray cluster answers: one line and exit 2 within seconds.

ray.init waits for minutes on an address where something else listens (deaf to SIGTERM, printing
Ray's own log lines); packer probes the address first. Every server here is a local socket on
127.0.0.1, and every run is bounded in time.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from conftest import make_samples, write_jsonl

pytest.importorskip("ray")

LIMIT = 60  # seconds: ray.init itself would wait far longer than this


@pytest.fixture
def sample(tmp_path) -> Path:
    return write_jsonl(tmp_path / "s.jsonl", make_samples(50, seed=1))


def pack_on(address: str, sample: Path, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "packer", "pack", str(sample), "-o", str(out), "-L", "512"]
        + ["--engine", "ray", "--ray-address", address],
        capture_output=True,
        text=True,
        timeout=LIMIT,
    )
    return r, time.monotonic() - t


@pytest.fixture
def silent():
    """A listening socket that never answers (the kernel accepts the connections)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield f"127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def http():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def closed():
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"127.0.0.1:{port}"


def test_a_silent_server_is_one_line_in_seconds(silent, sample, tmp_path):
    r, seconds = pack_on(silent, sample, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert r.stderr == (
        f"error: --ray-address {silent}: no Ray cluster answers there "
        "(it accepted the connection but sent nothing in 5 s)\n"
    )
    assert seconds < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_an_http_server_is_one_line(http, scheme, sample, tmp_path):
    r, seconds = pack_on(scheme + http, sample, tmp_path / "out")
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(
        f"error: --ray-address {scheme}{http}: no Ray cluster answers there (it answers '"
    )
    assert r.stderr.endswith(", not gRPC)\n") and r.stderr.count("\n") == 1
    assert seconds < 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_an_address_nothing_listens_on_is_one_line(closed, sample, tmp_path):
    r, _ = pack_on(closed, sample, tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr == (
        f"error: --ray-address {closed}: no Ray cluster answers there (connection refused)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]


def test_a_malformed_address_is_one_line(sample, tmp_path):
    r, _ = pack_on("127.0.0.1", sample, tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr == (
        "error: --ray-address must be auto, host:port or ray://host:port, got '127.0.0.1'\n"
    )


def test_the_probe_waits_no_longer_than_its_timeout(silent):
    from packer.engines.ray import probe
    from packer.errors import UsageError

    t = time.monotonic()
    with pytest.raises(UsageError, match=r"sent nothing in 0\.5 s"):
        probe(silent, timeout=0.5)
    assert time.monotonic() - t < 3


def test_auto_probes_ray_address_from_the_environment(closed, sample, tmp_path, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", closed)
    r, _ = pack_on("auto", sample, tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr == (
        f"error: --ray-address auto (RAY_ADDRESS={closed}): no Ray cluster answers there "
        "(connection refused)\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.jsonl"]
