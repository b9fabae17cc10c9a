"""A store that cannot be reached: one line within the retry budget, and signals stop the wait.

Each store is pointed at a closed port on 127.0.0.1 (connections refused; no test reaches
another address): `s3://` through `AWS_ENDPOINT_URL`, `gs://` through pyarrow's GCS with an
anonymous client and an http endpoint override. The signal tests' port instead accepts each
connection and closes it at once, counting them: the signal goes once the client has retried.
Real `packer` processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import foreground

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="uses POSIX signals")


@pytest.fixture
def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def dropping_port():
    """(port, accepted connection count) of a listener on 127.0.0.1 that closes every
    connection it accepts: a client sees an empty reply and retries."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    accepted = []

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed below
                return
            accepted.append(1)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        with contextlib.suppress(OSError):
            server.shutdown(socket.SHUT_RDWR)  # wakes the thread's accept
        server.close()


def store_args(protocol: str, port: int) -> tuple[list[str], dict]:
    """(extra pack arguments, environment) pointing `protocol` at the closed port."""
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    if protocol == "s3":
        return [], env
    options = ["anonymous=true", f"endpoint_override=127.0.0.1:{port}", "scheme=http"]
    return [a for o in options for a in ("--storage-option", o)], env


def start(protocol: str, port: int, tmp_path: Path, **env_extra) -> subprocess.Popen:
    extra, env = store_args(protocol, port)
    return subprocess.Popen(
        [sys.executable, "-m", "packer", "pack", f"{protocol}://bkt/corpus/x.jsonl"]
        + ["-o", str(tmp_path / "out"), "-L", "128", *extra],
        env={**env, **env_extra},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=foreground,
    )


@pytest.mark.parametrize("protocol", ["s3", "gs"])
def test_an_unreachable_store_is_one_line_within_the_retry_budget(protocol, closed_port, tmp_path):
    if protocol == "gs":
        pytest.importorskip("pyarrow.fs").GcsFileSystem  # noqa: B018 (pyarrow built with GCS)
    t = time.monotonic()
    proc = start(protocol, closed_port, tmp_path, PACKER_STORAGE_RETRY_SECONDS="3")
    out, err = proc.communicate(timeout=120)
    seconds = time.monotonic() - t
    assert proc.returncode == 1, err
    assert err == (
        f"error: {protocol}://bkt/corpus/x.jsonl: cannot reach the storage endpoint (is it "
        "running, is the URL right?)\n"
    )
    assert out == "" and not (tmp_path / "out").exists()
    assert seconds < 60, seconds  # start-up included; GCS's unbounded default took 15 minutes


# GCS's retries are a time (the hang this guards against); S3's a count of attempts, over in
# seconds (the test above)
@pytest.mark.parametrize(
    ("protocol", "signum", "code"), [("gs", signal.SIGTERM, 143), ("gs", signal.SIGINT, 130)]
)
def test_a_signal_during_the_retries_stops_the_run_at_once(
    protocol, signum, code, dropping_port, tmp_path
):
    if protocol == "gs":
        pytest.importorskip("pyarrow.fs").GcsFileSystem  # noqa: B018
    port, accepted = dropping_port
    # retries that would last ten minutes: only the signal can end the run early
    proc = start(protocol, port, tmp_path, PACKER_STORAGE_RETRY_SECONDS="600")
    deadline = time.monotonic() + 120
    while len(accepted) < 2:  # start-up, a request, then inside the client's retries
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
        time.sleep(0.05)
    t = time.monotonic()
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - t < 5
    word = "terminated" if code == 143 else "interrupted"
    assert (proc.returncode, err) == (code, f"error: {word}; no partial output was left\n")


def test_gcs_retries_are_bounded_by_default(monkeypatch):
    pafs = pytest.importorskip("pyarrow.fs")
    if not hasattr(pafs, "GcsFileSystem"):
        pytest.skip("pyarrow without GCS")
    from packer.storage import set_options, stores

    monkeypatch.delenv("PACKER_STORAGE_RETRY_SECONDS", raising=False)
    set_options({"anonymous": "true", "endpoint_override": "127.0.0.1:9", "scheme": "http"})
    try:
        store = stores.store_for(stores.Url("gs", "bkt/x"))
        assert store.fs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 15
    finally:
        set_options(None)


def test_a_hub_tokenizer_without_network_fails_fast(closed_port, tmp_path):
    pytest.importorskip("transformers")
    chats = tmp_path / "chats.jsonl"
    chats.write_text('{"messages": [{"role": "user", "content": "hi"}]}\n')
    proxies = {"HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"}
    env = {k: v for k, v in os.environ.items() if k not in proxies and k != "HF_HUB_OFFLINE"}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{closed_port}", HF_HOME=str(tmp_path / "hf"))
    env["PYTHONPATH"] = str(ROOT)
    t = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "packer", "tokenize", str(chats)]
        + ["--tokenizer", "some-org/some-model", "-o", str(tmp_path / "t")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    seconds = time.monotonic() - t
    assert r.returncode == 2, r.stderr
    assert r.stderr.startswith(
        "error: --tokenizer: some-org/some-model is not a local directory and cannot be loaded "
        f"from the Hugging Face hub: the hub is unreachable (127.0.0.1:{closed_port}"
    ), r.stderr
    assert len(r.stderr.splitlines()) == 1
    assert not (tmp_path / "t").exists()
    assert seconds < 40, seconds  # the client's own retries took 72 s


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_a_stalled_s3_request_exits_at_once(signum, code, s3, tmp_path):
    pytest.importorskip("moto")
    from s3_proxy import Proxy, Rule

    s3.client.put_object(Bucket=s3.bucket, Key="x.jsonl", Body=b'{"input_ids": [1, 2]}\n' * 50)
    proxy = Proxy(s3.endpoint)
    proxy.rules.append(Rule("slow", method="GET", contains="x.jsonl", seconds=40))
    stage = tmp_path / "stage"
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "packer", "pack", s3.url("x.jsonl")]
            + ["-o", str(tmp_path / "out"), "-L", "64"],
            env={
                **os.environ,
                "PYTHONPATH": str(ROOT),
                "AWS_ENDPOINT_URL": proxy.endpoint,
                "PACKER_STAGE_DIR": str(stage),
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=foreground,
        )
        deadline = time.monotonic() + 60
        while not any(m == "GET" and "x.jsonl" in p for m, p in proxy.requests):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)  # inside the request the proxy holds for 40 s
        t = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=60)
        seconds = time.monotonic() - t
    finally:
        proxy.close()
    word = "terminated" if code == 143 else "interrupted"
    assert (proc.returncode, err) == (code, f"error: {word}; no partial output was left\n")
    assert seconds < 5, seconds  # pyarrow's S3 finalizer would wait for the request (40 s)
    assert list(stage.iterdir()) == [] and not (tmp_path / "out").exists()
