"""Object storage end to end: `s3://` in and out through a local S3 server (moto, 127.0.0.1).

Every run goes over HTTP through the real clients (pyarrow's S3, boto3). The outputs are read
back from the server and compared with the same run on local disk, byte for byte; faults are
injected by a proxy in front of the server (`s3_proxy`) and by killing a run mid-upload.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from conftest import make_samples, moto_api, read_shards, write_jsonl, write_parquet

pytest.importorskip("boto3")
pytest.importorskip("moto")

ROOT = Path(__file__).resolve().parent.parent
PACK = ["-L", "256", "--overlength", "split", "--shard-rows", "40"]


def make_inputs(directory: Path, fmt: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(3):
        samples = make_samples(220, seed=i, median=50)
        if fmt == "jsonl":
            write_jsonl(directory / f"part-{i}.jsonl.gz", samples, compress="gzip")
        else:
            write_parquet(directory / f"part-{i}.parquet", samples)
    return directory


def remote_shards(s3, prefix: str) -> list[bytes]:
    return [s3.get(f"{prefix}/{s['file']}") for s in s3.manifest(prefix)["shards"]]


def local_shards(out: Path) -> list[bytes]:
    manifest = json.loads((out / "manifest.json").read_text())
    return [(out / s["file"]).read_bytes() for s in manifest["shards"]]


def one_line(result) -> str:
    text = result.stderr.strip() if hasattr(result, "stderr") else ""
    assert "\n" not in text and "Traceback" not in text, text
    return text


def pack_cli(*args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "packer", "pack", *map(str, args)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=timeout,
    )


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_s3_in_and_out_gives_the_local_bytes_and_verifies(cli, s3, tmp_path, fmt):
    data = make_inputs(tmp_path / "data", fmt)
    s3.put_dir(data, "corpus")
    local = tmp_path / "local"
    r = cli("pack", data, "-o", local, *PACK, "--json")
    assert r.exit_code == 0, r.output
    r = cli("pack", s3.url("corpus/"), "-o", s3.url("packed"), *PACK, "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["output"] == "s3://bkt/packed" and report["shards"] > 3

    assert remote_shards(s3, "packed") == local_shards(local)
    remote, here = s3.manifest("packed"), json.loads((local / "manifest.json").read_text())
    assert remote["stats"] == here["stats"] and remote["config"] == here["config"]
    assert [i["path"] for i in remote["inputs"]] == [
        s3.url(f"corpus/{p.name}") for p in sorted(data.iterdir())
    ]
    assert [i["fingerprint"] for i in remote["inputs"]] == [
        i["fingerprint"] for i in here["inputs"]
    ]
    # every object is one the manifest lists, or the manifest itself
    listed = {f"packed/{s['file']}" for s in remote["shards"]} | {"packed/manifest.json"}
    listed |= {f"packed/{remote['split_labels']['file']}"} if remote.get("split_labels") else set()
    assert set(s3.keys("packed/")) == listed

    # read back through pyarrow's own S3 client: the rows are the local rows
    fs = pafs.S3FileSystem(
        endpoint_override=s3.endpoint.split("://")[1], scheme="http", region="us-east-1"
    )
    first = remote["shards"][0]["file"]
    with fs.open_input_stream(f"bkt/packed/{first}") as fh:
        table = pa.ipc.open_stream(fh).read_all()
    assert table.equals(read_shards(local).slice(0, table.num_rows))

    r = cli("verify", s3.url("packed"), "--input", s3.url("corpus/"), "--rows", "2", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["ok"]


def test_remote_inputs_into_a_local_output_and_back_with_repack(cli, s3, tmp_path):
    data = make_inputs(tmp_path / "data", "parquet")
    s3.put_dir(data, "corpus")
    r = cli("pack", s3.url("corpus/*.parquet"), "-o", tmp_path / "out", *PACK, "--json")
    assert r.exit_code == 0, r.output
    local = tmp_path / "local"
    assert cli("pack", data, "-o", local, *PACK).exit_code == 0
    assert local_shards(tmp_path / "out") == local_shards(local)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["inputs"][0]["path"] == "s3://bkt/corpus/part-0.parquet"
    # an output on the store, repacked with another L, equals the same repack of the local one
    s3.put_dir(local, "packed")
    r = cli(
        "pack",
        s3.url("packed"),
        "-o",
        s3.url("again"),
        "--repack",
        "-L",
        "512",
        "--overlength",
        "split",
        "--json",
    )
    assert r.exit_code == 0, r.output
    r = cli(
        "pack", local, "-o", tmp_path / "again", "--repack", "-L", "512", "--overlength", "split"
    )
    assert r.exit_code == 0, r.output
    assert remote_shards(s3, "again") == local_shards(tmp_path / "again")
    assert s3.manifest("again")["repacked_from"]["path"] == "s3://bkt/packed"


def test_outputs_inside_a_prefix_are_skipped_and_named_ones_refused(cli, s3, tmp_path):
    data = make_inputs(tmp_path / "data", "jsonl")
    s3.put_dir(data, "tree/raw")
    r = cli("pack", s3.url("tree/raw"), "-o", s3.url("tree/packed"), *PACK)
    assert r.exit_code == 0, r.output
    r = cli("pack", s3.url("tree"), "-o", tmp_path / "o2", *PACK)
    assert r.exit_code == 0, r.output
    assert "note: skipped s3://bkt/tree/packed: a packer output, not samples" in r.stderr
    r = cli("pack", s3.url("tree/packed"), "-o", tmp_path / "o3", *PACK)
    assert r.exit_code == 2
    assert r.stderr == (
        "error: s3://bkt/tree/packed: INPUT is a packer output (its rows are already "
        "packed); use --repack to re-pack its samples\n"
    )


def test_packed_dataset_from_s3_feeds_a_training_step_and_inspect_reads_it(cli, s3, tmp_path):
    torch = pytest.importorskip("torch")
    from packer.torch import PackedDataset, collate_packed, sum_token_loss

    data = make_inputs(tmp_path / "data", "parquet")
    r = cli("pack", data, "-o", s3.url("packed"), *PACK)
    assert r.exit_code == 0, r.output
    ds = PackedDataset(s3.url("packed"))
    local = tmp_path / "local"
    assert cli("pack", data, "-o", local, *PACK).exit_code == 0
    here = PackedDataset(local)
    assert len(ds) == len(here) > 0
    for i in (0, len(ds) - 1):
        assert (ds[i]["input_ids"] == here[i]["input_ids"]).all()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(1000, 16), torch.nn.Linear(16, 1000))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = torch.utils.data.DataLoader(ds, batch_size=4, collate_fn=collate_packed)
    batch = next(iter(loader))
    before = [p.detach().clone() for p in model.parameters()]
    loss = sum_token_loss(model(batch["input_ids"]), batch["labels"]) / batch["num_loss_tokens"]
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and batch["num_loss_tokens"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))

    r = cli("inspect", s3.url("packed"), "--json")
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout)
    assert report["output"] == "s3://bkt/packed"
    assert report["inputs"][0]["path"] == str(data / "part-0.parquet")


def test_overwrite_replaces_the_manifest_then_deletes_the_old_run(cli, s3, tmp_path):
    data = make_inputs(tmp_path / "data", "jsonl")
    assert cli("pack", data, "-o", s3.url("out"), *PACK).exit_code == 0
    first = set(s3.keys("out/"))
    r = cli("pack", data, "-o", s3.url("out"), *PACK)
    assert r.exit_code == 2
    assert r.stderr == "error: s3://bkt/out: output exists; pass --overwrite to replace it\n"
    assert set(s3.keys("out/")) == first
    r = cli("pack", data, "-o", s3.url("out"), "-L", "512", "--overlength", "split", "--overwrite")
    assert r.exit_code == 0, r.output
    second = set(s3.keys("out/"))
    assert second & first == {"out/manifest.json"}  # the old run's files are gone
    assert s3.manifest("out")["config"]["max_len"] == 512
    # a prefix holding other objects is not taken over
    s3.client.put_object(Bucket="bkt", Key="mine/notes.txt", Body=b"x")
    r = cli("pack", data, "-o", s3.url("mine"), *PACK, "--overwrite")
    assert r.exit_code == 2
    assert "refusing to write into a prefix that holds objects" in r.stderr
    assert s3.keys("mine/") == ["mine/notes.txt"]


def test_two_runs_to_one_url_one_commits_the_other_refuses(s3, tmp_path):
    """Both runs checked the target before either committed: the conditional write decides."""
    from packer import PackConfig, pack
    from packer.errors import UsageError
    from packer.write.remote import RemoteOutput

    data = make_inputs(tmp_path / "data", "jsonl")
    runs = [RemoteOutput(s3.url("out"), overwrite=False) for _ in range(2)]
    cfg = PackConfig(max_len=256, overlength="split", shard_rows=40)
    for run in runs:
        pack([data], run.local, cfg)
    runs[0].commit()
    committed = s3.manifest("out")
    with pytest.raises(UsageError) as info:
        runs[1].commit()
    assert str(info.value) == (
        "s3://bkt/out: another run committed this output while this one was packing; "
        "nothing of this run was kept"
    )
    assert s3.manifest("out") == committed
    listed = {f"out/{s['file']}" for s in committed["shards"]}
    assert set(s3.keys("out/")) == listed | {
        "out/manifest.json",
        f"out/{committed['split_labels']['file']}",
    }
    # the same race between two --overwrite runs: If-Match lets only the first replace it
    runs = [RemoteOutput(s3.url("out"), overwrite=True) for _ in range(2)]
    for run in runs:
        pack([data], run.local, cfg)
    runs[0].commit()
    with pytest.raises(UsageError):
        runs[1].commit()


def test_two_processes_racing_to_one_url(s3, tmp_path):
    from s3_proxy import Proxy, Rule

    data = make_inputs(tmp_path / "data", "jsonl")
    proxy = Proxy(s3.endpoint)
    proxy.rules.append(Rule("slow", contains=".arrow", seconds=0.4))
    try:
        env = {"AWS_ENDPOINT_URL": proxy.endpoint}
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "packer", "pack", str(data), "-o", s3.url("out"), *PACK],
                env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        results = [(p.wait(timeout=120), p.stderr.read()) for p in procs]
    finally:
        proxy.close()
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2], results
    loser = next(err for code, err in results if code == 2)
    assert loser.startswith("error: s3://bkt/out: ") and loser.count("\n") == 1
    assert "another run committed this output" in loser or "output exists" in loser
    manifest = s3.manifest("out")
    extra = {f"out/{manifest['split_labels']['file']}", "out/manifest.json"}
    assert set(s3.keys("out/")) == {f"out/{s['file']}" for s in manifest["shards"]} | extra


def test_an_upload_dropped_or_refused_leaves_no_manifest_and_the_old_output(
    cli, s3, tmp_path, monkeypatch
):
    from s3_proxy import Proxy, Rule

    data = make_inputs(tmp_path / "data", "jsonl")
    assert cli("pack", data, "-o", s3.url("out"), *PACK).exit_code == 0
    before = {k: s3.get(k) for k in s3.keys("out/")}
    proxy = Proxy(s3.endpoint)
    try:
        for rule in (
            Rule("drop", contains="shard-00002"),
            Rule("refuse", contains="shard-00001", status=403, code="AccessDenied"),
        ):
            proxy.rules[:] = [rule]
            r = pack_cli(
                data,
                "-o",
                s3.url("out"),
                "-L",
                "512",
                "--overlength",
                "split",
                "--shard-rows",
                "20",
                "--overwrite",
                env={"AWS_ENDPOINT_URL": proxy.endpoint, "PACKER_STORAGE_ATTEMPTS": "2"},
            )
            assert r.returncode == 1, r.stderr
            assert rule.fired >= 1
            assert (
                r.stderr.startswith("error: s3://bkt/out/shard-0000") and r.stderr.count("\n") == 1
            )
            assert "Traceback" not in r.stderr
            # the previous output is untouched, and nothing of the failed run is left
            assert {k: s3.get(k) for k in s3.keys("out/")} == before
        # dropped once: the client retries it and the run commits the same bytes
        proxy.rules[:] = [Rule("drop", contains="shard-00001", times=1)]
        r = pack_cli(data, "-o", s3.url("again"), *PACK, env={"AWS_ENDPOINT_URL": proxy.endpoint})
        assert r.returncode == 0, r.stderr
        assert proxy.rules[0].fired == 1
    finally:
        proxy.close()
    assert remote_shards(s3, "again") == remote_shards(s3, "out")


def test_sigkill_during_uploads_leaves_an_incomplete_output_every_reader_refuses(cli, s3, tmp_path):
    from s3_proxy import Proxy, Rule

    data = make_inputs(tmp_path / "data", "jsonl")
    assert cli("pack", data, "-o", s3.url("old"), *PACK).exit_code == 0
    old = {k: s3.get(k) for k in s3.keys("old/")}
    proxy = Proxy(s3.endpoint)
    proxy.rules.append(Rule("slow", contains=".arrow", seconds=0.3))
    try:
        for prefix, extra in (("new", []), ("old", ["--overwrite"])):
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "packer",
                    "pack",
                    str(data),
                    "-o",
                    s3.url(prefix),
                    *PACK,
                    *extra,
                ],
                env={**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": proxy.endpoint},
                stderr=subprocess.DEVNULL,
            )
            deadline = time.monotonic() + 60
            while not any(".arrow" in p and m == "PUT" and prefix in p for m, p in proxy.requests):
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
            time.sleep(0.5)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
    finally:
        proxy.close()
    after = {k: s3.get(k) for k in s3.keys("old/")}
    assert {k: after.get(k) for k in old} == old  # nothing the old manifest lists moved
    # the killed --overwrite run may have left its own run-unique shards, never a manifest
    assert all(k.endswith(".arrow") for k in set(after) - set(old))
    assert "new/manifest.json" not in s3.keys("new/") and s3.keys("new/")
    incomplete = (
        "s3://bkt/new: incomplete packer output: no manifest.json (a run that did not finish, or "
        "is still running; resume it with --resume, or rerun it)"
    )
    r = cli("verify", s3.url("new"), "--no-attention")
    assert (r.exit_code, r.stderr) == (1, f"error: {incomplete}\n")
    r = cli("inspect", s3.url("new"))
    assert (r.exit_code, r.stderr) == (1, f"error: {incomplete}\n")
    r = cli("pack", s3.url("new"), "-o", tmp_path / "x", "--repack", "-L", "512")
    assert r.exit_code != 0 and r.stderr.count("\n") == 1
    from packer.errors import InputError
    from packer.torch import PackedDataset

    with pytest.raises(InputError, match="incomplete"):
        PackedDataset(s3.url("new"))
    # the leftovers are never read as samples, and the next run removes them
    r = cli("pack", s3.url("new"), "-o", tmp_path / "y", *PACK)
    assert (r.exit_code, r.stderr) == (1, f"error: {incomplete}\n")
    assert cli("pack", data, "-o", s3.url("new"), *PACK).exit_code == 0
    manifest = s3.manifest("new")
    listed = {f"new/{s['file']}" for s in manifest["shards"]}
    assert set(s3.keys("new/")) == listed | {
        "new/manifest.json",
        f"new/{manifest['split_labels']['file']}",
    }


def test_bad_urls_are_one_line_each(cli, s3, s3_server, tmp_path):
    data = make_inputs(tmp_path / "data", "jsonl")
    cases = [
        (
            ("pack", "nope://x/y.jsonl", "-o", tmp_path / "o", *PACK),
            2,
            "error: unknown URL scheme 'nope://' (packer reads s3://, gs://, hf://, file:// and the "
            "protocols fsspec knows)\n",
        ),
        (
            ("pack", "s3://no-such-bucket/x/", "-o", tmp_path / "o", *PACK),
            1,
            "error: s3://no-such-bucket/x/: the bucket does not exist\n",
        ),
        (
            ("pack", data, "-o", "s3://no-such-bucket/out", *PACK),
            2,
            "error: s3://no-such-bucket/out: the bucket does not exist\n",
        ),
        (
            ("pack", s3.url("missing/"), "-o", tmp_path / "o", *PACK),
            1,
            "error: s3://bkt/missing/: no such object or prefix\n",
        ),
        (
            ("verify", s3.url("missing")),
            1,
            "error: s3://bkt/missing: no packer output here (no manifest.json, no objects)\n",
        ),
        (
            ("pack", "s3://user:pw@bkt/x", "-o", tmp_path / "o", *PACK),
            2,
            "error: s3://bkt/x: credentials inside a URL are not accepted (use the environment, "
            "the store's config files or --storage-option)\n",
        ),
        (
            ("pack", data, "-o", tmp_path / "o", *PACK, "--storage-option", "secret"),
            2,
            "error: --storage-option number 1 is not KEY=VALUE\n",
        ),
    ]
    for args, code, line in cases:
        r = cli(*args)
        assert (r.exit_code, r.stderr) == (code, line), args
    assert not (tmp_path / "o").exists()

    # denied: the server checks signatures, and these keys are not its own
    s3.client.upload_file(str(data / "part-0.jsonl.gz"), "bkt", "in/part-0.jsonl.gz")
    moto_api(s3_server, "/moto-api/reset-auth", b"0")
    try:
        secret = "SECRET-never-shown-0123"
        r = cli(
            "pack",
            s3.url("in/"),
            "-o",
            tmp_path / "o",
            *PACK,
            "--storage-option",
            f"aws_secret_access_key={secret}",
            "--storage-option",
            "aws_access_key_id=AKIAEXAMPLE",
        )
        assert (r.exit_code, r.stderr) == (
            1,
            "error: s3://bkt/in: access denied (check the credentials and the bucket's policy)\n",
        )
    finally:
        moto_api(s3_server, "/moto-api/reset-auth", b"inf")
    assert secret not in r.output

    # unreachable: nothing listens on the port
    r = pack_cli(
        s3.url("in/"),
        "-o",
        tmp_path / "o",
        *PACK,
        env={"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "PACKER_STORAGE_ATTEMPTS": "1"},
    )
    assert (r.returncode, r.stderr) == (
        1,
        "error: s3://bkt/in: cannot reach the storage endpoint (is it running, is the URL "
        "right?)\n",
    )


def test_a_missing_extra_is_named(tmp_path):
    """Without boto3 (the s3 extra), an s3:// URL is one line naming the extra, exit 2."""
    code = (
        "import sys; sys.modules['boto3'] = None; sys.modules['botocore'] = None\n"
        "from packer.cli import run; sys.argv = ['packer'] + sys.argv[1:]; run()"
    )
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "pack",
            "s3://bkt/x.jsonl",
            "-o",
            str(tmp_path / "o"),
            "-L",
            "64",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=60,
    )
    assert (r.returncode, r.stderr) == (
        2,
        "error: s3:// URLs need packer's 's3' extra: pip install boto3\n",
    )


def test_progress_reports_the_bytes_of_each_transfer(s3, tmp_path):
    from packer import PackConfig, pack

    data = make_inputs(tmp_path / "data", "parquet")
    s3.put_dir(data, "corpus")
    seen: dict[tuple[str, str], tuple[int, int]] = {}

    def progress(stage, done, total, label=""):
        if stage in ("download", "upload"):
            seen[(stage, label)] = (done, total)

    pack(
        [s3.url("corpus")],
        s3.url("out"),
        PackConfig(max_len=256, overlength="split", shard_rows=40),
        progress=progress,
    )
    for p in sorted(data.iterdir()):
        size = p.stat().st_size
        assert seen[("download", s3.url(f"corpus/{p.name}"))] == (size, size)
    manifest = s3.manifest("out")
    for shard in manifest["shards"]:
        assert seen[("upload", shard["file"])] == (shard["bytes"], shard["bytes"])


def test_url_helpers():
    from packer.read.remote import glob_pattern
    from packer.storage import parse_pairs, parse_url
    from packer.storage.urls import redact

    assert parse_url("s3://b/k/") == parse_url("s3a://b/k")
    assert parse_url("gcs://b/k").protocol == "gs"
    assert parse_url("file:///tmp/x").path == "/tmp/x"
    assert redact("s3://u:p@b/k?X-Amz-Signature=s") == "s3://b/k"
    assert parse_pairs(["a=1", "b==2"]) == {"a": "1", "b": "=2"}
    match = glob_pattern("b/d/**/*.jsonl").match
    assert match("b/d/x.jsonl") and match("b/d/e/f/x.jsonl") and not match("b/d/x.parquet")
    assert not glob_pattern("b/d/*.jsonl").match("b/d/e/x.jsonl")
    assert glob_pattern("b/d/p[0-1].arrow").match("b/d/p1.arrow")


def test_pack_dataset_writes_its_cache_file_to_s3(s3, tmp_path):
    datasets = pytest.importorskip("datasets")
    from packer import pack_dataset

    ds = datasets.Dataset.from_list(make_samples(300, seed=3, median=40))
    here = pack_dataset(ds, 256, overlength="split", cache_file_name=tmp_path / "packed.arrow")
    there = pack_dataset(ds, 256, overlength="split", cache_file_name=s3.url("cache/packed.arrow"))
    assert there.num_rows == here.num_rows > 0
    assert s3.get("cache/packed.arrow") == (tmp_path / "packed.arrow").read_bytes()
    assert there[0]["input_ids"] == here[0]["input_ids"]
