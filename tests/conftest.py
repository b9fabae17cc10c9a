"""Shared fixtures: datasets written to tmp dirs in every input format, and a CLI runner."""

from __future__ import annotations

import gzip
import json
import logging
import os
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from packer.cli import app

# A run that takes over 10 s on a loaded machine prints a progress line into stderr, which the
# tests that check an error is one line would count: tests that want progress lines ask for them.
os.environ.setdefault("PACKER_PROGRESS_INTERVAL", "3600")


def make_samples(
    n: int = 200,
    seed: int = 0,
    median: int = 60,
    max_len: int | None = None,
    vocab: int = 1000,
    with_labels: bool = True,
) -> list[dict]:
    """Random tokenized samples; labels mask a prompt prefix with -100 like SFT data."""
    rng = np.random.default_rng(seed)
    lengths = np.maximum(1, np.round(rng.lognormal(np.log(median), 0.8, n))).astype(int)
    if max_len is not None:
        lengths = np.minimum(lengths, max_len)
    samples = []
    for length in lengths:
        ids = rng.integers(0, vocab, size=length).tolist()
        sample = {"input_ids": ids}
        if with_labels:
            prompt = int(rng.integers(0, length))
            sample["labels"] = [-100] * prompt + ids[prompt:]
        samples.append(sample)
    return samples


def write_jsonl(path: Path, samples: list[dict], compress: str | None = None) -> Path:
    text = "".join(json.dumps(s) + "\n" for s in samples).encode()
    if compress == "gzip":
        path.write_bytes(gzip.compress(text, mtime=0))
    elif compress == "zstd":
        with pa.output_stream(str(path), compression="zstd") as out:
            out.write(text)
    else:
        path.write_bytes(text)
    return path


@pytest.fixture(scope="session", autouse=True)
def signals_as_in_a_terminal():
    """The tests' process takes Ctrl-C and SIGTERM as a terminal's foreground job does. A run
    started in the background by a non-interactive shell (`make test &`, a script's `cmd &`)
    inherits SIGINT ignored, and Python then installs no handler of its own: the tests of what
    packer does with a caller's Ctrl-C would test an ignored signal instead (the tests of a
    caller's SIG_IGN set it themselves)."""
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    yield


def python_script(script: str, **kwargs):
    """`python -c SCRIPT` with this checkout's packer, its output captured as text."""
    import subprocess

    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, **kwargs
    )


def foreground() -> None:
    """A `preexec_fn` for a command a test signals: SIGINT and SIGTERM at their defaults and no
    signal blocked, as a shell starts a foreground job, whatever the test process inherited or
    a library in it left (a child inherits ignored and blocked signals)."""
    import signal

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, set())


def to_table(samples: list[dict], int_type=pa.int32()) -> pa.Table:
    cols = {"input_ids": pa.array([s["input_ids"] for s in samples], pa.list_(int_type))}
    if samples and "labels" in samples[0]:
        cols["labels"] = pa.array([s["labels"] for s in samples], pa.list_(int_type))
    return pa.table(cols)


def write_parquet(path: Path, samples: list[dict], int_type=pa.int32()) -> Path:
    pq.write_table(to_table(samples, int_type), path)
    return path


def write_arrow(path: Path, samples: list[dict], stream: bool = False) -> Path:
    table = to_table(samples)
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as writer:
            writer.write_table(table)
    return path


def pytest_itemcollected(item: pytest.Item) -> None:
    """A test that uses the Ray `cluster` is marked `ray`, one that uses the local S3 server
    `storage`: `make check` leaves them to `make test`, as it leaves the `slow` ones."""
    fixtures = getattr(item, "fixturenames", ())
    if "cluster" in fixtures:
        item.add_marker(pytest.mark.ray)
    if "s3_server" in fixtures:  # also every test that uses `s3`
        item.add_marker(pytest.mark.storage)


def _xdist_groups(item: pytest.Item) -> list[str]:
    marks = item.iter_markers("xdist_group")
    return sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in marks})


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """`--dist loadgroup`, as `make test` runs it: the tests of an xdist group on one worker.

    pytest-xdist 3.8 tags a group by rewriting `item._nodeid`, which pytest 9 no longer reads
    (the id lives in `item._id`): each group was spread over every worker, and with it a Ray
    cluster and each module fixture built once per worker. The tag is added here where xdist's
    did not take; xdist then hands the groups out first (largest first, `--loadscope-reorder`).
    A test that uses the Ray `cluster` is in the group "ray" whatever its module's group, so
    the session starts one cluster (test_commit_signals.py's Ray test started a second one on
    the other worker).
    """
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = ["ray"] if "cluster" in getattr(item, "fixturenames", ()) else _xdist_groups(item)
        if names and "@" not in item.nodeid:
            tagged = f"{item.nodeid}@{'_'.join(names)}"
            if hasattr(item, "_id"):
                item._id = type(item._id).parse(tagged)
            else:
                item._nodeid = tagged


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def cli(runner):
    """Invoke the real CLI in-process; returns click's Result (exit_code, stdout, stderr)."""

    def invoke(*args: str):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)

    return invoke


def read_shards(out_dir: Path) -> pa.Table:
    """All shards of a packer output, in manifest order, as one table."""
    manifest = json.loads((out_dir / "manifest.json").read_text())
    tables = []
    for shard in manifest["shards"]:
        with pa.memory_map(str(out_dir / shard["file"])) as src:
            tables.append(pa.ipc.open_stream(src).read_all())
    return pa.concat_tables(tables)


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch's CPU threads spin against each other on a loaded 2-core machine (40x slower)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def readers():
    """The readers' virtualenv's python (built once by scripts/readers_venv.py), for the tests
    that run a consumer's own reader on packer's exports; skipped where it cannot be built."""
    from export_checks import readers_python

    python = readers_python()
    if python is None:
        pytest.skip("the readers' virtualenv (scripts/readers_venv.py) cannot be built here")
    return python


@pytest.fixture(scope="session")
def cluster():
    """A Ray cluster of three raylets with one CPU each, on this machine (tests that use it are
    kept in the xdist group "ray": one cluster per test process)."""
    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": 80 << 20, "include_dashboard": False},
    )
    for _ in range(2):
        c.add_node(num_cpus=1, object_store_memory=80 << 20)
    c.wait_for_nodes()
    yield c.address
    c.shutdown()


# --------------------------------------------------------------------------------------------
# A local S3 server (moto in server mode on 127.0.0.1), reached over HTTP by the real clients


@pytest.fixture(scope="session")
def s3_server() -> str:
    """One moto S3 server for the test session (per xdist worker); its endpoint URL."""
    moto_server = pytest.importorskip("moto.server")
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    server._server.handle_error = _server_error_to_real_stderr
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


def _server_error_to_real_stderr(request, client_address) -> None:
    """The server thread's report of a dropped connection (a client killed by a test) goes to
    the process's own stderr: socketserver prints it to `sys.stderr`, which typer's runner has
    replaced meanwhile in the same process, so it landed inside a CLI test's stderr."""
    import traceback

    print(f"moto server: error on a request from {client_address}", file=sys.__stderr__)
    traceback.print_exc(file=sys.__stderr__)


class S3:
    """The bucket `bkt` on the local server, through boto3, for tests to set up and look at."""

    bucket = "bkt"

    def __init__(self, endpoint: str):
        import boto3

        self.endpoint = endpoint
        self.client = boto3.client("s3", endpoint_url=endpoint)

    def url(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def put_dir(self, local: Path, prefix: str) -> str:
        """Upload every file below `local` under `prefix`; the prefix's URL."""
        for path in sorted(p for p in local.rglob("*") if p.is_file()):
            key = f"{prefix}/{path.relative_to(local).as_posix()}"
            self.client.upload_file(str(path), self.bucket, key)
        return self.url(prefix)

    def keys(self, prefix: str = "") -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix
        )
        return sorted(o["Key"] for page in pages for o in page.get("Contents", []))

    def get(self, key: str) -> bytes:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read()

    def manifest(self, prefix: str) -> dict:
        return json.loads(self.get(f"{prefix}/manifest.json"))


def moto_api(endpoint: str, path: str, body: bytes = b"") -> None:
    import urllib.request

    request = urllib.request.Request(
        endpoint + path, data=body, method="POST", headers={"Content-Type": "text/plain"}
    )
    urllib.request.urlopen(request).read()


@pytest.fixture
def s3(s3_server, monkeypatch, tmp_path) -> S3:
    """An empty server with the bucket `bkt`; the AWS_* environment points every client at it
    (subprocesses too), with no profile or config file of the machine's."""
    from packer.storage import set_options

    moto_api(s3_server, "/moto-api/reset")
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "AWS_ENDPOINT_URL": s3_server,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing-secret",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        "AWS_EC2_METADATA_DISABLED": "true",
        "PACKER_CACHE_DIR": str(tmp_path / "packer-cache"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    set_options(None)  # also forgets the stores opened with another environment
    store = S3(s3_server)
    store.client.create_bucket(Bucket=S3.bucket)
    yield store
    set_options(None)
